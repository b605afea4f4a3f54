"""`parl.algorithms`: the algorithm zoo, an alias of the parl-algos distribution's `parl_algos`.

`import parl.algorithms`, `from parl.algorithms import DQN` and `parl.algorithms.DQN` all reach
the one module object `parl_algos`: this file replaces itself in `sys.modules` on import.
"""

from __future__ import annotations

import sys

from parl import _import_sibling

sys.modules[__name__] = _import_sibling("parl_algos", "algorithms")
