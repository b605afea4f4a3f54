r"""Offline RL on Pendulum-v1: make a medium dataset with SAC, then learn BC, CQL and IQL from it.

No offline dataset can be downloaded here, so the example makes its own, as D4RL's "medium"
ones were made:

1. SAC trains online (the SAC example's settings) and its final policy's return is the
   expert's (`parl_algos.train.make_sac_dataset`, which `parl-train cql/pendulum` uses too).
2. A noisy copy of a SAC policy collects `--dataset-episodes` episodes into `dataset.npz`
   (an `OfflineDataset`, the six arrays of a plain `.npz`): it takes a uniformly random action
   with probability `--data-random`, else a draw of the SAC policy plus Gaussian noise of std
   `--data-noise` (the "imperfect demonstrations" of Fujimoto et al.'s BCQ paper,
   https://arxiv.org/abs/1812.02900, with more random steps). `--data-policy final` (the
   default) uses SAC's final policy; `medium` the snapshot (every `--snapshot-every` steps)
   whose noisy copy scores closest to `--medium-score` between a random policy (0) and the
   expert (1). Either way the data is of medium quality: with half the steps random, a noisy
   copy of any snapshot past 4.5k steps returns -610 to -750 (the expert -182), so the
   snapshot search mostly lands on a near-expert policy anyway. Gaussian noise alone makes no
   medium dataset on Pendulum: zero-mean noise averages out, so cloning the data recovers the
   near-expert policy and leaves offline RL nothing to improve on.
3. BC, CQL and IQL each learn `--offline-steps` gradient steps from that file alone, never
   touching the environment but to evaluate. CQL and IQL learn from the rewards times
   `--reward-scale` (0.1: Pendulum's rewards reach -16 a step, and its values -1600; IQL's
   paper normalises its datasets' rewards too). Without it IQL's advantage weights and
   CQL's penalty act on values a hundred times too large, and both ended level with BC.
   The final evaluation plays `--eval-episodes` (50) episodes from a fixed seed, the same
   for every learner and seed: ten episodes could not tell BC's clone from a swing-up.

Prints and writes (`results.json` in `--logdir`) the return of each policy, and the score
normalised between the random policy and the SAC expert.

    python examples/offline_pendulum/train.py                 # the measured run
    python examples/offline_pendulum/train.py --total-steps 1000 --offline-steps 200 \
        --dataset-episodes 3 --eval-episodes 2                # the fast path: a minute or so
    python examples/offline_pendulum/train.py --dataset train_log/offline_pendulum/dataset.npz
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

import torch

import parl
from parl.algorithms import BC, CQL, IQL
from parl.utils import OfflineDataset, logger, parse_args
from parl_algos.agents import ContinuousAgent
from parl_algos.nets import ContinuousActorCriticMLP, ValueMLP
from parl_algos.rollout import make_rescaled_env
from parl_algos.train import OfflineEnvSection, make_sac_dataset, scale_rewards
from parl_algos.training import OffPolicyArgs, TrainingRun, evaluate


@dataclass
class Args(OffPolicyArgs):
    env_id: str = "Pendulum-v1"
    total_steps: int = 8_000
    """Env steps of the online SAC run that makes the data."""
    eval_every: int = 0
    eval_episodes: int = 50
    """Episodes of each evaluation of the offline learners (the final one from fixed seeds)."""
    logdir: str = "train_log/offline_pendulum"
    tau: float = 0.005
    """Polyak rate of the target critics (SAC, CQL, IQL)."""
    data_policy: str = "final"
    """What collects the data: 'final' (SAC's last policy) or 'medium' (the snapshot whose
    noisy copy scores nearest `--medium-score`)."""
    snapshot_every: int = 500
    """'medium': keep SAC's weights every this many env steps."""
    medium_score: float = 0.5
    """'medium': the normalised score aimed at (0: random, 1: the SAC expert)."""
    data_noise: float = 0.3
    """Std of the Gaussian noise added to the data-collecting policy's actions."""
    data_random: float = 0.5
    """Probability that the data-collecting policy takes a uniformly random action instead."""
    dataset_episodes: int = 50
    """Episodes (of 200 steps) in the dataset."""
    dataset: str | None = None
    """An existing dataset .npz to learn from (skips SAC and collection)."""
    algorithms: str = "bc,cql,iql"
    """The offline learners to run, comma-separated."""
    offline_steps: int = 10_000
    """Gradient steps of each offline learner."""
    offline_eval_every: int = 2_500
    """Evaluate each offline learner every this many gradient steps (0: only at the end)."""
    offline_lr: float = 3e-4
    """Adam learning rate of the offline learners."""
    offline_hidden: int = 128
    """Width of the hidden layers of the offline learners' networks."""
    offline_batch_size: int = 256
    """Transitions per offline update."""
    cql_weight: float = 5.0
    """CQL's penalty weight."""
    cql_actions: int = 4
    """CQL's sampled actions of each kind per state (10 in the paper; fewer run faster)."""
    iql_expectile: float = 0.7
    """IQL's expectile."""
    iql_beta: float = 3.0
    """IQL's inverse temperature of the advantage weights."""
    reward_scale: float = 0.1
    """CQL and IQL learn from the dataset's rewards times this (`scale_rewards`)."""


EVAL_SEED = 100_000
"""The first reset's seed of every final evaluation: every learner and seed plays the same
episodes."""


def _sac_model(obs_dim: int, act_dim: int, width: int) -> ContinuousActorCriticMLP:
    hidden = (width, width)
    return ContinuousActorCriticMLP(obs_dim, act_dim, hidden, stochastic=True, twin=True)


def make_dataset(args: Args, path: str) -> dict:
    """Train SAC, collect the dataset into `path` (`make_sac_dataset`); return the returns."""
    env = OfflineEnvSection(
        id=args.env_id,
        sac_steps=args.total_steps,
        data_policy=args.data_policy,
        medium_score=args.medium_score,
        snapshot_every=args.snapshot_every,
        data_random=args.data_random,
        data_noise=args.data_noise,
        dataset_episodes=args.dataset_episodes,
    )
    return make_sac_dataset(env, path, seed=args.seed, logdir=os.path.join(args.logdir, "sac"))


def make_offline_algorithm(name: str, obs_dim: int, act_dim: int, args: Args) -> parl.Algorithm:
    """Build `bc`, `cql` or `iql` with the example's settings."""
    width = args.offline_hidden
    hidden, lr = (width, width), args.offline_lr
    if name == "bc":
        return BC(ContinuousActorCriticMLP(obs_dim, act_dim, hidden), lr=lr)
    if name == "cql":
        return CQL(
            _sac_model(obs_dim, act_dim, width),
            actor_lr=lr,
            critic_lr=lr,
            alpha_lr=lr,
            gamma=args.gamma,
            tau=args.tau,
            cql_weight=args.cql_weight,
            num_sampled_actions=args.cql_actions,
        )
    if name == "iql":
        return IQL(
            _sac_model(obs_dim, act_dim, width),
            ValueMLP(obs_dim, hidden),
            actor_lr=lr,
            critic_lr=lr,
            value_lr=lr,
            gamma=args.gamma,
            tau=args.tau,
            expectile=args.iql_expectile,
            beta=args.iql_beta,
        )
    raise ValueError(f"unknown offline algorithm {name!r}; choose from bc, cql, iql")


def learn_offline(name: str, dataset: OfflineDataset, args: Args) -> float:
    """Train one offline learner on `dataset`; return its final evaluation's mean return."""
    eval_env = make_rescaled_env(args.env_id)
    obs_dim, act_dim = dataset.obs.shape[1], dataset.action.shape[1]
    run_args = dataclasses.replace(
        args, logdir=os.path.join(args.logdir, name), eval_every=args.offline_eval_every
    )
    run = TrainingRun(
        f"{name.upper()} on the {args.env_id} dataset",
        run_args,
        total_steps=args.offline_steps,
        eval_env=eval_env,
    )
    agent = ContinuousAgent(make_offline_algorithm(name, obs_dim, act_dim, args))
    if name != "bc":
        dataset = scale_rewards(dataset, args.reward_scale, seed=args.seed)
    run.start()
    for step in range(1, args.offline_steps + 1):
        stats = agent.learn(dataset, args.offline_batch_size)
        run.record(step, (), stats)  # steps here are gradient steps
        run.maybe_evaluate(agent.predict)
    final = evaluate(eval_env, agent.predict, args.eval_episodes, seed=EVAL_SEED)
    run.finish(agent)
    logger.info("%s: final mean return %.1f", name, final)
    return final


def main(args: Args) -> dict:
    names = [n.strip() for n in args.algorithms.split(",") if n.strip()]
    results: dict = {}
    path = args.dataset
    if path is None:
        path = os.path.join(args.logdir, "dataset.npz")
        results.update(make_dataset(args, path))
    dataset = OfflineDataset.load(path, seed=args.seed)
    results["data_return"] = float(dataset.episode_returns().mean())
    for name in names:
        torch.manual_seed(args.seed)
        results[f"{name}_return"] = learn_offline(name, dataset, args)
    if "sac_expert_return" in results:
        low, high = results["random_return"], results["sac_expert_return"]
        for key in [k for k in results if k.endswith("_return") and k != "random_return"]:
            results[key.replace("_return", "_score")] = (results[key] - low) / (high - low)
    results = {k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}
    logger.info("results: %s", results)
    os.makedirs(args.logdir, exist_ok=True)
    with open(os.path.join(args.logdir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main(parse_args(Args))
