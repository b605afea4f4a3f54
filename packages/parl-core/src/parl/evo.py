"""`parl.evo`: evolution strategies, an alias of the parl-evo distribution's `parl_evo`.

`import parl.evo`, `from parl.evo import ESAgent` and `parl.evo.ESAgent` all reach the one module
object `parl_evo`: this file replaces itself in `sys.modules` on import.
"""

from __future__ import annotations

import sys

from parl import _import_sibling

sys.modules[__name__] = _import_sibling("parl_evo", "evo")
