"""IMPALA on remote workers: CartPole-v1 learned from trajectories that arrive asynchronously.

A `parl.samplers.AsyncSampler` runs `--actors` worker actors, each stepping its own
`--num-envs` environments with its own copy of the policy and collecting trajectories of
`--n-steps` steps, together with the logits of the policy that chose each action, without ever
waiting for the learner (each worker always has its next trajectory queued). The learner takes
whichever trajectory is finished first, makes one V-trace update from it, and sends its fresh
weights to the workers (`sync_weights`), which load them after the trajectory they are
collecting: trajectories are a few updates stale, and V-trace corrects for it, as in PARL's
IMPALA example and the paper.

    python examples/impala/train.py                        # a local cluster of 2 CPU slots
    python examples/impala/train.py --actors 4 --seed 2
    xparl start --port 8010 --cpu_num 4                    # or an existing cluster
    python examples/impala/train.py --address localhost:8010 --actors 4

Training stops once the mean return of the last 10 episodes reaches 475. Writes a TensorBoard
summary (with `train/mean_rho`, the mean importance weight: how far the actors lag), the
learner's agent and a learning curve into `--logdir`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import gymnasium as gym

import parl
from parl.algorithms import IMPALA
from parl.samplers import AsyncSampler
from parl.utils import logger, parse_args
from parl_algos.agents import IMPALAAgent
from parl_algos.nets import ActorCriticMLP
from parl_algos.training import RunArgs, TrainingRun


@dataclass
class Args(RunArgs):
    actors: int = 2
    """Worker actors, each stepping --num-envs environments with its own copy of the policy."""
    address: str | None = None
    """HOST:PORT of a running cluster (`xparl start`); default: a local one of --actors slots."""
    num_envs: int = 8
    """Environments each worker steps (a trajectory's width B)."""
    n_steps: int = 20
    """Steps per environment in a trajectory (its length T)."""
    lr: float = 2e-3
    """RMSprop learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    ent_coef: float = 0.01
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    rho_bar: float = 1.0
    """V-trace's truncation of the importance weights."""
    c_bar: float = 1.0
    """V-trace's truncation of the trace coefficients."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip."""
    hidden_size: int = 64
    """Width of the two hidden layers of the actor and of the critic."""
    total_steps: int = 300_000
    eval_every: int = 25_000
    target_return: float | None = 475.0
    stop_at_target: bool = True
    logdir: str = "train_log/impala"


def make_agent(args: Args, observation_space: gym.Space, action_space: gym.Space) -> IMPALAAgent:
    """The learner's agent (the sampler sends each worker a copy of it)."""
    hidden = (args.hidden_size, args.hidden_size)
    model = ActorCriticMLP(observation_space.shape[0], action_space.n, hidden)
    alg = IMPALA(
        model,
        lr=args.lr,
        gamma=args.gamma,
        vf_coef=args.vf_coef,
        ent_coef=args.ent_coef,
        rho_bar=args.rho_bar,
        c_bar=args.c_bar,
        max_grad_norm=args.max_grad_norm,
    )
    return IMPALAAgent(alg)


def main(args: Args) -> dict:
    title, eval_env = f"IMPALA on {args.env_id}, {args.actors} remote actors", gym.make(args.env_id)
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    if args.address is None:
        parl.connect(cpu_num=args.actors)  # a local cluster, stopped when this process exits
    else:
        parl.connect(args.address)
    agent = make_agent(args, eval_env.observation_space, eval_env.action_space)  # the learner's
    env_fn = functools.partial(gym.make, args.env_id)
    with AsyncSampler(
        env_fn,
        agent,  # each worker gets a copy
        num_workers=args.actors,
        envs_per_worker=args.num_envs,
        horizon=args.n_steps,
        seed=args.seed,  # environment k starts from seed + k, worker w draws from seed*1000 + w
    ) as sampler:
        logger.info("%d actors ready, %d environments each", args.actors, args.num_envs)
        run.start()
        while sampler.env_steps < args.total_steps and not run.done:
            stats = agent.learn(sampler.collect().to_trajectory())  # whichever came first
            sampler.sync_weights()  # loaded by each worker after its current trajectory
            run.record(sampler.env_steps, sampler.episodes(), stats)
            run.maybe_evaluate(agent.predict)
    return run.finish(agent)


if __name__ == "__main__":
    main(parse_args(Args))
