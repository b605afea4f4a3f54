"""Settings of the remote runtime (timeouts, limits, where state lives) and the cluster token.

Every setting has a default and an environment variable, read when a process starts, so that a
whole cluster (master, workers, clients, and the actor processes they start) agrees without
flags. Each variable accepts a range of values (in its field's docstring); an empty one means
the default. `check_env()` checks them all and raises `SettingError` naming the first that is
bad: the commands, `connect()`, the master and the worker call it as they start, so a bad value
stops them with one line. Importing the package never raises: where the environment is bad at
import, `settings` holds the defaults until `check_env()` says why.

The cluster token is a random secret: `PARL_CLUSTER_TOKEN` if set, otherwise the file
`$PARL_HOME/token` (`~/.parl/token`), readable by its owner only, that `xparl start` creates.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parl_remote._exceptions import AuthenticationError, SettingError

__all__ = [
    "Settings",
    "check_env",
    "ensure_token",
    "env_flag",
    "load_token",
    "parl_home",
    "settings",
    "shm_max_bytes",
    "shm_min_bytes",
    "token_path",
]


@dataclass(frozen=True)
class _Accepts:
    """The numbers a setting accepts: from `low` (excluded where `above`) up to `high`."""

    low: float
    high: float | None = None
    above: bool = False

    def holds(self, value: float) -> bool:
        """Whether `value` is in the range (never a NaN or an infinity)."""
        if not math.isfinite(value) or value < self.low or (self.above and value == self.low):
            return False
        return self.high is None or value <= self.high

    def describe(self, integer: bool) -> str:
        """The range in words: "an integer from 0 to 19", "a number greater than 0", ..."""
        kind = "an integer" if integer else "a number"
        low = _show(self.low)
        if self.high is not None:
            if integer and self.high - self.low == 1:
                return f"{low} or {_show(self.high)}"
            return f"{kind} from {low} to {_show(self.high)}"
        return f"{kind} greater than {low}" if self.above else f"{kind} of at least {low}"


_POSITIVE = _Accepts(0, above=True)
_NOT_NEGATIVE = _Accepts(0)


def _setting(default: float, accepts: _Accepts) -> Any:
    return dataclasses.field(default=default, metadata={"accepts": accepts})


def _show(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass
class Settings:
    """Timeouts and limits; each field is overridden by the environment variable in its doc."""

    heartbeat_s: float = _setting(1.0, _POSITIVE)
    """PARL_HEARTBEAT_S: how often clients and workers heartbeat to the master (seconds,
    greater than 0 and less than PARL_HEARTBEAT_TIMEOUT_S)."""
    heartbeat_timeout_s: float = _setting(10.0, _POSITIVE)
    """PARL_HEARTBEAT_TIMEOUT_S: silence after which a peer is declared lost (the master
    pings each peer every third of it; seconds, greater than PARL_HEARTBEAT_S)."""
    master_grace_s: float = _setting(300.0, _NOT_NEGATIVE)
    """PARL_MASTER_GRACE_S: how long workers keep their actors and retry a lost master (seconds,
    at least 0)."""
    client_grace_s: float = _setting(30.0, _NOT_NEGATIVE)
    """PARL_CLIENT_GRACE_S: after a master restart, how long an actor waits for its client
    (seconds, at least 0)."""
    resource_wait_s: float = _setting(30.0, _NOT_NEGATIVE)
    """PARL_RESOURCE_WAIT_S: how long creating an actor waits for a free slot (seconds, at
    least 0: 0 fails at once where no slot is free)."""
    connect_timeout_s: float = _setting(10.0, _POSITIVE)
    """PARL_CONNECT_TIMEOUT_S: TCP connect plus handshake, per attempt (seconds, greater than
    0)."""
    max_message_bytes: int = _setting(8 << 30, _Accepts(1 << 20))
    """PARL_MAX_MESSAGE_BYTES: the largest message any process accepts (at least 1 MiB,
    1048576)."""
    idle_timeout_s: float = _setting(60.0, _POSITIVE)
    """PARL_IDLE_TIMEOUT_S: an HTTP connection to the dashboard idle this long is closed
    (seconds, greater than 0)."""
    max_connections: int = _setting(4096, _Accepts(1))
    """PARL_MAX_CONNECTIONS: connections a server holds at once; more are closed at once (at
    least 1)."""
    log_lines_per_actor: int = _setting(10_000, _NOT_NEGATIVE)
    """PARL_LOG_LINES_PER_ACTOR: lines of output the master keeps for each actor (at least
    0)."""
    preload: int = _setting(1, _Accepts(0, 1))
    """PARL_PRELOAD: 1: warm processes import ahead what earlier actors imported; 0: off."""
    preload_max_modules: int = _setting(4096, _NOT_NEGATIVE)
    """PARL_PRELOAD_MAX_MODULES: module names a worker keeps to preload (and a report carries;
    at least 0)."""
    preload_max_mb: float = _setting(1024.0, _NOT_NEGATIVE)
    """PARL_PRELOAD_MAX_MB: a warm process stops preloading once its memory passes this (at
    least 0)."""
    preload_nice: int = _setting(10, _Accepts(0, 19))
    """PARL_PRELOAD_NICE: the autogroup nice value (1 to 19) of a warm process's session while
    it preloads and the actors keep the CPUs busy, where Linux shares the CPUs between sessions
    by it: it imports on at a low share, and is set back to 0 before it takes an actor; 0, or
    no autogroup here (most containers): preloading holds while the actors are busy."""
    warm_spares: int = _setting(1, _NOT_NEGATIVE)
    """PARL_WARM_SPARES: warm processes a worker keeps beyond its vacant slots, so that the
    slot an actor frees is taken at once by a process started before (a replacement of a dead
    actor does not wait for a Python start-up); 0: one warm process per vacant slot only."""

    @classmethod
    def from_env(cls) -> Settings:
        """Read every `PARL_*` override from the environment.

        Raises:
            SettingError: a variable holds a value it does not accept.
        """
        return cls(**cls._env_values())

    def reload(self) -> None:
        """Re-read the environment into this object (defaults for variables that are unset).

        Raises:
            SettingError: a variable holds a value it does not accept (nothing is changed).
        """
        fresh = Settings(**self._env_values())
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(fresh, field.name))

    @classmethod
    def _env_values(cls) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            name = "PARL_" + field.name.upper()
            if os.environ.get(name, "").strip():  # empty: the default
                integer = field.type in ("int", int)
                accepts = field.metadata["accepts"]
                values[field.name] = _env_number(name, field.default, accepts, integer)
        _check_heartbeat(values.get("heartbeat_s"), values.get("heartbeat_timeout_s"))
        return values


def _check_heartbeat(beat: float | None, timeout: float | None) -> None:
    """A peer heartbeats more often than the silence that declares it lost."""
    default = Settings()
    every = default.heartbeat_s if beat is None else beat
    lost = default.heartbeat_timeout_s if timeout is None else timeout
    if lost > every:
        return
    if timeout is not None:
        raise SettingError(
            f"PARL_HEARTBEAT_TIMEOUT_S={os.environ['PARL_HEARTBEAT_TIMEOUT_S']!r} is not a "
            f"number greater than PARL_HEARTBEAT_S ({_show(every)}): give a number greater "
            f"than {_show(every)}, or a PARL_HEARTBEAT_S less than {_show(lost)}"
        )
    raise SettingError(
        f"PARL_HEARTBEAT_S={os.environ['PARL_HEARTBEAT_S']!r} is not a number less than "
        f"PARL_HEARTBEAT_TIMEOUT_S ({_show(lost)}, its default): unset it for the default "
        f"({_show(default.heartbeat_s)}), give a number greater than 0 and less "
        f"than {_show(lost)}, or raise PARL_HEARTBEAT_TIMEOUT_S"
    )


def _env_number(name: str, default: Any, accepts: _Accepts, integer: bool) -> Any:
    """The number variable `name` holds, or `default` where it is unset or empty."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value: float = int(raw) if integer else float(raw)
    except ValueError:
        value = math.nan
    if not accepts.holds(value):
        what = accepts.describe(integer)
        raise SettingError(
            f"{name}={raw!r} is not {what}: unset it for the default ({_show(default)}) or give "
            f"{what}"
        )
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """Whether the on/off variable `name` (`PARL_TLS`) is on; unset or empty: off.

    Raises:
        SettingError: its value is neither on (1, true, yes, on) nor off (0, false, no, off).
    """
    raw = os.environ.get(name, "")
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if not word or word in _FALSE:
        return False
    raise SettingError(
        f"{name}={raw!r} is not on or off (1, true, yes, on / 0, false, no, off): unset it for "
        "the default (off) or give 1 or 0"
    )


def shm_min_bytes() -> int:
    """`PARL_SHM_MIN_BYTES`: the smallest total of buffers sent through a segment; 0 is off.

    Read at each use (an integer of at least 0; default 64 KiB).

    Raises:
        SettingError: the variable is not an integer of at least 0.
    """
    value: int = _env_number("PARL_SHM_MIN_BYTES", 64 << 10, _NOT_NEGATIVE, integer=True)
    return value


def shm_max_bytes() -> int:
    """`PARL_SHM_MAX_BYTES`: the segments a process may hold in all; default a quarter of RAM.

    Read at each use (an integer of at least 0).

    Raises:
        SettingError: the variable is not an integer of at least 0.
    """
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        ram = 4 << 30
    value: int = _env_number("PARL_SHM_MAX_BYTES", ram // 4, _NOT_NEGATIVE, integer=True)
    return value


def check_env() -> None:
    """Check every `PARL_*` setting in the environment (what a process calls as it starts).

    Raises:
        SettingError: the first variable that holds a value it does not accept, by name.
    """
    Settings.from_env()
    env_flag("PARL_TLS")
    shm_min_bytes()
    shm_max_bytes()


def _settings_at_import() -> Settings:
    """The environment's settings, or the defaults where it is bad (`check_env` says why)."""
    try:
        return Settings.from_env()
    except SettingError:
        return Settings()


settings = _settings_at_import()
"""This process's settings, read from the environment at import."""


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
