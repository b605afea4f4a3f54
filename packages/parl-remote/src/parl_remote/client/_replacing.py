"""Which dead actor the actors created now replace: the master records it (`replacing`).

A loop that replaces its dead actors (the samplers', `parl-train`'s) creates each new one
within `with parl_remote.replacing(dead_actor_id):`. The master then keeps, with the new
actor, the id of the one it replaced and why that one ended, and counts the replacements of
each client: the dashboard shows both. The setting is this thread's (a context variable), so
loops that replace actors from threads of their own do not mix theirs up.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["replaced_actor", "replacing"]

_REPLACES: contextvars.ContextVar[str] = contextvars.ContextVar("parl_replaces", default="")


@contextlib.contextmanager
def replacing(actor_id: str) -> Iterator[None]:
    """Actors created in this block (on this thread) replace the dead actor `actor_id`.

    Args:
        actor_id: the dead actor's id (`RemoteActorDiedError.actor_id`); "" replaces none.
    """
    if not isinstance(actor_id, str):
        raise TypeError(f"replacing: actor_id={actor_id!r} must be an actor id (a str)")
    token = _REPLACES.set(actor_id)
    try:
        yield
    finally:
        _REPLACES.reset(token)


def replaced_actor() -> str:
    """The id of the actor that actors created now replace ("" for none)."""
    return _REPLACES.get()
