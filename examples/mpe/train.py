"""MADDPG and MAPPO on the multi-agent particle environments, against independent learners.

`--algo maddpg` trains `parl.algorithms.MADDPG` (a centralized critic per agent over every
agent's observation and action, decentralized actors, Gumbel-softmax for MPE's five discrete
moves, the paper's hyperparameters: lr 1e-2, gamma 0.95, tau 0.01, batch 1024); `--algo mappo`
trains `parl.algorithms.MAPPO` (one actor shared by the agents, fed their ids, and a value
function on the global state; `--value-norm` standardises its targets by running statistics, as
the MAPPO paper does; `--separate-optimizers` steps the actor and the critic with an Adam each,
each clipping its own gradient's norm, as it does too). `--independent` gives each the same
budget without centralization: critics on the agent's own observation and action (independent
DDPG) or a value on its own observation (independent PPO). Environments come from `mpe2`,
PettingZoo's particle environments: `simple_spread` (3 agents cover 3 landmarks without
colliding), `simple_adversary` (2 good agents and 1 adversary) and `simple_speaker_listener`
(a speaker that sees the goal landmark's colour but cannot move, 3 actions: what it says; a
listener that moves, 5 actions, and hears only the speaker; each agent's observation misses what
the other's holds, while a centralized critic or value sees both). Returns are episode sums of
each agent's rewards; the result reports the greedy policy's after training and a uniformly
random policy's (means over all agents, over the good agents and over the adversaries), and the
mean over agents of the first and of the last 50 training episodes. On `simple_adversary` each
side's return is also a matter of the other side's skill; `--cross-play` trains both the
centralized learner and its independent twin and sets the good agents of each against the
adversary of each, the MADDPG paper's comparison (a better learner's good agents earn more
against the same adversary, its adversary more against the same good agents).

    python examples/mpe/train.py --algo maddpg
    python examples/mpe/train.py --algo mappo --env simple_adversary
    python examples/mpe/train.py --algo maddpg --independent
    python examples/mpe/train.py --algo mappo --value-norm
    python examples/mpe/train.py --algo mappo --separate-optimizers
    python examples/mpe/train.py --algo maddpg --env simple_adversary --cross-play
    python examples/mpe/train.py --algo mappo --env simple_speaker_listener
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
from pettingzoo.utils.conversions import aec_to_parallel

from parl.algorithms import MADDPG, MAPPO
from parl.utils import logger, parse_args
from parl_algos.functional import gae
from parl_algos.maddpg import MultiAgentActorCriticMLP
from parl_algos.mappo import MultiAgentPPOMLP, pack_agent_inputs
from parl_algos.multiagent import MultiAgentReplayMemory, ParallelEnvArrays

ENVS = {
    "simple_spread": "simple_spread_v3",
    "simple_adversary": "simple_adversary_v3",
    "simple_speaker_listener": "simple_speaker_listener_v4",
}


@dataclass
class Args:
    algo: str = "maddpg"
    """`maddpg` or `mappo`."""
    independent: bool = False
    """Train the baseline instead: independent DDPG (`maddpg`) or independent PPO (`mappo`)."""
    env: str = "simple_spread"
    """`simple_spread` (3 agents), `simple_adversary` or `simple_speaker_listener`."""
    max_cycles: int = 25
    """Steps per episode."""
    total_steps: int = 50_000
    """Env steps to train for (each step moves every agent)."""
    seed: int = 1
    """Seed of the environments, torch and numpy."""
    hidden_size: int = 64
    """Width of the two hidden layers of every network."""
    lr: float | None = None
    """Learning rate (default: 1e-2 for MADDPG, 7e-4 for MAPPO)."""
    gamma: float | None = None
    """Discount factor (default: 0.95 for MADDPG, 0.99 for MAPPO)."""
    batch_size: int = 1024
    """MADDPG: transitions per update."""
    learning_starts: int = 1000
    """MADDPG: random steps before learning starts."""
    train_freq: int = 25
    """MADDPG: env steps between two updates."""
    num_envs: int = 8
    """MAPPO: environments played per iteration, one episode each."""
    update_epochs: int = 10
    """MAPPO: passes over each batch."""
    value_norm: bool = False
    """MAPPO: standardise the value targets by their running statistics (the paper's setting)."""
    separate_optimizers: bool = False
    """MAPPO: one Adam for the actor and one for the critic, each with its own gradient-norm
    clip (the paper's setting), instead of one Adam and one clip over both."""
    eval_episodes: int = 20
    """Greedy episodes of the evaluations before and after training."""
    cross_play: bool = False
    """`simple_adversary`: train the centralized learner and its independent twin (`--independent`
    is ignored), then evaluate the good agents of each against the adversary of each."""
    torch_threads: int = 1
    """Torch intra-op threads."""


def make_env(args: Args, **kwargs) -> ParallelEnvArrays:
    if args.env not in ENVS:
        raise ValueError(f"{args.env=} must be one of {sorted(ENVS)}")
    module = importlib.import_module(f"mpe2.{ENVS[args.env]}")
    # The raw environment without PettingZoo's checking wrappers: twice as fast a step, and
    # the actions given here are always valid.
    return ParallelEnvArrays(aec_to_parallel(module.raw_env(max_cycles=args.max_cycles, **kwargs)))


def evaluate(env: ParallelEnvArrays, act, episodes: int, seed: int) -> np.ndarray:
    """Per-agent mean return of `act(env, obs_list) -> actions` over seeded episodes."""
    returns = np.zeros(env.n_agents)
    for episode in range(episodes):
        obs, done = env.reset(seed=seed + episode), False
        while not done:
            obs, reward, terminated, truncated = env.step(act(env, obs))
            returns += reward
            done = bool(np.all(terminated | truncated))
    return returns / episodes


def summarize(env: ParallelEnvArrays, per_agent: np.ndarray) -> dict:
    adversary = np.array(["adversary" in a for a in env.agents])
    out = {"all": float(per_agent.mean())}
    if adversary.any():
        out["good"] = float(per_agent[~adversary].mean())
        out["adversary"] = float(per_agent[adversary].mean())
    return out


def train_maddpg(args: Args, env: ParallelEnvArrays, rng: np.random.Generator):
    n_actions = [space.n for space in env.action_spaces]
    model = MultiAgentActorCriticMLP(
        env.obs_dims, n_actions, (args.hidden_size,) * 2, centralized=not args.independent
    )
    alg = MADDPG(
        model,
        actor_lr=args.lr or 1e-2,
        critic_lr=args.lr or 1e-2,
        gamma=args.gamma or 0.95,
        seed=args.seed,
    )
    memory = MultiAgentReplayMemory(
        min(args.total_steps, 1_000_000), env.obs_dims, n_actions, seed=args.seed
    )

    def act(env, obs, explore=False):
        tensors = [torch.from_numpy(o).unsqueeze(0) for o in obs]
        actions = alg.sample(tensors) if explore else alg.predict(tensors)
        return [int(a[0].argmax()) for a in actions]

    obs, episode_return, returns = env.reset(seed=int(rng.integers(2**31))), 0.0, []
    for step in range(args.total_steps):
        if step < args.learning_starts:
            action = [int(rng.integers(n)) for n in n_actions]
        else:
            action = act(env, obs, explore=True)
        next_obs, reward, terminated, truncated = env.step(action)
        one_hot = [np.eye(n, dtype=np.float32)[a] for n, a in zip(n_actions, action, strict=True)]
        memory.append(obs, one_hot, reward, next_obs, terminated)
        obs, episode_return = next_obs, episode_return + float(reward.mean())
        if np.all(terminated | truncated):
            obs = env.reset(seed=int(rng.integers(2**31)))
            returns.append(episode_return)
            episode_return = 0.0
        if step >= args.learning_starts and step % args.train_freq == 0:
            alg.learn(*memory.sample(args.batch_size))
    return act, returns


def train_mappo(args: Args, env: ParallelEnvArrays, rng: np.random.Generator):
    n_actions = [space.n for space in env.action_spaces]
    model = MultiAgentPPOMLP(
        env.max_obs_dim,
        env.state_dim,
        env.n_agents,
        n_actions,
        (args.hidden_size,) * 2,
        centralized=not args.independent,
    )
    T, E, N = args.max_cycles, args.num_envs, env.n_agents
    alg = MAPPO(
        model,
        lr=args.lr or 7e-4,
        update_epochs=args.update_epochs,
        minibatch_size=T * E * N,
        value_norm=args.value_norm,
        separate_optimizers=args.separate_optimizers,
        seed=args.seed,
    )
    gamma = args.gamma or 0.99
    envs = [env] + [make_env(args) for _ in range(E - 1)]

    def act(env, obs):
        rows = pack_agent_inputs(torch.from_numpy(env.stack(obs)), torch.from_numpy(env.state()))
        return alg.predict(rows).tolist()

    returns = []
    for _ in range(max(1, args.total_steps // (T * E))):
        obs = np.zeros((T + 1, E, N, env.max_obs_dim), np.float32)
        state = np.zeros((T + 1, E, env.state_dim), np.float32)
        action = torch.zeros((T, E, N), dtype=torch.int64)
        reward = np.zeros((T, E, N), np.float32)
        terminated = np.zeros((T, E, N), np.float32)
        done = np.zeros((T, E, N), np.float32)
        for e, env_e in enumerate(envs):
            obs[0, e] = env_e.stack(env_e.reset(seed=int(rng.integers(2**31))))
            state[0, e] = env_e.state()
        for t in range(T):
            rows = pack_agent_inputs(torch.from_numpy(obs[t]), torch.from_numpy(state[t]))
            action[t] = alg.sample(rows)
            for e, env_e in enumerate(envs):
                o, r, term, trunc = env_e.step(action[t, e].tolist())
                obs[t + 1, e], state[t + 1, e] = env_e.stack(o), env_e.state()
                reward[t, e], terminated[t, e], done[t, e] = r, term, term | trunc
        returns.extend(reward.sum(0).mean(-1).tolist())  # one episode per environment
        b_obs, b_state = torch.from_numpy(obs), torch.from_numpy(state)
        with torch.no_grad():
            values = alg.value(pack_agent_inputs(b_obs, b_state))
            log_prob = alg.distribution(pack_agent_inputs(b_obs[:-1], b_state[:-1])).log_prob(
                action
            )
        advantage = gae(
            torch.from_numpy(reward),
            values[:-1],
            values[1:],
            torch.from_numpy(terminated),
            torch.from_numpy(done),
            gamma,
            0.95,
        )
        alg.learn(
            b_obs[:-1].flatten(0, 1),
            b_state[:-1].flatten(0, 1),
            action.flatten(0, 1),
            advantage.flatten(0, 1),
            (advantage + values[:-1]).flatten(0, 1),
            values[:-1].flatten(0, 1),
            log_prob.flatten(0, 1),
        )
    return act, returns


def train_and_evaluate(args: Args):
    """Seed everything, train one learner and evaluate it: `(its act function, its result)`."""
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    env, eval_env = make_env(args), make_env(args)
    name = {
        ("maddpg", False): "MADDPG",
        ("maddpg", True): "independent DDPG",
        ("mappo", False): "MAPPO",
        ("mappo", True): "independent PPO",
    }[args.algo, args.independent]
    uniform = evaluate(
        eval_env,
        lambda env, obs: [int(rng.integers(s.n)) for s in env.action_spaces],
        args.eval_episodes,
        seed=10_000,
    )
    start = time.perf_counter()
    train = train_maddpg if args.algo == "maddpg" else train_mappo
    act, returns = train(args, env, rng)
    seconds = time.perf_counter() - start
    final = evaluate(eval_env, act, args.eval_episodes, seed=10_000)
    result = {
        "algo": name,
        "env": args.env,
        "seed": args.seed,
        "total_steps": args.total_steps,
        "value_norm": args.value_norm,
        "separate_optimizers": args.separate_optimizers,
        "random_return": summarize(eval_env, uniform),
        "final_return": summarize(eval_env, final),
        "train_return_first": float(np.mean(returns[:50])) if returns else None,
        "train_return_last": float(np.mean(returns[-50:])) if returns else None,
        "train_seconds": round(seconds, 1),
    }
    logger.info(
        "%s on %s, %d steps (%.0f s): greedy return %s (uniformly random policy: %s); "
        "training episodes: first 50 %s, last 50 %s",
        name, args.env, args.total_steps, seconds, result["final_return"], result["random_return"],
        result["train_return_first"], result["train_return_last"],
    )  # fmt: skip
    return act, result


def cross_play(args: Args) -> dict:
    """Train a centralized learner and its independent twin, then cross their teams.

    On `simple_adversary`, the good agents of each meet the adversary of each, as in the MADDPG
    paper's comparison.
    """
    if args.env != "simple_adversary":
        raise ValueError(f"--cross-play needs a task with adversaries, not {args.env=}")
    acts, learners = {}, []
    for independent in (False, True):
        one = dataclasses.replace(args, independent=independent, cross_play=False)
        act, result = train_and_evaluate(one)
        acts[result["algo"]] = act
        learners.append(result)
    eval_env = make_env(args)
    good = ["adversary" not in agent for agent in eval_env.agents]
    matches = {}
    for good_name, good_act in acts.items():
        for adversary_name, adversary_act in acts.items():

            def act(env, obs, good_act=good_act, adversary_act=adversary_act):
                ours, theirs = good_act(env, obs), adversary_act(env, obs)
                return [o if g else t for o, t, g in zip(ours, theirs, good, strict=True)]

            returns = evaluate(eval_env, act, args.eval_episodes, seed=10_000)
            matches[f"{good_name} vs {adversary_name}"] = summarize(eval_env, returns)
            logger.info(
                "good agents of %s against the adversary of %s: %s",
                good_name, adversary_name, matches[f"{good_name} vs {adversary_name}"],
            )  # fmt: skip
    return {"learners": learners, "cross_play": matches}


def main(args: Args) -> dict:
    if args.algo not in ("maddpg", "mappo"):
        raise ValueError(f"{args.algo=} must be 'maddpg' or 'mappo'")
    if args.cross_play:
        return cross_play(args)
    return train_and_evaluate(args)[1]


if __name__ == "__main__":
    main(parse_args(Args))
