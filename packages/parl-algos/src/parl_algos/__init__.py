"""parl_algos: the algorithm zoo, exposed as `parl.algorithms`.

Each algorithm is a `parl.Algorithm` on a user-supplied `parl.Model`: the model defines the
network, the algorithm the loss and the update. One module per algorithm, each with its paper.
"""

from __future__ import annotations

from parl_algos.policy_gradient import PolicyGradient, PolicyGradientStats

__all__ = ["PolicyGradient", "PolicyGradientStats"]
