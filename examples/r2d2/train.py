"""R2D2 on CartPole-v1 with the velocities masked out: memory needed, actors on the cluster.

The observation keeps the cart's position and the pole's angle only (`--mask-velocity`, the
default), so a policy must infer both velocities from what it saw before: a recurrent
Q-network (`parl_algos.r2d2.RecurrentQNetwork`, an LSTM) learns from sequences replayed by
priority (`SequenceReplayMemory`), each starting from the recurrent state its actor had, with
`--burn-in` steps that only warm that state up, n-step double-Q targets on rescaled values, and
priorities mixing the maximum and mean TD error of a sequence (Kapturowski et al. 2019).

`--actors N` remote actors (a local cluster of N slots, or `--address HOST:PORT`) each step
`--envs-per-actor` environments with their own exploration rate (Ape-X's `0.4 ** (1 + 7 i /
(n - 1))` over all environments) and a copy of the learner's network, and send back finished
sequences with initial priorities; the learner stores them, learns, and sends its weights back
every `--sync-every` updates. `--actors 0` runs one actor in this process.

    python examples/r2d2/train.py                      # 2 remote actors on a local cluster
    python examples/r2d2/train.py --actors 0           # everything in this process
    python examples/r2d2/train.py --no-mask-velocity   # the full observation

Stops once the mean return of the last 10 training episodes reaches --target-return; writes a
TensorBoard summary, the learner's agent and a learning curve into --logdir.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import gymnasium as gym

import parl
from parl.utils import logger, parse_args
from parl_algos.r2d2 import (
    R2D2,
    ActorOutput,
    FeedForwardQNetwork,
    GreedyPolicy,
    R2D2Actor,
    R2D2Agent,
    R2D2Args,
    RecurrentQNetwork,
    RemoteR2D2Actor,
    StateReset,
    apex_epsilons,
)
from parl_algos.rollout import Episode, MaskVelocity
from parl_algos.sequence_replay import SequenceReplayMemory
from parl_algos.training import RunArgs, TrainingRun


@dataclass
class Args(R2D2Args, RunArgs):
    mask_velocity: bool = True
    """Hide CartPole's two velocities from the observation (a partially observable task)."""
    actors: int = 2
    """Remote actors (0: one actor in this process)."""
    address: str | None = None
    """HOST:PORT of a running cluster (`xparl start`); default: a local one of --actors slots."""
    total_steps: int = 100_000
    eval_every: int = 10_000
    target_return: float | None = 100.0
    stop_at_target: bool = True
    logdir: str = "train_log/r2d2"


def make_env(env_id: str, mask_velocity: bool) -> gym.Env:
    """The task: `env_id`, with CartPole's velocities masked out when asked."""
    env = gym.make(env_id)
    return MaskVelocity(env) if mask_velocity else env


def make_agent(args: Args, observation_space: gym.Space, action_space: gym.Space) -> R2D2Agent:
    """The learner's agent (each actor gets a copy)."""
    obs_dim, n_actions = observation_space.shape[0], action_space.n
    if args.memory:
        model = RecurrentQNetwork(obs_dim, n_actions, args.hidden_size, args.lstm_size)
    else:
        model = FeedForwardQNetwork(obs_dim, n_actions, args.hidden_size)
    alg = R2D2(
        model,
        lr=args.lr,
        gamma=args.gamma,
        n_step=args.n_step,
        burn_in=args.burn_in,
        eta=args.eta,
    )
    return R2D2Agent(alg, action_space.n, seed=args.seed)


def main(args: Args) -> dict:
    env_fn = functools.partial(make_env, args.env_id, args.mask_velocity)
    probe = env_fn()
    title = f"R2D2 on {args.env_id}" + (" (velocities masked)" if args.mask_velocity else "")
    title += "" if args.memory else ", feed-forward network"
    agent = make_agent(args, probe.observation_space, probe.action_space)
    policy = GreedyPolicy(agent)
    eval_env = StateReset(env_fn(), policy)
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    memory = SequenceReplayMemory(
        args.buffer_size,
        args.burn_in + args.learn_len,
        probe.observation_space.shape,
        agent.alg.model.state_size,
        alpha=args.alpha,
        beta=args.beta,
        beta_steps=max(args.total_steps // 4, 1),
        seed=args.seed,
    )
    n_actors = max(args.actors, 1)
    epsilons = apex_epsilons(n_actors * args.envs_per_actor, args.eps_base, args.eps_alpha)
    if args.actors and args.address is None:
        parl.connect(cpu_num=args.actors)  # a local cluster, stopped when this process exits
    elif args.actors:
        parl.connect(args.address)
    actor_cls = RemoteR2D2Actor if args.actors else R2D2Actor
    actors = [
        actor_cls(
            env_fn,
            agent,  # a copy of the learner's agent
            epsilons[i * args.envs_per_actor : (i + 1) * args.envs_per_actor].tolist(),
            burn_in=args.burn_in,
            learn_len=args.learn_len,
            seed=args.seed * 1000 + i * args.envs_per_actor,
        )
        for i in range(n_actors)
    ]
    logger.info("%d actors ready, %d environments each", len(actors), args.envs_per_actor)
    stats, env_steps, updates = None, 0, 0
    pending = [a.collect(args.collect_steps) for a in actors] if args.actors else []
    run.start()
    i = 0
    while env_steps < args.total_steps and not run.done:
        if args.actors:  # take actor i's finished call, and queue its next one at once
            out: ActorOutput = pending[i].get()
            pending[i] = actors[i].collect(args.collect_steps)
        else:
            out = actors[0].collect(args.collect_steps)
        for record, priority in zip(out.records, out.priorities, strict=True):
            memory.append(record, priority)
        episodes = []
        for ret, length in out.episodes:
            episodes.append(Episode(env_steps + out.env_steps, ret, length))
        env_steps += out.env_steps
        if len(memory) >= args.learning_starts and out.records:
            for _ in range(args.updates_per_collect):
                stats = agent.learn(memory, args.batch_size)
                updates += 1
                if updates % args.target_update_interval == 0:
                    agent.alg.sync_target()
                if updates % args.sync_every == 0:
                    weights = agent.get_weights()
                    for actor in actors:
                        actor.set_weights(weights)  # after the call under way (calls keep order)
        run.record(env_steps, episodes, stats)
        run.maybe_evaluate(policy)
        i = (i + 1) % len(actors)
    for future in pending:
        future.get()
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))
