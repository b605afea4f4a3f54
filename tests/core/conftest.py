from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Tiny networks run fastest on one thread, and xdist workers share two cores.
    torch.set_num_threads(1)
    torch.manual_seed(0)
