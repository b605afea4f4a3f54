"""TD3 on Pendulum-v1: `parl.algorithms.TD3`, twin critics and delayed, smoothed actor updates.

Actions are rescaled to `[-1, 1]` (the actor's tanh range) by `make_rescaled_env`.
After `--learning-starts` random steps, every env step is followed by one critic update, and
every `--policy-delay` of them by an actor and target update. Writes a TensorBoard summary, the
agent and a learning curve into `--logdir`.

    python examples/td3/train.py
    python examples/td3/train.py --exploration-noise 0.2 --seed 3
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from parl.algorithms import TD3
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
    policy_noise: float = 0.2
    """Standard deviation of the target policy smoothing noise."""
    noise_clip: float = 0.5
    """Bound of the target policy smoothing noise."""
    policy_delay: int = 2
    """Critic updates per actor update."""
    eval_every: int = 5_000
    target_return: float | None = -200.0
    logdir: str = "train_log/td3"


def main(args: Args) -> dict:
    hidden = (args.hidden_size, args.hidden_size)

    def make_algorithm(obs_dim: int, act_dim: int) -> TD3:
        return TD3(
            ContinuousActorCriticMLP(obs_dim, act_dim, hidden, twin=True),
            actor_lr=args.lr,
            critic_lr=args.lr,
            gamma=args.gamma,
            tau=args.tau,
            policy_noise=args.policy_noise,
            noise_clip=args.noise_clip,
            policy_delay=args.policy_delay,
            exploration_noise=args.exploration_noise,
            seed=args.seed,
        )

    return asdict(train_continuous_control(args, f"TD3 on {args.env_id}", make_algorithm))


if __name__ == "__main__":
    main(parse_args(Args))
