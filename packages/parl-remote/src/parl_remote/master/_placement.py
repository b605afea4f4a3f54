"""Placement: which worker runs an actor, decided without sockets, timers or clocks.

Sans-I/O in the way `wire/protocol/connection.py` is. The master tells a `Placement` what happened
(a client asks for an actor, a worker reports that the actor's process took it or could not, an
actor ended, a slot freed, a deadline passed) and gets back the messages to send, as `Send`s naming
the connection each goes to; it sends them, and keeps one timer armed at `next_deadline()`, whose
expiry it reports with `expire(deadline)`. The current time comes in as an argument. Changes to the
cluster's state go through the registry's own methods, which notify its listeners.

A request waits in `pending` until some worker has a vacant slot (and the GPUs asked for) or its
deadline passes; once placed, it waits in `starting` until the worker's `ActorStarted` (the
client gets the actor's address) or `ActorStartFailed` (the client gets why).
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

from parl_remote.master._registry import ActorInfo, ClientInfo, Registry, WorkerInfo
from parl_remote.master._vacancy import choose_worker
from parl_remote.wire.protocol import messages as m

__all__ = ["Placement", "Request", "Send", "choose_worker"]


@dataclass(eq=False)
class Request:
    """A client's request for an actor, waiting for a slot or for its process to start."""

    reply_to: Any
    """The client's connection, where the answer goes."""
    client: ClientInfo
    """The client that asked."""
    msg: m.CreateActor
    """What it asked for."""
    deadline: float
    """When a request still waiting for a slot fails (in the caller's clock)."""


@dataclass(frozen=True)
class Send:
    """A message to send on a peer's connection."""

    to: Any
    """The connection (None: the peer is gone, drop the message)."""
    message: m.Message
    """The envelope."""


class Placement:
    """The master's queue of actor requests and its placement decisions.

    Args:
        registry: the cluster's registry; placement reads its workers and records the actors
            it places there.
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.pending: deque[Request] = deque()
        self.starting: dict[str, Request] = {}

    # -- events in, messages out -----------------------------------------------------------
    def request(
        self, reply_to: Any, client: ClientInfo, msg: m.CreateActor, now: float
    ) -> list[Send]:
        """A client asks for an actor: place it now, or queue it until `now + msg.wait_s`."""
        request = Request(reply_to, client, msg, now + max(msg.wait_s, 0.0))
        sends = self._place(request)
        if sends is None:
            self.pending.append(request)
            return []
        return sends

    def place_pending(self) -> list[Send]:
        """Slots may have freed or been added: place what waits, oldest first.

        Once a request without GPUs finds no slot, none of those after it can: they stay
        waiting without asking the registry's index again.
        """
        sends: list[Send] = []
        waiting: deque[Request] = deque()
        cpu_full = False
        while self.pending:
            request = self.pending.popleft()
            placed = None if cpu_full and not request.msg.n_gpu else self._place(request)
            if placed is None:
                cpu_full = cpu_full or not request.msg.n_gpu
                waiting.append(request)
            else:
                sends += placed
        self.pending = waiting
        return sends

    def next_deadline(self) -> float | None:
        """When the earliest waiting request expires; None when nothing waits."""
        return min((r.deadline for r in self.pending), default=None)

    def expire(self, now: float) -> list[Send]:
        """Fail every waiting request whose deadline is at or before `now`, saying why."""
        due = [r for r in self.pending if r.deadline <= now]
        for request in due:
            self.pending.remove(request)
        return [
            Send(r.reply_to, m.CreateFailed(r.msg.request_id, "resource", self._why_no_slot(r)))
            for r in due
        ]

    def started(self, worker: WorkerInfo, actor_id: str, port: int, pid: int) -> list[Send]:
        """The worker's process took the actor: give its address to the client that asked."""
        actor = self.registry.actors.get(actor_id)
        request = self.starting.pop(actor_id, None)
        if actor is None or request is None:
            return [Send(worker.conn, m.StopActor(actor_id, "nobody is waiting for it any more"))]
        self.registry.actor_started(actor, port, pid)
        assigned = m.ActorAssigned(
            request.msg.request_id, actor_id, actor.host, port, pid, worker.worker_id
        )
        return [Send(request.reply_to, assigned)]

    def start_failed(self, actor_id: str, reason: str) -> list[Send]:
        """The worker could not start the actor: tell the client, and reuse the slot."""
        request = self.starting.pop(actor_id, None)
        actor = self.registry.actors.get(actor_id)
        if actor is not None:
            self.registry.end_actor(actor, reason)
        sends = []
        if request is not None:
            sends.append(
                Send(request.reply_to, m.CreateFailed(request.msg.request_id, "error", reason))
            )
        return sends + self.place_pending()

    def actor_ended(self, actor: ActorInfo, reason: str) -> list[Send]:
        """A live actor ended; a client still waiting for it learns that its process died.

        Its slot is free again, but `place_pending` is the caller's to call: the slot of an
        actor whose worker was lost is gone with the worker.
        """
        request = self.starting.pop(actor.actor_id, None)
        self.registry.end_actor(actor, reason)
        if request is None:
            return []
        why = f"the actor's process died: {reason}"
        return [Send(request.reply_to, m.CreateFailed(request.msg.request_id, "error", why))]

    def client_gone(self, client: ClientInfo) -> None:
        """Forget the requests still waiting for a slot on behalf of `client`."""
        self.pending = deque(r for r in self.pending if r.client is not client)

    # -- decisions -------------------------------------------------------------------------
    def _place(self, request: Request) -> list[Send] | None:
        n_gpu = request.msg.n_gpu
        worker = self.registry.vacancy.choose(n_gpu)
        if worker is None:
            return None
        actor = ActorInfo(
            actor_id=uuid.uuid4().hex[:12],
            class_name=request.msg.class_name,
            client_id=request.client.client_id,
            worker_id=worker.worker_id,
            host=worker.host,
            gpus=worker.free_gpus[:n_gpu],
            max_memory_mb=request.msg.max_memory_mb,
        )
        self.registry.replaced(actor, request.msg.replaces, request.client)
        self.registry.add_actor(actor)
        self.starting[actor.actor_id] = request
        start = m.StartActor(
            actor.actor_id, actor.client_id, actor.class_name, actor.gpus, actor.max_memory_mb
        )
        return [Send(worker.conn, start)]

    def _why_no_slot(self, request: Request) -> str:
        n_gpu, workers = request.msg.n_gpu, list(self.registry.workers.values())
        if n_gpu and not any(len(w.gpus) >= n_gpu for w in workers):
            why = f"no worker offers {n_gpu} GPUs (start workers with `xparl connect --gpu ...`)"
        else:
            cpu_total = sum(w.cpu_num for w in workers)
            cpu_used = sum(len(w.actors) for w in workers)
            why = (
                f"the cluster has {cpu_total} CPU slots on {len(workers)} workers, "
                f"{cpu_used} in use"
            )
        return (
            f"no free CPU slot{f' with {n_gpu} GPUs' if n_gpu else ''} for "
            f"{request.msg.class_name} within {request.msg.wait_s:g} s: {why}. Free actors "
            "(`del actor`), add workers (`xparl connect`), or wait longer (PARL_RESOURCE_WAIT_S)"
        )
