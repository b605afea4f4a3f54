"""IMPALA on remote actors: CartPole-v1 learned from trajectories that arrive asynchronously.

Each actor (`@parl.remote_class`) steps its own vector of `--num-envs` environments with its own
copy of the policy and returns trajectories of `--n-steps` steps, together with the logits of
the policy that chose each action. The learner never waits for all actors: it keeps
`--calls-per-actor` calls in flight on each actor (awaitable calls, `actor.aio`), takes
whichever trajectory arrives first, makes one V-trace update from it, and sends its fresh
weights back to the actor that delivered, with that actor's next call. Meanwhile the actor is
already running its other call, with the weights that came with it: trajectories are a few
updates stale, and V-trace corrects for it, as in PARL's IMPALA example and the paper.

    python examples/impala/train.py                        # a local cluster of 2 CPU slots
    python examples/impala/train.py --actors 4 --seed 2
    xparl start --port 8010 --cpu_num 4                    # or an existing cluster
    python examples/impala/train.py --address localhost:8010 --actors 4

Training stops once the mean return of the last 10 episodes reaches 475. Writes a TensorBoard
summary (with `train/mean_rho`, the mean importance weight: how far the actors lag), the
learner's agent and a learning curve into `--logdir`.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np

import parl
from parl.algorithms import IMPALA
from parl.utils import logger, parse_args
from parl_algos.agents import IMPALAAgent
from parl_algos.nets import ActorCriticMLP
from parl_algos.rollout import Episode, Trajectory
from parl_algos.training import RunArgs, TrainingRun, actor_collector


@dataclass
class Args(RunArgs):
    actors: int = 2
    """Remote actors, each stepping --num-envs environments with its own copy of the policy."""
    address: str | None = None
    """HOST:PORT of a running cluster (`xparl start`); default: a local one of --actors slots."""
    num_envs: int = 8
    """Environments each actor steps (a trajectory's width B)."""
    n_steps: int = 20
    """Steps per environment in a trajectory (its length T)."""
    calls_per_actor: int = 2
    """Trajectory calls kept in flight on each actor (2: it never waits for the learner)."""
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
    """The learner's agent, and each actor's copy of it."""
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


@parl.remote_class
class Actor:
    """Steps `num_envs` environments with its copy of the policy; returns trajectories."""

    def __init__(self, args: Args, index: int) -> None:
        self.collector = actor_collector(args, index, args.num_envs)  # seeded apart from others
        envs = self.collector.envs
        self.agent = make_agent(args, envs.single_observation_space, envs.single_action_space)
        self.n_steps = args.n_steps

    def sample(self, weights: dict[str, np.ndarray]) -> tuple[Trajectory, list[Episode]]:
        """Load `weights`, collect one trajectory; return it and the episodes that ended."""
        self.agent.set_weights(weights)
        trajectory = self.collector.collect(self.n_steps, self.agent.sample)
        return trajectory, self.collector.pop_episodes()


async def learn_from_actors(run: TrainingRun, agent: IMPALAAgent, args: Args) -> None:
    """Create the actors, then learn from their trajectories in the order they arrive."""
    actors = await asyncio.gather(*(Actor.aio(args, i) for i in range(args.actors)))
    logger.info("%d actors ready, %d environments each", args.actors, args.num_envs)
    run.start()
    in_flight: dict[asyncio.Future, object] = {}
    weights = agent.get_weights()
    for _ in range(args.calls_per_actor):
        for actor in actors:
            in_flight[actor.sample(weights)] = actor  # sent now; an actor runs them in order

    env_steps = 0
    while env_steps < args.total_steps and not run.done:
        arrived, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        for call in arrived:
            actor = in_flight.pop(call)
            trajectory, ended = call.result()
            stats = agent.learn(trajectory)
            env_steps += trajectory.reward.size
            # Each actor counts its own steps: the learner dates episodes by its own count.
            run.record(env_steps, [Episode(env_steps, e.ret, e.length) for e in ended], stats)
            run.maybe_evaluate(agent.predict)
            if env_steps >= args.total_steps or run.done:
                break  # whatever else arrived is gathered below, unused
            in_flight[actor.sample(agent.get_weights())] = actor  # fresh weights back
    await asyncio.gather(*in_flight)  # let the calls in flight finish before the actors go


def main(args: Args) -> dict:
    title, eval_env = f"IMPALA on {args.env_id}, {args.actors} remote actors", gym.make(args.env_id)
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    if args.address is None:
        parl.connect(cpu_num=args.actors)  # a local cluster, stopped when this process exits
    else:
        parl.connect(args.address)
    agent = make_agent(args, eval_env.observation_space, eval_env.action_space)  # the learner's
    asyncio.run(learn_from_actors(run, agent, args))
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
