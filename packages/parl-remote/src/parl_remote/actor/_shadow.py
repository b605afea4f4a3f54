"""Which methods an actor's instance attributes hide, and which connections were told.

As in PARL, an instance attribute hides a method of the same name: `actor.arg1` then reads the
attribute, and calling it raises the TypeError it would locally. The names hidden after
`__init__` go back with `Ready`; when a later method (or another process's handle) sets such an
attribute, the actor reports the whole set of hidden names in the next `Result` on each of its
connections, and the client's handles of the actor read those names as attributes from then
on. A process thus learns at its next reply from the actor.

Watching costs one length check of the instance's `__dict__` per reply; only an actor that
hides some method also checks whether the connection was told. At most `MAX_NAMES` names are
reported.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["MAX_NAMES", "ShadowWatch"]

MAX_NAMES = 256


class ShadowWatch:
    """The hidden methods of one actor instance (see the module docstring).

    Args:
        instance: the actor's instance (None before it is built).
        methods: the actor host's cache of bound methods; a name hidden is dropped from it.
    """

    def __init__(self, instance: Any = None, methods: dict[str, Any] | None = None) -> None:
        found = getattr(instance, "__dict__", None) if instance is not None else None
        self.vars: dict[str, Any] = found if isinstance(found, dict) else {}
        self._cls = type(instance)
        self._methods = methods if methods is not None else {}
        self.size = len(self.vars)
        self.names: tuple[str, ...] = self._scan()
        self.told: weakref.WeakSet[Any] = weakref.WeakSet()

    def _scan(self) -> tuple[str, ...]:
        cls = self._cls
        return tuple(n for n in list(self.vars) if hasattr(cls, n))[:MAX_NAMES]

    def current(self) -> tuple[str, ...]:
        """The names hidden now, rescanned when the instance's attributes changed in number."""
        if len(self.vars) != self.size:
            self.size = len(self.vars)
            names = self._scan()
            if names != self.names:
                for name in names:
                    self._methods.pop(name, None)  # a call now finds the attribute
                self.names = names
                self.told.clear()
        return self.names

    def news(self, conn: Any) -> tuple[str, ...]:
        """The hidden names to report to `conn` now (all of them), or () when it knows them."""
        if not self.current() or conn in self.told:
            return ()
        self.told.add(conn)
        return self.names
