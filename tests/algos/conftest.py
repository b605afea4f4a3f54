"""The algorithm tests run their tiny networks on one torch thread.

pytest-xdist already runs one test per core; torch's default of one thread per core on top of
that makes every worker fight the others, and small networks slower, not faster.
"""

from __future__ import annotations

import torch

torch.set_num_threads(1)
