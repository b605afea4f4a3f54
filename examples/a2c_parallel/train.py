"""Synchronous A2C on remote workers: CartPole-v1 learned by a central learner fed by N workers.

A `parl.samplers.ParallelSampler` runs `--actors` worker actors, each in its own process of the
cluster, each stepping `--num-envs` environments with its own copy of the model. Every round the
learner sends its weights to all workers (`sync_weights`), each collects `--n-steps` steps of
each of its environments (observations and actions reach the learner through shared memory on
this machine), and the learner computes GAE advantages and takes one A2C step on the batch of
all workers together, as PARL's A2C example does.

A round's batch is actors x num-envs x n-steps samples: with the defaults, 2 workers of 8
environments and 5 steps make 80, twice the batch of `examples/a2c/train.py`, so each round
gives the workers more work for one exchange of weights (the learning rate is 1e-3 to match).
`examples/a2c/train.py --num-envs 16 --lr 1e-3` is the same algorithm in one process.
Training stops once the mean return of the last 10 episodes reaches 475.

    python examples/a2c_parallel/train.py                  # a local cluster of 2 CPU slots
    python examples/a2c_parallel/train.py --actors 4 --seed 2
    xparl start --port 8010 --cpu_num 4                    # or an existing cluster
    python examples/a2c_parallel/train.py --address localhost:8010 --actors 4

Writes a TensorBoard summary, the learner's agent and a learning curve into `--logdir`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import gymnasium as gym

import parl
from parl.algorithms import A2C
from parl.samplers import ParallelSampler
from parl.utils import logger, parse_args
from parl_algos.agents import ActorCriticAgent
from parl_algos.nets import ActorCriticMLP
from parl_algos.training import OnPolicyArgs, TrainingRun


@dataclass
class Args(OnPolicyArgs):
    actors: int = 2
    """Worker actors, each stepping --num-envs environments with its own copy of the model."""
    address: str | None = None
    """HOST:PORT of a running cluster (`xparl start`); default: a local one of --actors slots."""
    num_envs: int = 8
    """Environments each worker steps (a round's batch: actors x num-envs x n-steps samples)."""
    lr: float = 1e-3
    total_steps: int = 300_000
    eval_every: int = 25_000
    target_return: float | None = 475.0
    stop_at_target: bool = True
    logdir: str = "train_log/a2c_parallel"


def make_agent(
    args: Args, observation_space: gym.Space, action_space: gym.Space
) -> ActorCriticAgent:
    """The learner's agent (the sampler sends each worker a copy of it)."""
    hidden = (args.hidden_size, args.hidden_size)
    model = ActorCriticMLP(observation_space.shape[0], action_space.n, hidden)
    alg = A2C(
        model,
        lr=args.lr,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
    )
    return ActorCriticAgent(alg, gamma=args.gamma, gae_lambda=args.gae_lambda)


def main(args: Args) -> dict:
    title, eval_env = f"A2C on {args.env_id}, {args.actors} remote actors", gym.make(args.env_id)
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    if args.address is None:
        parl.connect(cpu_num=args.actors)  # a local cluster, stopped when this process exits
    else:
        parl.connect(args.address)
    agent = make_agent(args, eval_env.observation_space, eval_env.action_space)  # the learner's
    env_fn = functools.partial(gym.make, args.env_id)
    with ParallelSampler(
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
            sampler.sync_weights()  # the learner's weights to every worker's copy
            b = agent.advantages(sampler.collect().to_trajectory())
            stats = agent.alg.learn(b.obs, b.action, b.advantage, b.value_target)
            run.record(sampler.env_steps, sampler.episodes(), stats)
            run.maybe_evaluate(agent.predict)
    return run.finish(agent)


if __name__ == "__main__":
    main(parse_args(Args))
