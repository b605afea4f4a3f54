"""PPO on CartPole-v1: `parl.algorithms.PPO` with vectorized environments.

A `VectorCollector` steps `--num-envs` environments for `--n-steps` steps with the current
policy; `compute_advantages` adds GAE advantages; `PPO.learn` runs `--update-epochs` epochs of
minibatch updates on that batch. The learning rate and the clip range fall linearly to zero
over `--total-steps` (`--no-anneal` keeps them constant). Writes a TensorBoard summary, the
agent and a learning curve into `--logdir`.

    python examples/ppo/train.py                       # ~20-40k env steps to a return of 500
    python examples/ppo/train.py --variant kl --seed 2
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import gymnasium as gym

from parl.algorithms import PPO
from parl.utils import parse_args
from parl_algos.agents import ActorCriticAgent
from parl_algos.nets import ActorCriticMLP
from parl_algos.rollout import VectorCollector, make_vector_env
from parl_algos.training import OnPolicyArgs, TrainingRun, train_on_policy


@dataclass
class Args(OnPolicyArgs):
    n_steps: int = 32
    lr: float = 1e-3
    anneal: bool = True
    """Let the learning rate and the clip range fall linearly to zero over --total-steps."""
    gamma: float = 0.98
    gae_lambda: float = 0.8
    variant: Literal["clip", "kl"] = "clip"
    """'clip' (clipped surrogate) or 'kl' (adaptive KL penalty)."""
    clip_coef: float = 0.2
    """Clip range of the surrogate objective."""
    kl_target: float = 0.01
    """Target KL of the 'kl' variant."""
    clip_value: float | None = None
    """Clip range of the value prediction (none: no value clipping)."""
    update_epochs: int = 20
    """Passes over each batch."""
    minibatch_size: int = 256
    """Samples per gradient step."""
    target_return: float | None = 475.0
    logdir: str = "train_log/ppo"


def main(args: Args) -> dict:
    run = TrainingRun(
        f"PPO on {args.env_id}", args, total_steps=args.total_steps, eval_env=gym.make(args.env_id)
    )
    envs = make_vector_env(args.env_id, args.num_envs)
    hidden = (args.hidden_size, args.hidden_size)
    model = ActorCriticMLP(
        envs.single_observation_space.shape[0], envs.single_action_space.n, hidden
    )
    alg = PPO(
        model,
        lr=args.lr,
        variant=args.variant,
        clip_coef=args.clip_coef,
        kl_target=args.kl_target,
        clip_value=args.clip_value,
        update_epochs=args.update_epochs,
        minibatch_size=args.minibatch_size,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
    )
    agent = ActorCriticAgent(alg, gamma=args.gamma, gae_lambda=args.gae_lambda)

    def anneal(env_steps: int) -> None:  # linear in the progress still to go, like SB3's zoo
        if args.anneal:
            remaining = 1.0 - env_steps / args.total_steps
            alg.optimizer.param_groups[0]["lr"] = args.lr * remaining
            alg.clip_coef = max(args.clip_coef * remaining, 1e-8)

    collector = VectorCollector(envs, seed=args.seed)
    train_on_policy(run, collector, agent, args, before_learn=anneal)
    envs.close()
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
