"""Actor classes of the dashboard tests (a module of their own, which actors import)."""

from __future__ import annotations

import sys

import parl_remote


@parl_remote.remote_class
class Talker:
    """Prints what it is told; can fail and exit on request."""

    def __init__(self, greeting="hello"):
        print(f"{greeting} from the actor", flush=True)

    def say(self, *lines):
        for line in lines:
            print(line, flush=True)
        return len(lines)

    def warn(self, text):
        print(text, file=sys.stderr, flush=True)

    def fail(self, message):
        raise ValueError(message)

    def exit(self, code):
        sys.exit(code)


EVIL = "<script>alert('xss')</script>"


class _Evil:
    def shout(self):
        print(f"{EVIL} & <b>bold</b>", flush=True)


_Evil.__name__ = _Evil.__qualname__ = EVIL
globals()[EVIL] = _Evil  # pickled by reference: the actor finds the class under its odd name
EvilActor = parl_remote.remote_class(_Evil)
