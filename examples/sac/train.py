"""SAC on Pendulum-v1: `parl.algorithms.SAC` with automatic entropy tuning.

Actions are rescaled to `[-1, 1]` (the squashed Gaussian's range) by gymnasium's
`RescaleAction`. After `--learning-starts` random steps, every env step is followed by one update
of the twin critics, the actor and the temperature. Writes a TensorBoard summary, the agent and
a learning curve into `--logdir`.

    python examples/sac/train.py                 # reaches a return of about -150 in 5-10k steps
    python examples/sac/train.py --alpha 0.2     # a fixed temperature instead
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from parl.algorithms import SAC
from parl.utils import parse_args
from parl_algos.nets import ContinuousActorCriticMLP
from parl_algos.training import OffPolicyArgs, train_continuous_control


@dataclass
class Args(OffPolicyArgs):
    env_id: str = "Pendulum-v1"
    total_steps: int = 20_000
    alpha: float | None = None
    """A fixed temperature (none: learn it, aiming at an entropy of -act_dim)."""
    tau: float = 0.005
    """Polyak rate of the target critics."""
    eval_every: int = 5_000
    target_return: float | None = -200.0
    logdir: str = "train_log/sac"


def main(args: Args) -> dict:
    hidden = (args.hidden_size, args.hidden_size)

    def make_algorithm(obs_dim: int, act_dim: int) -> SAC:
        return SAC(
            ContinuousActorCriticMLP(obs_dim, act_dim, hidden, stochastic=True, twin=True),
            actor_lr=args.lr,
            critic_lr=args.lr,
            alpha_lr=args.lr,
            gamma=args.gamma,
            tau=args.tau,
            alpha=args.alpha,
        )

    return asdict(train_continuous_control(args, f"SAC on {args.env_id}", make_algorithm))


if __name__ == "__main__":
    main(parse_args(Args))
