"""A2C on CartPole-v1: `parl.algorithms.A2C` with vectorized environments.

A `VectorCollector` steps `--num-envs` environments for `--n-steps` steps; the agent turns the
trajectory into advantages (GAE; `--gae-lambda 1` gives A2C's classic n-step returns) and takes
one RMSprop step. The learner only sees flat batches, which is what lets the parallel example
feed it from remote actors instead. Writes a TensorBoard summary, the agent and a learning
curve into `--logdir`.

    python examples/a2c/train.py
    python examples/a2c/train.py --num-envs 16 --gae-lambda 0.95
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import gymnasium as gym

from parl.algorithms import A2C
from parl.utils import parse_args
from parl_algos.agents import ActorCriticAgent
from parl_algos.nets import ActorCriticMLP
from parl_algos.rollout import VectorCollector, make_vector_env
from parl_algos.training import OnPolicyArgs, TrainingRun, train_on_policy


@dataclass
class Args(OnPolicyArgs):
    total_steps: int = 300_000
    eval_every: int = 25_000
    target_return: float | None = 475.0
    logdir: str = "train_log/a2c"


def main(args: Args) -> dict:
    run = TrainingRun(
        f"A2C on {args.env_id}", args, total_steps=args.total_steps, eval_env=gym.make(args.env_id)
    )
    envs = make_vector_env(args.env_id, args.num_envs)
    hidden = (args.hidden_size, args.hidden_size)
    model = ActorCriticMLP(
        envs.single_observation_space.shape[0], envs.single_action_space.n, hidden
    )
    alg = A2C(
        model,
        lr=args.lr,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
    )
    agent = ActorCriticAgent(alg, gamma=args.gamma, gae_lambda=args.gae_lambda)
    train_on_policy(run, VectorCollector(envs, seed=args.seed), agent, args)
    envs.close()
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
