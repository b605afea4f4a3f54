"""parl_algos: the algorithm zoo, exposed as `parl.algorithms`.

Each algorithm is a `parl.Algorithm` on a user-supplied `parl.Model`: the model defines the
network, the algorithm the loss and the update. One module per algorithm, each with its paper:

- value-based: the DQN family, one `DQN` with options (double, dueling, n-step, noisy,
  distributional) and its members by name: `DDQN`, `DuelingDQN`, `C51`, `QRDQN`, `Rainbow`;
- policy gradient: `PolicyGradient` (REINFORCE), `A2C`, `PPO`; `A3C` (`A2C`'s loss with
  its gradients computed on actors and applied by a learner as they arrive, `parl_algos.a3c`),
  `GA3C` (rollouts from a central batched predictor queued for the trainer, `parl_algos.ga3c`);
- continuous control: `DDPG`, `TD3`, `SAC`;
- offline, from a fixed `parl.utils.OfflineDataset`: `CQL` (on SAC), `IQL`, and the behaviour
  cloning baseline `BC`;
- distributed: `IMPALA`'s learner (V-trace); `R2D2` (a recurrent Q-network learned from
  prioritized sequences, with burn-in and value rescaling; its actors in `parl_algos.r2d2`,
  its sequence memory in `parl_algos.sequence_replay`);
- multi-agent (PettingZoo's parallel API): `MADDPG`, `QMIX`, `MAPPO`.

`parl_algos.functional` holds the return estimators and losses as pure functions (TD target,
C51's projection, the quantile Huber loss, GAE, V-trace, PPO's clipped surrogate, SAC's entropy
terms); `parl_algos.nets` the networks' building blocks (dueling heads, noisy layers);
`parl_algos.rollout` collects
on-policy experience from vector environments apart from learning; `parl_algos.training` holds
the plumbing the examples share (episode tracking, evaluation, learning curves);
`parl_algos.multiagent` the multi-agent environment wrapper and replay memories.
"""

from __future__ import annotations

from parl_algos.a2c import A2C, A2CStats
from parl_algos.a3c import A3C
from parl_algos.bc import BC, BCStats
from parl_algos.cql import CQL, CQLStats
from parl_algos.ddpg import DDPG, DDPGStats
from parl_algos.dqn import C51, DDQN, DQN, QRDQN, DQNStats, DuelingDQN, Rainbow
from parl_algos.ga3c import GA3C
from parl_algos.impala import IMPALA, IMPALAStats
from parl_algos.iql import IQL, IQLStats
from parl_algos.maddpg import MADDPG, MADDPGStats
from parl_algos.mappo import MAPPO, MAPPOStats
from parl_algos.policy_gradient import PolicyGradient, PolicyGradientStats
from parl_algos.ppo import PPO, PPOStats
from parl_algos.qmix import QMIX, QMIXStats
from parl_algos.r2d2 import R2D2, R2D2Stats
from parl_algos.sac import SAC, SACStats
from parl_algos.td3 import TD3, TD3Stats

__all__ = [
    "A2C",
    "A2CStats",
    "A3C",
    "BC",
    "BCStats",
    "C51",
    "CQL",
    "CQLStats",
    "DDPG",
    "DDPGStats",
    "DDQN",
    "DQN",
    "DQNStats",
    "DuelingDQN",
    "GA3C",
    "IMPALA",
    "IMPALAStats",
    "IQL",
    "IQLStats",
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
    "QRDQN",
    "R2D2",
    "R2D2Stats",
    "Rainbow",
    "SAC",
    "SACStats",
    "TD3",
    "TD3Stats",
]
