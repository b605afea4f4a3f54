"""The errors of `parl.evo`: one hierarchy, so `except parl.evo.EvoError` catches them all.

```
EvoError                              base of every parl.evo error
├── ConfigError (ValueError)          a configuration field is missing, unknown or out of range
├── NoiseTableError (OSError)         a shared noise table file is not the table it claims to be
├── SampleError (ValueError)          sampling infos and rewards that cannot be used
│   ├── FutureSampleError             a sample drawn around a version this solver has not reached
│   └── NoUsableSamplesError          every sample was discarded (too stale) or too few were given
├── SolverStateError (ValueError)     a solver file that does not fit this agent, or no weights yet
└── SampleLogError (OSError)          a sample log that cannot be read
    ├── SampleLogCorruptError         a record whose length or checksum is wrong
    └── SampleLogTruncatedError       the file ends in the middle of a record
```

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EvoError",
    "FutureSampleError",
    "NoUsableSamplesError",
    "NoiseTableError",
    "SampleError",
    "SampleLogCorruptError",
    "SampleLogError",
    "SampleLogTruncatedError",
    "SolverStateError",
]


class EvoError(Exception):
    """Base class of every error raised by `parl.evo`."""


class ConfigError(EvoError, ValueError):
    """A configuration field is missing, unknown or out of range."""


class NoiseTableError(EvoError, OSError):
    """A shared noise table file exists but is not the table its name promises."""


class SampleError(EvoError, ValueError):
    """Sampling infos and rewards that cannot be used for an update."""


class FutureSampleError(SampleError):
    """A sample was drawn around a parameter version this solver has not reached yet.

    Replicas of one solver that apply the same updates stay at the same version; a sample from
    the future means two replicas diverged (a missed update, or a solver loaded from elsewhere).
    """


class NoUsableSamplesError(SampleError):
    """Every sample was discarded as too stale, or fewer were given than the solver needs."""


class SolverStateError(EvoError, ValueError):
    """A saved solver that does not fit this agent, or an agent that has no weights yet."""


class SampleLogError(EvoError, OSError):
    """A sample log that cannot be read or written."""


class SampleLogCorruptError(SampleLogError):
    """A record of a sample log whose length or checksum is wrong."""


class SampleLogTruncatedError(SampleLogError):
    """A sample log that ends in the middle of a record (a writer was cut off)."""
