"""parl_algos: the algorithm zoo, exposed as `parl.algorithms`.

Each algorithm is a `parl.Algorithm` on a user-supplied `parl.Model`: the model defines the
network, the algorithm the loss and the update. One module per algorithm, each with its paper:

- value-based: `DQN` (double, with any Q-network: plain or dueling);
- policy gradient: `PolicyGradient` (REINFORCE), `A2C`, `PPO`;
- continuous control: `DDPG`, `TD3`, `SAC`;
- distributed: `IMPALA`'s learner (V-trace);
- multi-agent (PettingZoo's parallel API): `MADDPG`, `QMIX`, `MAPPO`.

`parl_algos.functional` holds the return estimators and losses as pure functions (TD target,
GAE, V-trace, PPO's clipped surrogate, SAC's entropy terms); `parl_algos.rollout` collects
on-policy experience from vector environments apart from learning; `parl_algos.training` holds
the plumbing the examples share (episode tracking, evaluation, learning curves);
`parl_algos.multiagent` the multi-agent environment wrapper and replay memories.
"""

from __future__ import annotations

from parl_algos.a2c import A2C, A2CStats
from parl_algos.ddpg import DDPG, DDPGStats
from parl_algos.dqn import DQN, DQNStats
from parl_algos.impala import IMPALA, IMPALAStats
from parl_algos.maddpg import MADDPG, MADDPGStats
from parl_algos.mappo import MAPPO, MAPPOStats
from parl_algos.policy_gradient import PolicyGradient, PolicyGradientStats
from parl_algos.ppo import PPO, PPOStats
from parl_algos.qmix import QMIX, QMIXStats
from parl_algos.sac import SAC, SACStats
from parl_algos.td3 import TD3, TD3Stats

__all__ = [
    "A2C",
    "A2CStats",
    "DDPG",
    "DDPGStats",
    "DQN",
    "DQNStats",
    "IMPALA",
    "IMPALAStats",
    "MADDPG",
    "MADDPGStats",
    "MAPPO",
    "MAPPOStats",
    "PPO",
    "PPOStats",
    "PolicyGradient",
    "PolicyGradientStats",
    "QMIX",
    "QMIXStats",
    "SAC",
    "SACStats",
    "TD3",
    "TD3Stats",
]
