"""`xparl`: start, grow, inspect and stop a PARL cluster from the shell.

    xparl start --port 8010 [--cpu_num N] [--host 127.0.0.1] [--monitor_port 8011] [--tls]
    xparl connect --address HOST:PORT [--cpu_num N] [--gpu 0,1] [--tls]
    xparl status [--address HOST:PORT | --port 8010] [--tls] [--offset N | --all]
    xparl stop [--address HOST:PORT | --port 8010] [--tls]

`start` runs a master and a local worker in the background and returns once they serve;
`connect` adds a worker (on any machine that has the cluster token); `stop` stops the cluster:
it asks the master to stop every worker, then stops the processes this machine started for
it, by PID. State lives in `$PARL_HOME` (default `~/.parl`): the token, logs, and which
processes belong to which cluster. With `--tls` every connection is TLS 1.3 (see `_tls.py`;
`--tls-cert/--tls-key/--tls-ca` give your own certificates, else the cluster makes its own).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import sys
import time
from typing import Any

from parl_remote._config import (
    check_env,
    ensure_token,
    load_token,
    parl_home,
    settings,
    token_path,
)
from parl_remote._exceptions import AuthenticationError, ClusterError, RemoteError, SettingError
from parl_remote._util import (
    available_cpus,
    is_loopback,
    outward_ip,
    read_json,
    write_json_atomic,
)
from parl_remote.actor._preload import preload_names
from parl_remote.engines.xparl import _cluster
from parl_remote.engines.xparl._client import STATUS_PAGE
from parl_remote.engines.xparl._drivers import request
from parl_remote.security import _tls
from parl_remote.wire._transport import SyncConnection
from parl_remote.wire.protocol import messages as m

__all__ = ["STATUS_PAGE", "console_main", "format_status", "main"]

_WILDCARDS = ("0.0.0.0", "::", "")


def _clusters_dir() -> str:
    return os.path.join(parl_home(), "clusters")


def _master_state(port: int) -> str:
    return os.path.join(_clusters_dir(), f"master-{port}.json")


def _logs_dir() -> str:
    return os.path.join(parl_home(), "logs")


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"--address {address!r} must be HOST:PORT")
    return host or "127.0.0.1", int(port)


def _request(
    address: str, msg_for_id: Any, timeout: float = 10.0, token: bytes | None = None
) -> Any:
    host, port = _split(address)
    token = token if token is not None else load_token()
    conn = SyncConnection.open(
        host, port, token=token, role="client", expect="master", timeout=timeout
    )
    try:
        conn.sock.settimeout(timeout)
        reply, _ = request(conn, msg_for_id(1))
        return reply
    finally:
        conn.close()


def _local_address(args: argparse.Namespace) -> str:
    """The cluster a command is about: --address, --port, or the one started here."""
    if getattr(args, "address", None):
        address: str = args.address
        return address
    if getattr(args, "port", None):
        state = read_json(_master_state(args.port))
        host = state["connect_host"] if state else "127.0.0.1"
        _tls_from_state(state)
        return f"{host}:{args.port}"
    states = _started_here()
    if len(states) == 1:
        _tls_from_state(states[0])
        return f"{states[0]['connect_host']}:{states[0]['port']}"
    if not states:
        raise ClusterError("no cluster was started on this machine; give --address HOST:PORT")
    ports = ", ".join(str(s["port"]) for s in states)
    raise ClusterError(
        f"several clusters were started here (ports {ports}); choose one with --port"
    )


def _tls_from_state(state: dict[str, Any] | None) -> None:
    if state and state.get("tls"):  # a TLS cluster started here: speak TLS to it
        os.environ["PARL_TLS"] = "1"


def _use_tls(args: argparse.Namespace) -> None:
    """Put the TLS flags into the environment: this process and those it starts use them."""
    for flag, var in (("tls_cert", "PARL_TLS_CERT"), ("tls_key", "PARL_TLS_KEY")):
        if getattr(args, flag, None):
            os.environ[var] = os.path.abspath(getattr(args, flag))
            args.tls = True
    if getattr(args, "tls_ca", None):
        os.environ["PARL_TLS_CA"] = os.path.abspath(args.tls_ca)
        args.tls = True
    if bool(getattr(args, "tls_cert", None)) != bool(getattr(args, "tls_key", None)):
        raise ClusterError("--tls-cert and --tls-key go together")
    if getattr(args, "tls", False):
        os.environ["PARL_TLS"] = "1"


def _started_here() -> list[dict[str, Any]]:
    """The state of every cluster started here that still runs; dead ones' files are removed.

    A cluster whose master died while some of its workers live on still counts: a new
    `xparl start` on its port lets them rejoin, and `xparl stop` stops them.
    """
    states = []
    if os.path.isdir(_clusters_dir()):
        for name in sorted(os.listdir(_clusters_dir())):
            if name.startswith("master-"):
                path = os.path.join(_clusters_dir(), name)
                state = read_json(path)
                if not state:
                    continue
                procs = [state["master"], *state.get("workers", [])]
                if any(_process(p).alive() for p in procs):
                    states.append(state)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
    return states


# -- commands ----------------------------------------------------------------------------------
def _process(entry: dict[str, Any]) -> _cluster.ProcessInfo:
    return _cluster.ProcessInfo(entry["pid"], entry["create_time"], entry["log"])


def _cmd_start(args: argparse.Namespace) -> int:
    state_file = _master_state(args.port)
    old = read_json(state_file) or {}
    if old and _process(old["master"]).alive():
        raise ClusterError(
            f"a PARL master started here already runs on port {args.port} (pid "
            f"{old['master']['pid']}); stop it with `xparl stop --port {args.port}`"
        )
    # After a master crash its workers live on, keep their actors and re-register with the
    # new master by themselves: they are not started twice.
    survivors = [w for w in old.get("workers", []) if _process(w).alive()]
    ensure_token()
    if _tls.enabled() and not os.environ.get("PARL_TLS_CERT"):
        hosts = [args.host, outward_ip()] if args.host in _WILDCARDS else [args.host]
        _tls.ensure_cluster_files([h for h in hosts if h not in _WILDCARDS])
    cpu_num = args.cpu_num or available_cpus()
    monitor_port = args.monitor_port if args.monitor_port is not None else args.port + 1
    master_args = [
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--monitor_port",
        str(monitor_port),
    ]
    if args.preload:
        master_args += ["--preload", ",".join(args.preload)]
    master = _cluster.spawn(
        "parl_remote.master._master",
        master_args,
        log=os.path.join(_logs_dir(), f"master-{args.port}.log"),
    )
    connect_host = "127.0.0.1" if args.host in _WILDCARDS else args.host
    worker_args = ["--address", f"{connect_host}:{args.port}", "--cpu_num", str(cpu_num)]
    if args.host in _WILDCARDS:
        worker_args += ["--host", outward_ip()]
    if args.gpu:
        worker_args += ["--gpu", args.gpu]
    workers = survivors
    if not survivors:
        try:
            worker = _cluster.spawn(
                "parl_remote.worker._worker",
                worker_args,
                log=os.path.join(_logs_dir(), f"worker-{args.port}-local.log"),
            )
        except BaseException:
            master.stop()
            raise
        workers = [worker.as_dict()]
    write_json_atomic(
        state_file,
        {
            "port": args.port,
            "host": args.host,
            "connect_host": connect_host,
            "master": master.as_dict(),
            "workers": workers,
            "started_at": time.time(),
            "tls": _tls.enabled(),
        },
    )
    reach = outward_ip() if args.host in _WILDCARDS else args.host
    if survivors:
        print(
            f"PARL master restarted on {args.host}:{args.port} (pid {master.pid}); "
            f"{len(survivors)} worker(s) started here earlier are still running and rejoin it."
        )
    else:
        print(
            f"PARL master started on {args.host}:{args.port} (pid {master.pid}) with a local "
            f"worker of {cpu_num} CPU slots."
        )
    if is_loopback(args.host):
        print(
            "It listens on loopback only; start it with --host 0.0.0.0 (or this machine's "
            "address) to add other machines."
        )
    else:
        if not _tls.enabled():
            print(
                "WARNING: traffic of this cluster is not encrypted: anyone on the network path "
                "can read it; start it with --tls to encrypt every connection."
            )
        print("Add a worker on another machine (it needs this cluster's token):")
        tls = " --tls" if _tls.enabled() else ""
        print(
            f"    PARL_CLUSTER_TOKEN=$(cat {token_path()}) xparl connect --address "
            f"{reach}:{args.port}{tls}"
        )
    if master.ready.get("dashboard"):
        print(f"Dashboard: {master.ready['dashboard']}")
    tls_arg = ", tls=True" if _tls.enabled() else ""
    print(f"Connect from Python: parl.connect('{reach}:{args.port}'{tls_arg})")
    print(f"Status: xparl status --port {args.port}    Stop: xparl stop --port {args.port}")
    return 0


def _probe_master(address: str) -> None:
    """Check that a master answers at `address` with our token; say what to check if not."""
    try:
        _request(address, lambda rid: m.StatusRequest(rid), timeout=settings.connect_timeout_s)
    except AuthenticationError as exc:
        raise ClusterError(
            f"the PARL master at {address} refused this machine's cluster token ({exc}); check "
            f"that PARL_CLUSTER_TOKEN is that cluster's token (on the master's machine: "
            f"{token_path()})"
        ) from None
    except (OSError, TimeoutError, RemoteError) as exc:
        raise ClusterError(
            f"no PARL master answers at {address} ({exc or type(exc).__name__}); check that a "
            "master is running there (`xparl start` on that machine, with --host set to an "
            "address this machine can reach), that the port is reachable from here (no firewall "
            "in between), and that the token is right (PARL_CLUSTER_TOKEN)"
        ) from None


def _cmd_connect(args: argparse.Namespace) -> int:
    host, port = _split(args.address)
    if load_token() is None:
        raise ClusterError(
            "no cluster token: set PARL_CLUSTER_TOKEN to the token of the cluster at "
            f"{args.address} "
            f"(on the master's machine: {token_path()})"
        )
    _probe_master(args.address)
    cpu_num = args.cpu_num or available_cpus()
    worker_args = ["--address", args.address, "--cpu_num", str(cpu_num)]
    if args.gpu:
        worker_args += ["--gpu", args.gpu]
    if args.host:
        worker_args += ["--host", args.host]
    log = os.path.join(_logs_dir(), f"worker-{host}-{port}-{int(time.time() * 1000)}.log")
    worker = _cluster.spawn("parl_remote.worker._worker", worker_args, log=log)
    write_json_atomic(
        os.path.join(_clusters_dir(), f"worker-{host}-{port}-{worker.pid}.json"),
        {"address": args.address, "worker": worker.as_dict()},
    )
    gpus = f" and GPUs {args.gpu}" if args.gpu else ""
    print(
        f"PARL worker (pid {worker.pid}) joined the cluster at {args.address} with {cpu_num} "
        f"CPU slots{gpus}."
    )
    return 0


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _fmt_age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def format_status(status: dict[str, Any]) -> str:
    """The text `xparl status` prints."""
    t = status["totals"]
    master = status["master"]
    lines = [
        f"PARL cluster {status['cluster_id']}: master {master.get('host')}:{master.get('port')} "
        f"(pid {master.get('pid')}, up {_fmt_age(master.get('uptime_s', 0))})",
        f"workers: {t['workers']}   CPU slots: {t['cpu_used']} used, {t['cpu_vacant']} vacant, "
        f"{t['cpu_total']} total   actors: {t['actors']}   clients: {t['clients']}   "
        f"memory: {_fmt_bytes(t['mem_used'])} / {_fmt_bytes(t['mem_total'])}",
        "",
        _table(
            ["WORKER", "HOST", "PID", "SLOTS USED", "GPUS", "CPU%", "MEMORY", "UPTIME"],
            [
                [
                    w["worker_id"],
                    f"{w['hostname']} ({w['host']})",
                    w["pid"],
                    f"{w['cpu_used']}/{w['cpu_num']}",
                    ",".join(w["gpus"]) or "-",
                    f"{w['cpu_percent']:.0f}",
                    f"{_fmt_bytes(w['mem_used'])} / {_fmt_bytes(w['mem_total'])}",
                    _fmt_age(w["uptime_s"]),
                ]
                for w in status["workers"]
            ],
        ),
    ]
    if status["clients"]:
        lines += [
            "",
            _table(
                ["CLIENT", "HOST", "PID", "ACTORS"],
                [[c["client_id"], c["hostname"], c["pid"], c["actors"]] for c in status["clients"]],
            ),
        ]
    if status["actors"]:
        lines += [
            "",
            _table(
                ["ACTOR", "CLASS", "STATE", "CLIENT", "WORKER", "PID", "CALLS", "UPTIME"],
                [
                    [
                        a["actor_id"],
                        a["class_name"],
                        a["state"],
                        a["client_id"],
                        a["worker_id"],
                        a["pid"],
                        a["calls"],
                        _fmt_age(a["uptime_s"]),
                    ]
                    for a in status["actors"]
                ],
            ),
        ]
    return "\n".join([*lines, *_paging(status)])


def _paging(status: dict[str, Any]) -> list[str]:
    """The lines that say which part of each list a paged status shows, and how to see more."""
    t, offset, limit = status["totals"], status.get("offset", 0), status.get("limit")
    if limit is None:
        return []
    shown = []
    for key in ("workers", "clients", "actors"):
        listed = len(status[key])
        if listed < t[key]:
            first = f"{offset + 1:,}-{offset + listed:,}" if listed else "none"
            shown.append(f"{key} {first} of {t[key]:,}")
    if not shown:
        return []
    more = f"xparl status --offset {offset + limit} for the next {limit}, --all for every one"
    return ["", f"shown: {', '.join(shown)} ({more})"]


def _cmd_status(args: argparse.Namespace) -> int:
    address = _local_address(args)
    limit = None if args.all else STATUS_PAGE
    offset = max(args.offset, 0)
    reply = _request(address, lambda rid: m.StatusRequest(rid, offset, limit))
    print(format_status(reply.status))
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    address = _local_address(args)
    port = _split(address)[1]
    try:
        _request(address, lambda rid: m.ShutdownCluster(rid), timeout=settings.connect_timeout_s)
        print(f"asked the master at {address} to stop the cluster")
    except (OSError, RemoteError) as exc:
        print(
            f"the master at {address} did not answer ({exc}); stopping the processes started here"
        )
    stopped = 0
    state_file = _master_state(port)
    state = read_json(state_file)
    procs = []
    if state:
        procs += [state["master"], *state["workers"]]
    worker_files = []
    if os.path.isdir(_clusters_dir()):
        for name in os.listdir(_clusters_dir()):
            if name.startswith("worker-"):
                path = os.path.join(_clusters_dir(), name)
                entry = read_json(path)
                if entry and _split(entry["address"])[1] == port:
                    procs.append(entry["worker"])
                    worker_files.append(path)
    for proc in procs:
        info = _process(proc)
        if info.alive():
            info.stop()
            stopped += 1
    for path in [state_file, *worker_files]:
        if os.path.exists(path):
            os.unlink(path)
    print(f"PARL cluster on port {port} stopped ({stopped} local processes ended by PID)")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xparl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--version", action="version", version=f"xparl {importlib.metadata.version('parl-remote')}"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a master and a local worker in the background")
    start.add_argument("--port", type=int, default=8010, help="the master's port (default 8010)")
    start.add_argument(
        "--cpu_num",
        type=int,
        default=None,
        help="CPU slots of the local worker (default: all cores)",
    )
    start.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: loopback only)"
    )
    start.add_argument(
        "--monitor_port", type=int, default=None, help="dashboard port (default: --port + 1)"
    )
    start.add_argument("--gpu", default="", help="GPU ids the local worker offers, e.g. 0,1")
    start.add_argument(
        "--preload",
        type=_preload_names,
        default=[],
        metavar="MODULES",
        help="installed modules every warm actor process imports ahead, e.g. torch,numpy",
    )
    _tls_flags(start, server=True)
    start.set_defaults(func=_cmd_start)
    connect = sub.add_parser("connect", help="add a worker on this machine to a cluster")
    connect.add_argument("--address", required=True, help="the master, HOST:PORT")
    connect.add_argument(
        "--cpu_num", type=int, default=None, help="CPU slots to offer (default: all cores)"
    )
    connect.add_argument("--gpu", default="", help="GPU ids to offer, e.g. 0,1")
    connect.add_argument("--host", default=None, help="address clients use to reach this machine")
    _tls_flags(connect, server=True)
    connect.set_defaults(func=_cmd_connect)
    for name, func, text in (
        ("status", _cmd_status, "print the cluster"),
        ("stop", _cmd_stop, "stop the cluster"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--address", default=None, help="the master, HOST:PORT")
        cmd.add_argument(
            "--port", type=int, default=None, help="the port of a cluster started here"
        )
        if name == "status":
            cmd.add_argument(
                "--all", action="store_true", help="list every worker, client and actor"
            )
            cmd.add_argument(
                "--offset",
                type=int,
                default=0,
                help=f"list from this record on ({STATUS_PAGE} of each kind a page)",
            )
        _tls_flags(cmd, server=False)
        cmd.set_defaults(func=func)
    return parser


def _preload_names(text: str) -> list[str]:
    try:
        return preload_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tls_flags(cmd: argparse.ArgumentParser, *, server: bool) -> None:
    cmd.add_argument("--tls", action="store_true", help="TLS 1.3 on every connection (PARL_TLS)")
    if server:
        cmd.add_argument("--tls-cert", default=None, help="certificate servers present (PEM)")
        cmd.add_argument("--tls-key", default=None, help="its private key (PEM)")
    cmd.add_argument("--tls-ca", default=None, help="trust only certificates this CA signed")


def main(argv: list[str] | None = None) -> int:
    """Run one `xparl` command; return its exit status (2: a bad `PARL_*` setting)."""
    args = _parser().parse_args(argv)
    try:
        check_env()
    except SettingError as exc:
        print(f"xparl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    try:
        _use_tls(args)
        status: int = args.func(args)
        return status
    except (ClusterError, RemoteError, OSError) as exc:
        print(f"xparl {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())


def console_main() -> None:
    """The `xparl` console script."""
    sys.exit(main())
