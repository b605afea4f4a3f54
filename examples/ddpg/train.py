"""DDPG on Pendulum-v1: `parl.algorithms.DDPG`, a deterministic actor and its Q-function critic.

Actions are rescaled to `[-1, 1]` (the actor's tanh range) by `make_rescaled_env`, and
explored with Gaussian noise. After `--learning-starts` random steps, every env step is
followed by one critic update, one actor update and a soft target update. Writes a TensorBoard
summary, the agent and a learning curve into `--logdir`.

    python examples/ddpg/train.py
    python examples/ddpg/train.py --tau 0.01 --seed 2
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from parl.algorithms import DDPG
from parl.utils import parse_args
from parl_algos.nets import ContinuousActorCriticMLP
from parl_algos.training import OffPolicyArgs, train_continuous_control


@dataclass
class Args(OffPolicyArgs):
    env_id: str = "Pendulum-v1"
    total_steps: int = 20_000
    gamma: float = 0.98
    buffer_size: int = 200_000
    learning_starts: int = 1000
    tau: float = 0.005
    """Polyak rate of the target networks."""
    exploration_noise: float = 0.1
    """Standard deviation of the Gaussian exploration noise (actions in [-1, 1])."""
    eval_every: int = 5_000
    target_return: float | None = -200.0
    logdir: str = "train_log/ddpg"


def main(args: Args) -> dict:
    hidden = (args.hidden_size, args.hidden_size)

    def make_algorithm(obs_dim: int, act_dim: int) -> DDPG:
        return DDPG(
            ContinuousActorCriticMLP(obs_dim, act_dim, hidden),
            actor_lr=args.lr,
            critic_lr=args.lr,
            gamma=args.gamma,
            tau=args.tau,
            exploration_noise=args.exploration_noise,
            seed=args.seed,
        )

    return asdict(train_continuous_control(args, f"DDPG on {args.env_id}", make_algorithm))


if __name__ == "__main__":
    main(parse_args(Args))
