"""Evolution strategies on CartPole-v1, the population evaluated by remote actors.

OpenAI-ES (`parl.evo`, BASIC_ES with Adam) searches the weights of a small numpy policy
(observation -> tanh hidden layer -> the argmax of two logits). Each generation the learner
names a population of perturbations, remote actors play one episode per candidate, and the
learner updates the search distribution from the rewards.

What crosses the wire, and how the actors keep up:

- Every actor holds a replica of the learner's `ESAgent`, built from the same `Args` (the same
  config, the same starting weights). The learner sends each actor `SamplingInfo`s (a noise key,
  a sign, the parameter version: three integers each); the actor regenerates the noise, rebuilds
  the candidate around its replica's weights of that version, and answers with the episode's
  return and length. Nothing the size of the model ever travels.
- Weights are synchronized by the update rule, not broadcast: after a generation the learner
  sends every actor the generation's infos and rewards, and each replica makes the same
  `update` the learner made. `GaussianES.tell` accumulates in a fixed order with elementwise
  float64 arithmetic, so every replica holds the learner's weights bit for bit; each replica
  answers its update with a digest of its weights, and the learner checks it. A candidate whose
  version a replica does not hold is refused (`SampleError`) rather than evaluated around the
  wrong weights. The messages per generation grow with the population, not with the model, and
  each actor's update costs what the learner's does (regenerating the population's noise).
- Candidates go out in small chunks to whichever actor is free (awaitable calls, two in flight
  per actor), so long and short episodes balance out. Which actor plays a candidate changes
  nothing: its episode starts from a state seeded by its noise key (a mirrored pair starts from
  the same state), so a run with a given `--seed` is the same, bit for bit, with 1 or 100
  actors; only the wall time changes.

    python examples/es/cartpole.py                    # a local cluster, one actor per core
    python examples/es/cartpole.py --actors 2 --seed 3
    xparl start --port 8010 --cpu_num 8               # or an existing cluster
    python examples/es/cartpole.py --address localhost:8010 --actors 8

It stops once an evaluation averages 475 or more; `benchmarks/results/es.json` holds how many
generations and seconds that took, seed by seed.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

import parl
from parl.evo import ESAgent, SamplingInfo
from parl.utils import logger, parse_args, progress_bar, summary


@dataclass
class Args:
    seed: int = 1
    """Seed of the starting weights, the noise keys and the evaluation episodes."""
    actors: int | None = None
    """Remote actors playing episodes (default: one per vacant CPU slot of the cluster)."""
    address: str | None = None
    """HOST:PORT of an existing cluster (`xparl start`); default: start a local one."""
    generations: int = 200
    """The most generations to run."""
    population_size: int = 32
    """Candidates per generation (mirrored pairs, so even)."""
    sigma: float = 0.1
    """Standard deviation of the weight perturbations."""
    lr: float = 0.05
    """Adam learning rate of the ES update."""
    hidden_size: int = 16
    """Width of the policy's hidden layer."""
    chunk_size: int | None = None
    """Candidates per remote call, each to whichever actor is free (default: 16 calls an actor)."""
    eval_every: int = 5
    """Evaluate the unperturbed weights every this many generations."""
    eval_episodes: int = 10
    """Episodes per periodic evaluation (on the actors)."""
    final_eval_episodes: int = 100
    """Episodes of the final evaluation (CartPole-v1 counts as solved at a mean of 475 over 100)."""
    target_return: float | None = 475.0
    """Stop once an evaluation's mean return reaches this (`none`: run every generation)."""
    logdir: str = "train_log/es_cartpole"
    """Where the summary, the log and the solver state go."""


class MlpPolicy:
    """A flat float64 weight vector acting as observation -> tanh hidden layer -> argmax action."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_size: int) -> None:
        self.shapes = [(hidden_size, obs_dim), (hidden_size,), (act_dim, hidden_size), (act_dim,)]
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        self.dim = sum(self.sizes)

    def initial_weights(self, seed: int) -> np.ndarray:
        """Hidden layer N(0, 1/fan_in), output layer zero: every perturbation acts differently."""
        w1 = np.random.default_rng(seed).standard_normal(self.sizes[0]) / np.sqrt(self.shapes[0][1])
        return np.concatenate([w1, np.zeros(self.dim - self.sizes[0])])

    def bind(self, weights: np.ndarray) -> Callable[[np.ndarray], int]:
        """The policy of these weights as `act(obs) -> action` (unpacked once, not per step)."""
        w1, b1, w2, b2 = (
            part.reshape(shape)
            for part, shape in zip(
                np.split(weights, np.cumsum(self.sizes)[:-1]), self.shapes, strict=True
            )
        )
        return lambda obs: int(np.argmax(w2 @ np.tanh(w1 @ obs + b1) + b2))

    def __call__(self, weights: np.ndarray, obs: np.ndarray) -> int:
        return self.bind(weights)(obs)


def make_agent(args: Args) -> tuple[ESAgent, MlpPolicy]:
    """The learner's agent, and every actor's replica of it: same config, same start."""
    env = gym.make("CartPole-v1")
    policy = MlpPolicy(env.observation_space.shape[0], env.action_space.n, args.hidden_size)
    env.close()
    config = {
        "seed": args.seed,
        "solver": {"type": "BASIC_ES", "population_size": args.population_size},
        "gaussian_sampling": {"std": args.sigma, "cached": False},  # noise drawn from seeds
        "optimizer": {"type": "Adam", "base_lr": args.lr},
    }
    agent = ESAgent(config, model=policy.initial_weights(args.seed), policy=policy)
    return agent, policy


def weights_digest(agent: ESAgent) -> int:
    """A checksum of the agent's unperturbed weights (equal digests: equal bits)."""
    return zlib.crc32(agent.get_weights().tobytes())


def run_episode(env: gym.Env, act: Callable[[np.ndarray], int], seed: int) -> tuple[float, int]:
    """Play one episode from the start state that `seed` picks; return its return and length."""
    obs, _ = env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, _ = env.step(act(obs))
        total += float(reward)
        steps += 1
        if terminated or truncated:
            return total, steps


@parl.remote_class
class Evaluator:
    """An actor: a replica of the learner's agent and an environment to play episodes in."""

    def __init__(self, args: Args) -> None:
        self.agent, self.policy = make_agent(args)
        self.env = gym.make("CartPole-v1")

    def rewards(self, infos: list[SamplingInfo]) -> list[tuple[float, int]]:
        """One episode per candidate, from the start state its noise key seeds."""
        solver = self.agent.solver
        return [
            run_episode(self.env, self.policy.bind(solver.candidate(info)), info.key)
            for info in infos
        ]

    def evaluate(self, seeds: list[int]) -> list[tuple[float, int]]:
        """Episodes of the unperturbed weights, one from each seeded start state."""
        act = self.policy.bind(self.agent.get_weights())
        return [run_episode(self.env, act, seed) for seed in seeds]

    def update(self, infos: list[SamplingInfo], rewards: list[float]) -> int:
        """Make the learner's update on this replica; return the digest of the new weights."""
        self.agent.update(infos, rewards)
        return weights_digest(self.agent)


async def scatter(
    actors: Sequence[Any],
    call: Callable[[Any, list], Awaitable[list]],
    items: list,
    chunk_size: int | None,
) -> list:
    """`call(actor, chunk)` over `items` in chunks, each to whichever actor is free.

    Two calls are in flight per actor, so an actor never waits for a round trip. Without a
    `chunk_size`, each actor gets about sixteen chunks: the last one to finish holds up the
    generation, so they are small (an episode or two), and with two in flight their round
    trips cost nothing. Results come in the order of `items`.
    """
    chunk_size = chunk_size or max(1, math.ceil(len(items) / (16 * len(actors))))
    starts = deque(range(0, len(items), chunk_size))
    results: list = [None] * len(items)

    async def feed(actor: Any) -> None:
        while starts:
            start = starts.popleft()
            results[start : start + chunk_size] = await call(
                actor, items[start : start + chunk_size]
            )

    # One feeder per actor first, then the second ones: the first chunks go to distinct actors.
    await asyncio.gather(*(feed(actor) for _ in range(2) for actor in actors))
    return results


async def run_generation(
    agent: ESAgent, actors: Sequence[Any], rng: np.random.Generator, chunk_size: int | None
) -> tuple[list[float], int]:
    """One generation: name a population, play it on the actors, update learner and replicas.

    Returns the population's rewards and the env steps it took.
    """
    infos = agent.solver.ask(rng)
    played = await scatter(actors, lambda a, chunk: a.rewards(chunk), infos, chunk_size)
    rewards = [ret for ret, _ in played]
    agent.update(infos, rewards)
    digests = await asyncio.gather(*(actor.update(infos, rewards) for actor in actors))
    expected = weights_digest(agent)
    if any(digest != expected for digest in digests):
        raise RuntimeError(
            f"replica weights diverged from the learner's at version {agent.solver.version} "
            f"(digests {digests}, learner {expected}); the actors must run the same parl-evo "
            "and numpy as the learner"
        )
    return rewards, sum(steps for _, steps in played)


async def evaluate(
    actors: Sequence[Any], rng: np.random.Generator, episodes: int, chunk_size: int | None
) -> tuple[float, int]:
    """Mean return of the unperturbed weights over `episodes` fresh start states, and its steps."""
    seeds = [int(s) for s in rng.integers(0, 2**31, size=episodes)]
    played = await scatter(actors, lambda a, chunk: a.evaluate(chunk), seeds, chunk_size)
    return float(np.mean([ret for ret, _ in played])), sum(steps for _, steps in played)


async def train(args: Args, n_actors: int) -> dict:
    """Create the actors, run generations until the target or the budget, evaluate, save."""
    agent, _ = make_agent(args)
    actors = await asyncio.gather(*(Evaluator.aio(args) for _ in range(n_actors)))
    logger.info(
        "%d actors ready; %d weights, %d candidates a generation",
        n_actors,
        agent.solver.dim,
        agent.population_size,
    )
    key_rng = np.random.default_rng(args.seed)  # names every population
    eval_rng = np.random.default_rng(args.seed + 10_000)  # picks the evaluation start states

    env_steps = eval_steps = 0
    best: float | None = None
    reached_at, generation = None, 0
    start = time.perf_counter()
    bar = progress_bar(range(1, args.generations + 1), desc="generations", unit="gen")
    for generation in bar:
        rewards, steps = await run_generation(agent, actors, key_rng, args.chunk_size)
        env_steps += steps
        summary.add_scalar("rollout/reward_mean", float(np.mean(rewards)), env_steps)
        summary.add_scalar("rollout/reward_max", float(np.max(rewards)), env_steps)
        summary.add_scalar(
            "time/env_steps_per_s", env_steps / (time.perf_counter() - start), env_steps
        )
        bar.set_postfix(reward=f"{np.mean(rewards):.1f}", steps=env_steps)
        if generation % args.eval_every == 0:
            mean_return, steps = await evaluate(
                actors, eval_rng, args.eval_episodes, args.chunk_size
            )
            eval_steps += steps
            best = mean_return if best is None else max(best, mean_return)
            summary.add_scalar("eval/mean_return", mean_return, env_steps)
            logger.info(
                "generation %d, env steps %d: evaluation mean return %.1f",
                generation,
                env_steps,
                mean_return,
            )
            if args.target_return is not None and mean_return >= args.target_return:
                reached_at = generation
                break
    bar.close()
    seconds = time.perf_counter() - start

    final_return = None
    if args.final_eval_episodes:
        final_return, steps = await evaluate(
            actors, eval_rng, args.final_eval_episodes, args.chunk_size
        )
        eval_steps += steps
        summary.add_scalar("eval/final_mean_return", final_return, env_steps)
        logger.info(
            "final evaluation: mean return %.1f over %d episodes",
            final_return,
            args.final_eval_episodes,
        )
    agent.save_solver(os.path.join(args.logdir, "solver.npz"))
    summary.flush()
    return {
        "seed": args.seed,
        "actors": n_actors,
        "generations": generation,
        "env_steps": env_steps,
        "eval_env_steps": eval_steps,
        "best_eval_return": best,
        "final_eval_return": final_return,
        "reached_target_at_generation": reached_at,
        "seconds": round(seconds, 2),
        "weights_digest": weights_digest(agent),
    }


def main(args: Args) -> dict:
    logger.set_dir(args.logdir)
    summary.set_dir(args.logdir)
    logger.info("es cartpole: %s", args)
    if args.address is None:
        client = parl.connect(cpu_num=args.actors)
    else:
        client = parl.connect(args.address)
    n_actors = args.actors or max(1, client.status()["totals"]["cpu_vacant"])
    result = asyncio.run(train(args, n_actors))
    logger.info("done: %s; outputs in %s", result, args.logdir)
    return result


if __name__ == "__main__":
    main(parse_args(Args))
