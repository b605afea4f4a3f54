"""PPO on an Atari game (Pong by default) with a CNN policy, acting centrally on a CentralSampler.

A `parl.samplers.CentralSampler` runs `--actors` worker actors that only step environments
(`--num-envs` each, with the classic preprocessing: 4 stacked 84x84 grayscale frames); every
step, the frames of all workers reach this process through shared memory and the convolutional
policy chooses all actions in one batched call, on the learner's device (rlpyt's parallel-GPU
sampling; `--alternating` overlaps one half of the workers' stepping with the other half's
inference). Every `--n-steps` steps PPO (https://arxiv.org/abs/1707.06347) learns from the batch
with GAE advantages and rewards clipped to their sign; reported returns are the game's scores.

The defaults are a bounded run for a small machine, far from the 10M frames of the paper:

    python examples/ppo_atari/train.py
    python examples/ppo_atari/train.py --env-id ALE/Breakout-v5 --actors 4 --alternating

Writes a TensorBoard summary, the agent and a learning curve into `--logdir`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass

import numpy as np
import torch

import parl
from parl.algorithms import PPO
from parl.samplers import CentralSampler
from parl.utils import logger, parse_args
from parl_algos.agents import ActorCriticAgent
from parl_algos.nets import AtariActorCritic
from parl_algos.rollout import make_atari_env
from parl_algos.training import OnPolicyArgs, TrainingRun


@dataclass
class Args(OnPolicyArgs):
    env_id: str = "ALE/Pong-v5"
    actors: int = 2
    """Worker actors, each stepping --num-envs environments (no copy of the policy)."""
    address: str | None = None
    """HOST:PORT of a running cluster (`xparl start`); default: a local one of --actors slots."""
    alternating: bool = False
    """Two groups of workers: one steps while the policy chooses the other's actions."""
    num_envs: int = 4
    """Environments each worker steps."""
    n_steps: int = 128
    """Steps of every environment between two PPO updates."""
    lr: float = 2.5e-4
    gae_lambda: float = 0.95
    ent_coef: float = 0.01
    clip_coef: float = 0.1
    """Clip range of the surrogate objective."""
    update_epochs: int = 4
    """Passes over each batch."""
    minibatch_size: int = 256
    """Samples per gradient step."""
    hidden_size: int = 512
    total_steps: int = 20_000
    eval_every: int = 10_000
    eval_episodes: int = 1
    logdir: str = "train_log/ppo_atari"


def main(args: Args) -> dict:
    title = f"PPO on {args.env_id}, {args.actors} remote workers, central inference"
    eval_env = make_atari_env(args.env_id)
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    if args.address is None:
        parl.connect(cpu_num=args.actors)  # a local cluster, stopped when this process exits
    else:
        parl.connect(args.address)
    model = AtariActorCritic(eval_env.action_space.n, args.hidden_size)
    alg = PPO(
        model,
        lr=args.lr,
        clip_coef=args.clip_coef,
        update_epochs=args.update_epochs,
        minibatch_size=args.minibatch_size,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
    )
    agent = ActorCriticAgent(alg, gamma=args.gamma, gae_lambda=args.gae_lambda)
    with CentralSampler(
        functools.partial(make_atari_env, args.env_id),
        agent,  # stays here: the workers only step environments
        num_workers=args.actors,
        envs_per_worker=args.num_envs,
        horizon=args.n_steps,
        seed=args.seed,
        alternating=args.alternating,
    ) as sampler:
        logger.info("%d workers ready, %d environments each", args.actors, args.num_envs)
        run.start()
        while sampler.env_steps < args.total_steps and not run.done:
            with torch.no_grad():
                trajectory = sampler.collect().to_trajectory()
            trajectory = dataclasses.replace(trajectory, reward=np.sign(trajectory.reward))
            stats = agent.learn(trajectory)
            run.record(sampler.env_steps, sampler.episodes(), stats)
            run.maybe_evaluate(agent.predict)
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
