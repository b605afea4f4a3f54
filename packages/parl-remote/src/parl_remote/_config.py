"""Settings of the remote runtime (timeouts, limits, where state lives) and the cluster token.

Every setting has a default and an environment variable, read when a process starts, so that a
whole cluster (master, workers, clients, and the actor processes they start) agrees without
flags. The cluster token is a random secret: `PARL_CLUSTER_TOKEN` if set, otherwise the file
`$PARL_HOME/token` (`~/.parl/token`), readable by its owner only, that `xparl start` creates.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parl_remote._exceptions import AuthenticationError

__all__ = ["Settings", "ensure_token", "load_token", "parl_home", "settings", "token_path"]


@dataclass
class Settings:
    """Timeouts and limits; each field is overridden by the environment variable in its doc."""

    heartbeat_s: float = 1.0
    """PARL_HEARTBEAT_S: how often clients and workers heartbeat to the master."""
    heartbeat_timeout_s: float = 10.0
    """PARL_HEARTBEAT_TIMEOUT_S: silence after which a peer is declared lost (the master
    pings each peer every third of it)."""
    master_grace_s: float = 300.0
    """PARL_MASTER_GRACE_S: how long workers keep their actors and retry a lost master."""
    client_grace_s: float = 30.0
    """PARL_CLIENT_GRACE_S: after a master restart, how long an actor waits for its client."""
    resource_wait_s: float = 30.0
    """PARL_RESOURCE_WAIT_S: how long creating an actor waits for a free slot."""
    connect_timeout_s: float = 10.0
    """PARL_CONNECT_TIMEOUT_S: TCP connect plus handshake, per attempt."""
    max_message_bytes: int = 8 << 30
    """PARL_MAX_MESSAGE_BYTES: the largest message any process accepts."""
    idle_timeout_s: float = 60.0
    """PARL_IDLE_TIMEOUT_S: an HTTP connection to the dashboard idle this long is closed."""
    max_connections: int = 4096
    """PARL_MAX_CONNECTIONS: connections a server holds at once; more are closed at once."""
    log_lines_per_actor: int = 10_000
    """PARL_LOG_LINES_PER_ACTOR: lines of output the master keeps for each actor."""
    preload: int = 1
    """PARL_PRELOAD: 1: warm processes import ahead what earlier actors imported; 0: off."""
    preload_max_modules: int = 4096
    """PARL_PRELOAD_MAX_MODULES: module names a worker keeps to preload (and a report carries)."""
    preload_max_mb: float = 1024.0
    """PARL_PRELOAD_MAX_MB: a warm process stops preloading once its memory passes this."""
    preload_nice: int = 10
    """PARL_PRELOAD_NICE: the autogroup nice value (1 to 19) of a warm process's session while
    it preloads and the actors keep the CPUs busy, where Linux shares the CPUs between sessions
    by it: it imports on at a low share, and is set back to 0 before it takes an actor; 0, or
    no autogroup here (most containers): preloading holds while the actors are busy."""
    warm_spares: int = 1
    """PARL_WARM_SPARES: warm processes a worker keeps beyond its vacant slots, so that the
    slot an actor frees is taken at once by a process started before (a replacement of a dead
    actor does not wait for a Python start-up); 0: one warm process per vacant slot only."""

    @classmethod
    def from_env(cls) -> Settings:
        """Read every `PARL_*` override from the environment (bad values raise ValueError)."""
        return cls(**cls._env_values())

    def reload(self) -> None:
        """Re-read the environment into this object (defaults for variables that are unset)."""
        fresh = Settings(**self._env_values())
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(fresh, field.name))

    @classmethod
    def _env_values(cls) -> dict[str, Any]:
        values = {}
        for field in dataclasses.fields(cls):
            name = "PARL_" + field.name.upper()
            raw = os.environ.get(name)
            if raw is None:
                continue
            convert = int if field.type in ("int", int) else float
            try:
                values[field.name] = convert(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a valid {convert.__name__}") from None
        return values


settings = Settings.from_env()


def parl_home() -> Path:
    """Where PARL keeps its token and the state of clusters started here (`PARL_HOME`)."""
    return Path(os.environ.get("PARL_HOME") or Path.home() / ".parl")


def token_path() -> Path:
    """The token file."""
    return parl_home() / "token"


def load_token() -> bytes | None:
    """Return the cluster token from `PARL_CLUSTER_TOKEN` or the token file, or None."""
    env = os.environ.get("PARL_CLUSTER_TOKEN")
    if env:
        return env.encode()
    try:
        text = token_path().read_text().strip()
    except FileNotFoundError:
        return None
    return text.encode() if text else None


def ensure_token() -> bytes:
    """Return the cluster token, creating the token file (mode 0600) if there is none."""
    token = load_token()
    if token is not None:
        return token
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, stat.S_IRWXU)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it a moment ago
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    token = load_token()
    if token is None:  # pragma: no cover - the file was just written
        raise AuthenticationError(f"could not create the token file {path}")
    return token
