"""`parl.samplers`: the samplers of the parl-algos distribution, an alias of `parl_algos.samplers`.

`import parl.samplers`, `from parl.samplers import ParallelSampler` and `parl.samplers.Batch` all
reach the one module object `parl_algos.samplers`: this file replaces itself in `sys.modules` on
import.
"""

from __future__ import annotations

import sys

from parl import _import_sibling

sys.modules[__name__] = _import_sibling("parl_algos.samplers", "samplers")
