"""The wire envelopes of every connection in a cluster: the only place they are defined.

Each message is a frozen `msgspec.Struct`, encoded as a compact msgpack array whose first item
is the tag (the class name). `Message` is the union of all of them, decoded by one `Decoder`.
Pickled payloads (arguments, results, classes) travel in `payload` fields, with their large
buffers (numpy arrays) as separate raw frames beside the envelope (see `connection.py`);
`Plain` arguments and results travel as themselves instead (`Call.args`, `Result.value`).
New fields go last, with defaults, so that older peers still decode newer messages; the
protocol version rides in the handshake.

Who sends what:

- handshake, every TCP connection: `Challenge`, `Hello`, then `Welcome` or `Refused`;
- client -> actor process (data plane): `Init`, `Call`; replies `Ready`, `Result`, `Error`;
- client -> master: `RegisterClient`, `Ping`, `CreateActor`, `ReleaseActor`, `KillActor`,
  `HoldActor`, `QueryActor`, `StatusRequest`, `ShutdownCluster`; master -> client: `Accepted`,
  `ActorAssigned`, `CreateFailed`, `ActorState`, `StatusReply`, `ActorDied`, `LogLines`, `Ack`,
  `Ping`;
- worker -> master: `RegisterWorker`, `WorkerHeartbeat`, `ActorStarted`, `ActorStartFailed`,
  `ActorExited`, `LogLines`, `Preload` (what its actors imported); master -> worker: `Accepted`,
  `StartActor`, `StopActor`, `ShutdownWorker`, `Ping`, `Preload` (what other workers' did);
- worker <-> its actor processes (a private socket pair): `HostReady`, `Preload`,
  `PausePreload`, `Preloaded`, `Assign`, `Assigned`, `LeaveSession`, `ActorInitialized`,
  `ActorStats`, `ActorExited` (the actor called sys.exit).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec

__all__ = [
    "Accepted",
    "Ack",
    "ActorAssigned",
    "ActorDied",
    "ActorExited",
    "ActorInitialized",
    "ActorQueryState",
    "ActorRecord",
    "ActorStartFailed",
    "ActorStarted",
    "ActorState",
    "ActorStateName",
    "ActorStats",
    "Assign",
    "Assigned",
    "Call",
    "CallKind",
    "Challenge",
    "CreateActor",
    "CreateFailed",
    "CreateFailedKind",
    "Error",
    "ErrorKind",
    "Hello",
    "HoldActor",
    "HostReady",
    "Init",
    "KillActor",
    "LeaveSession",
    "LogLines",
    "Message",
    "PROTOCOL_VERSION",
    "PausePreload",
    "Ping",
    "Plain",
    "Preload",
    "Preloaded",
    "QueryActor",
    "Ready",
    "Refused",
    "RegisterClient",
    "RegisterWorker",
    "ReleaseActor",
    "Result",
    "ShutdownCluster",
    "ShutdownWorker",
    "StartActor",
    "StatusReply",
    "StatusRequest",
    "StopActor",
    "Welcome",
    "WorkerHeartbeat",
    "decoder",
    "encoder",
]

PROTOCOL_VERSION = 3  # 3: a shared-memory reference names its owner's descriptor (memfd)


class _Msg(msgspec.Struct, frozen=True, tag=True, array_like=True, forbid_unknown_fields=False):
    """Base of every envelope (subclasses restate `frozen=True` for type checkers)."""


# -- handshake ---------------------------------------------------------------------------------
class Challenge(_Msg, frozen=True):
    """Server's first words: its protocol version, role and a fresh random nonce."""

    version: int
    role: str
    nonce: bytes
    host: str = ""
    """The server's host id when it takes shared-memory transfers (see `wire/_shm.py`), else ""."""


class Hello(_Msg, frozen=True):
    """Client's proof: HMAC of both nonces and its role under the cluster token."""

    version: int
    role: str
    nonce: bytes
    digest: bytes
    host: str = ""
    """The client's host id when it takes shared-memory transfers, else ""."""


class Welcome(_Msg, frozen=True):
    """Server's proof back: HMAC of both nonces under the token (mutual authentication)."""

    digest: bytes


class Refused(_Msg, frozen=True):
    """The server refuses the connection, and says why; it closes right after."""

    reason: str


# -- data plane: client <-> actor process ------------------------------------------------------
class Init(_Msg, frozen=True):
    """Construct the actor: `payload` pickles `(cls, args, kwargs)`; `bundle` is the code zip."""

    actor_id: str
    payload: bytes
    bundle: bytes = b""


class Ready(_Msg, frozen=True):
    """The actor is constructed and serving; `shadowed`: methods its instance attributes hide."""

    actor_id: str
    pid: int
    shadowed: list[str] = []


class CallKind(enum.IntEnum):
    """What a `Call` does with `name` on the actor."""

    METHOD = 0
    """Call the method: `payload` pickles `(args, kwargs)`."""
    GETATTR = 1
    """Read the attribute: `payload` pickles None."""
    SETATTR = 2
    """Write the attribute: `payload` pickles the value."""


ErrorKind = Literal["raised", "attribute", "serialize", "error"]
"""Why an `Error` came back: the user's code raised (`payload` pickles the exception when it
can), no such attribute, a value could not be pickled or unpickled, or the runtime refused."""

Plain = int | float | str | bool | None
"""An argument or result sent as itself, unpickled (only 64-bit ints and ASCII strings)."""

CreateFailedKind = Literal["resource", "error"]
"""Why a `CreateFailed` came back: no slot within the wait, or anything else."""


# `Call` and `Result`, one of each per call, hold only plain data: they can be in no reference
# cycle, so the garbage collector need not track them (which makes them quicker to build).
class Call(_Msg, frozen=True, gc=False):
    """Run `name` on the actor, as `kind` says; arguments pickled, or plain in `args`."""

    id: int
    name: str
    payload: bytes
    kind: CallKind = CallKind.METHOD
    args: tuple[Plain, ...] = ()  # a method's arguments when `payload` is empty


class Result(_Msg, frozen=True, gc=False):
    """The value of call `id`: pickled, or plain in `value` (then `payload` is empty)."""

    id: int
    payload: bytes
    value: Plain = None
    shadowed: tuple[str, ...] = ()
    """When it changed since this connection was told: every method instance attributes hide."""


class Error(_Msg, frozen=True):
    """Call `id` (or `Init`, id 0) failed; `payload` pickles the exception when it can."""

    id: int
    kind: ErrorKind
    type_name: str
    message: str
    traceback: str = ""
    payload: bytes = b""


# -- control plane: client <-> master ----------------------------------------------------------
class RegisterClient(_Msg, frozen=True):
    """A client joins (or re-joins, listing the actors it still holds)."""

    client_id: str
    hostname: str
    pid: int
    log_to_driver: bool = True
    actors: list[str] = []


class Accepted(_Msg, frozen=True):
    """The master accepts a client or worker; heartbeats are due every `heartbeat_s`."""

    cluster_id: str
    heartbeat_s: float


class Ping(_Msg, frozen=True):
    """The sender is alive (clients to the master, and the master to clients and workers)."""


class CreateActor(_Msg, frozen=True):
    """Ask for a slot: one CPU and `n_gpu` GPUs of one worker, waiting at most `wait_s`."""

    request_id: int
    class_name: str
    n_gpu: int = 0
    max_memory_mb: float = 0.0
    wait_s: float = 30.0
    replaces: str = ""
    """The id of a dead actor of the same client that this one replaces ("": none)."""


class ActorAssigned(_Msg, frozen=True):
    """A process is ready for the actor at host:port; connect and send `Init`."""

    request_id: int
    actor_id: str
    host: str
    port: int
    pid: int
    worker_id: str


class CreateFailed(_Msg, frozen=True):
    """No actor: `kind` is "resource" (no slot in time) or "error"."""

    request_id: int
    kind: CreateFailedKind
    reason: str


class ReleaseActor(_Msg, frozen=True):
    """The client no longer needs the actor: stop its process, free its slot."""

    actor_id: str


class HoldActor(_Msg, frozen=True):
    """The client got a handle of an actor it did not create; keep it alive for it too.

    Answered by `ActorState` (state "dead" with the reason when the actor is gone).
    """

    request_id: int
    actor_id: str


class KillActor(_Msg, frozen=True):
    """Stop an actor now, whoever created it; every client that knows it hears `ActorDied`."""

    request_id: int
    actor_id: str
    reason: str


class QueryActor(_Msg, frozen=True):
    """Ask what became of an actor (why it died)."""

    request_id: int
    actor_id: str


class ActorState(_Msg, frozen=True):
    """Reply to `QueryActor`."""

    request_id: int
    actor_id: str
    state: ActorQueryState
    reason: str = ""


class ActorDied(_Msg, frozen=True):
    """Pushed to the owner and every holder: the actor is gone, and why."""

    actor_id: str
    reason: str


class LogLines(_Msg, frozen=True):
    """Actor output: `(actor_id, stream, line)`; stream "stdout", "stderr" or "exception"."""

    lines: list[tuple[str, str, str]]


class StatusRequest(_Msg, frozen=True):
    """Ask for the cluster's state (what `xparl status` and the dashboard show)."""

    request_id: int
    offset: int = 0
    """Workers, clients and live actors listed from this one on (the totals count all)."""
    limit: int | None = None
    """How many of each to list at most; None: every one."""


class StatusReply(_Msg, frozen=True):
    """The cluster's state as plain data."""

    request_id: int
    status: dict[str, Any]


class ShutdownCluster(_Msg, frozen=True):
    """Stop every worker of the cluster, then the master."""

    request_id: int


class Ack(_Msg, frozen=True):
    """A request was carried out."""

    request_id: int


# -- control plane: worker <-> master ----------------------------------------------------------
class ActorRecord(msgspec.Struct, frozen=True, array_like=True):
    """A live actor a worker reports when it (re-)registers."""

    actor_id: str
    client_id: str
    class_name: str
    port: int
    pid: int
    gpus: list[str] = []
    max_memory_mb: float = 0.0
    started_at: float = 0.0


class RegisterWorker(_Msg, frozen=True):
    """A worker joins with its slots; after a master restart it lists the actors it kept."""

    worker_id: str
    hostname: str
    host: str
    pid: int
    cpu_num: int
    gpus: list[str] = []
    actors: list[ActorRecord] = []
    mem_total: int = 0


class WorkerHeartbeat(_Msg, frozen=True):
    """A worker is alive; machine load and per-actor statistics."""

    cpu_percent: float
    mem_used: int
    mem_total: int
    load_avg: float = 0.0
    actors: list[ActorStats] = []


class StartActor(_Msg, frozen=True):
    """Hand a warm process of this worker to a new actor."""

    actor_id: str
    client_id: str
    class_name: str
    gpus: list[str] = []
    max_memory_mb: float = 0.0


class ActorStarted(_Msg, frozen=True):
    """The actor's process is assigned and listening on `port`."""

    actor_id: str
    port: int
    pid: int


class ActorStartFailed(_Msg, frozen=True):
    """The worker could not provide a process for the actor."""

    actor_id: str
    reason: str


class StopActor(_Msg, frozen=True):
    """Kill the actor's process (released, or its client is gone)."""

    actor_id: str
    reason: str


class ActorExited(_Msg, frozen=True):
    """An actor's process ended; `reason` says how (exit code, signal, memory limit...)."""

    actor_id: str
    reason: str
    exit_code: int | None = None


class ShutdownWorker(_Msg, frozen=True):
    """Stop every actor and exit (the cluster is being stopped)."""

    reason: str


# -- worker <-> its actor processes (a private socket pair) ------------------------------------
class ActorStats(_Msg, frozen=True):
    """How one actor process is doing, sampled by its worker."""

    actor_id: str
    cpu_percent: float
    rss_bytes: int
    calls: int = 0
    errors: int = 0
    busy: bool = False


class HostReady(_Msg, frozen=True):
    """A warm process is listening on `port` and waits for an actor."""

    port: int
    pid: int


class Preload(_Msg, frozen=True):
    """Import these modules in the background while no actor is assigned (`_preload`)."""

    modules: list[str]


class PausePreload(_Msg, frozen=True):
    """Hold the preloading at the next module (`paused`), or go on with it (`_preload`)."""

    paused: bool


class Preloaded(_Msg, frozen=True):
    """The warm process went through the first `done` module names it was sent."""

    done: int


class Assign(_Msg, frozen=True):
    """This process now belongs to actor `actor_id`: set `env`, expect the client's `Init`."""

    actor_id: str
    client_id: str
    class_name: str
    env: dict[str, str] = {}
    workdir: str = ""
    own_session: bool = True
    """Leave the worker's session for one of its own first (`LeaveSession`)."""


class LeaveSession(_Msg, frozen=True):
    """Leave the worker's session for one of its own (`setsid`), if still in it."""


class Assigned(_Msg, frozen=True):
    """The process took the assignment."""

    actor_id: str


class ActorInitialized(_Msg, frozen=True):
    """The actor's constructor returned; `ok` False when it raised; what it `imports`."""

    actor_id: str
    ok: bool
    imports: list[str] = []


Message = (
    Challenge
    | Hello
    | Welcome
    | Refused
    | Init
    | Ready
    | Call
    | Result
    | Error
    | RegisterClient
    | Accepted
    | Ping
    | CreateActor
    | ActorAssigned
    | CreateFailed
    | ReleaseActor
    | KillActor
    | HoldActor
    | QueryActor
    | ActorState
    | ActorDied
    | LogLines
    | StatusRequest
    | StatusReply
    | ShutdownCluster
    | Ack
    | RegisterWorker
    | WorkerHeartbeat
    | StartActor
    | ActorStarted
    | ActorStartFailed
    | StopActor
    | ActorExited
    | ShutdownWorker
    | HostReady
    | PausePreload
    | Preload
    | Preloaded
    | Assign
    | Assigned
    | LeaveSession
    | ActorInitialized
    | ActorStats
)

# -- states named on the wire and in the registry ----------------------------------------------
ActorStateName = Literal["starting", "idle", "busy", "dead"]
"""An actor's state: placed and starting, idle, inside a call, or ended."""

ActorQueryState = Literal["starting", "idle", "busy", "dead", "unknown"]
"""What `ActorState` answers: an actor's state, or "unknown" when the master never knew it."""

encoder = msgspec.msgpack.Encoder()
decoder: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)
