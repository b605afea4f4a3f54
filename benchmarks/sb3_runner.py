"""One Stable-Baselines3 run for benchmarks/learning.py, inside the baseline's own venv.

Reads a JSON spec (algorithm, threshold, cap, seed, and the PARL example's `Args` as a dict,
with `subproc` for a `SubprocVecEnv`, and `processes` to step `num_envs` environments in that
many processes, `num_envs / processes` each, as PARL's actors do; `atari` for the game as
`make_atari_env` and `VecFrameStack` give it, the Nature CNN under PPO; `stop_at_threshold`
false runs on to the cap; `eval_episodes`: the trained policy's mean return over that many
episodes as `evaluation`, deterministic but on Atari, as RL Baselines3 Zoo evaluates: SB3's
FIRE comes only at reset, so a deterministic policy that has not learned FIRE stalls after a
lost life) from argv, maps the example's hyperparameters onto the SB3
algorithm of the same name (QR-DQN: sb3-contrib's), trains until the mean return of the last
10 training episodes reaches the threshold or the cap, and prints `RESULT {json}` (with
`curve`: at each episode's end, the env step and the mean return of the last 10 episodes, as
`learning.py` reads PARL's runs, and `timed_curve` the same means against the seconds of
training; `last_100`: the mean of the last 100; `cpu_seconds`, the process's CPU seconds in
`learn`, and `rollout_cpu_seconds`, those spent collecting: with in-process environments the
rest is the updates'). Imports nothing of
PARL: only SB3 (and sb3-contrib), gymnasium, numpy and torch.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecFrameStack
from stable_baselines3.common.vec_env.base_vec_env import CloudpickleWrapper


def _group_worker(remote, parent_remote, env_fns: CloudpickleWrapper) -> None:
    """A process of `GroupedSubprocVecEnv`: its share of the environments, in a DummyVecEnv."""
    parent_remote.close()
    venv = DummyVecEnv(env_fns.var)
    try:
        while True:
            command, data = remote.recv()
            if command == "step":
                venv.step_async(data)
                remote.send(venv.step_wait())
            elif command == "reset":
                venv._seeds, venv._options = data  # what VecEnv.seed and set_options stored
                remote.send((venv.reset(), venv.reset_infos))
            elif command == "spaces":
                remote.send((venv.observation_space, venv.action_space))
            elif command == "call":
                name, args, kwargs = data
                remote.send(getattr(venv, name)(*args, **kwargs))
            elif command == "close":
                venv.close()
                return
    finally:
        remote.close()


class GroupedSubprocVecEnv(VecEnv):
    """`SubprocVecEnv` with several environments a process (`processes` of them).

    SB3's `SubprocVecEnv` runs one environment a process; this one splits the environments
    into `processes` equal groups, each stepped by a `DummyVecEnv` in a process of its own,
    so that SB3 steps as many environments in as many processes as PARL's actors.
    """

    def __init__(self, env_fns: list, processes: int = 2) -> None:
        if len(env_fns) % processes:
            raise ValueError(f"{len(env_fns)} environments do not split over {processes}")
        per = len(env_fns) // processes
        self.groups = [range(g * per, (g + 1) * per) for g in range(processes)]
        ctx = mp.get_context(
            "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        )
        self.remotes, work_remotes = zip(*[ctx.Pipe() for _ in range(processes)], strict=True)
        self.processes = []
        for group, work_remote, remote in zip(self.groups, work_remotes, self.remotes, strict=True):
            fns = CloudpickleWrapper([env_fns[i] for i in group])
            process = ctx.Process(
                target=_group_worker, args=(work_remote, remote, fns), daemon=True
            )
            process.start()
            self.processes.append(process)
            work_remote.close()
        self.remotes[0].send(("spaces", None))
        observation_space, action_space = self.remotes[0].recv()
        super().__init__(len(env_fns), observation_space, action_space)

    def step_async(self, actions: np.ndarray) -> None:
        for group, remote in zip(self.groups, self.remotes, strict=True):
            remote.send(("step", actions[group.start : group.stop]))

    def step_wait(self):
        obs, rewards, dones, infos = zip(*[remote.recv() for remote in self.remotes], strict=True)
        flat_infos = [info for group in infos for info in group]
        return np.concatenate(obs), np.concatenate(rewards), np.concatenate(dones), flat_infos

    def reset(self):
        for group, remote in zip(self.groups, self.remotes, strict=True):
            seeds = [self._seeds[i] for i in group]
            remote.send(("reset", (seeds, [self._options[i] for i in group])))
        obs, infos = zip(*[remote.recv() for remote in self.remotes], strict=True)
        self.reset_infos = [info for group in infos for info in group]
        self._reset_seeds()
        self._reset_options()
        return np.concatenate(obs)

    def close(self) -> None:
        for remote in self.remotes:
            remote.send(("close", None))
        for process in self.processes:
            process.join()

    def _call(self, name: str, indices, *args, **kwargs) -> list:
        """`DummyVecEnv.<name>(*args, indices=..., **kwargs)` in each group; the flat results."""
        wanted = set(self._get_indices(indices))
        asked = []
        for group, remote in zip(self.groups, self.remotes, strict=True):
            local = [i - group.start for i in group if i in wanted]
            if local:
                remote.send(("call", (name, args, {**kwargs, "indices": local})))
                asked.append(remote)
        return [result for remote in asked for result in remote.recv()]

    def get_attr(self, attr_name: str, indices=None) -> list:
        return self._call("get_attr", indices, attr_name)

    def set_attr(self, attr_name: str, value, indices=None) -> None:
        for group, remote in zip(self.groups, self.remotes, strict=True):
            local = [i - group.start for i in group if i in set(self._get_indices(indices))]
            if local:
                remote.send(("call", ("set_attr", (attr_name, value), {"indices": local})))
                remote.recv()

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list:
        return self._call("env_method", indices, method_name, *method_args, **method_kwargs)

    def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
        return self._call("env_is_wrapped", indices, wrapper_class)


class StopAtThreshold(BaseCallback):
    """Track finished episodes (Monitor infos); stop once the last 10 average the threshold."""

    def __init__(self, threshold: float, stop: bool = True) -> None:
        super().__init__()
        self.threshold = threshold
        self.stop = stop
        self.returns: list[float] = []
        self.curve: list[tuple[int, float]] = []  # (env step, mean of the last 10) an episode
        self.timed_curve: list[tuple[float, float]] = []  # (seconds, mean of the last 10)
        self.reached_at: int | None = None
        self.reached_seconds: float | None = None
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
                mean = round(float(np.mean(self.returns[-10:])), 2)
                self.curve.append((self.num_timesteps, mean))
                self.timed_curve.append((round(time.perf_counter() - self.start, 2), mean))
                if (
                    self.reached_at is None
                    and len(self.returns) >= 10
                    and np.mean(self.returns[-10:]) >= self.threshold
                ):
                    self.reached_at = self.num_timesteps
                    self.reached_seconds = time.perf_counter() - self.start
                    return not self.stop
        return True


class Phases(BaseCallback):
    """The process's CPU seconds spent collecting rollouts (the rest of `learn` is updates)."""

    def __init__(self) -> None:
        super().__init__()
        self.rollout_cpu = 0.0
        self._started = 0.0

    def _on_rollout_start(self) -> None:
        self._started = time.process_time()

    def _on_rollout_end(self) -> None:
        self.rollout_cpu += time.process_time() - self._started

    def _on_step(self) -> bool:
        return True


def linear(initial: float):
    return lambda progress_remaining: progress_remaining * initial


def atari_env(a: dict, n_envs: int, seed: int) -> VecEnv:
    """The game as SB3 plays it: its AtariWrapper (30 no-ops, 4 frames an action, 84x84 gray,
    FIRE at reset in games with FIRE, rewards clipped), here without its episode end at a lost
    life (as PARL's configs), over ALE v5's sticky actions; 4 frames stacked."""
    import ale_py

    gym.register_envs(ale_py)
    env = make_atari_env(
        a["env_id"],
        n_envs=n_envs,
        seed=seed,
        env_kwargs={"frameskip": 1},  # the wrapper skips the frames
        wrapper_kwargs={"terminal_on_life_loss": False},
    )
    return VecFrameStack(env, n_stack=4)


def build(algo: str, a: dict, seed: int, cap: int):
    hidden = [a["hidden_size"], a["hidden_size"]]
    if algo in ("ppo", "a2c"):
        vec_env_cls, vec_env_kwargs = None, None
        if a.get("processes"):  # num_envs / processes environments a process
            vec_env_cls, vec_env_kwargs = GroupedSubprocVecEnv, {"processes": a["processes"]}
        elif a.get("subproc"):  # a process per environment
            vec_env_cls = SubprocVecEnv
        if a.get("atari"):
            env = atari_env(a, a["num_envs"], seed)
        else:
            env = make_vec_env(
                a["env_id"],
                n_envs=a["num_envs"],
                seed=seed,
                vec_env_cls=vec_env_cls,
                vec_env_kwargs=vec_env_kwargs,
            )
        policy, policy_kwargs = "MlpPolicy", dict(net_arch=dict(pi=hidden, vf=hidden))
        if a.get("atari"):  # the Nature CNN, its dense layer of hidden_size, shared
            policy, policy_kwargs = (
                "CnnPolicy",
                dict(features_extractor_kwargs={"features_dim": a["hidden_size"]}),
            )
        common = dict(
            n_steps=a["n_steps"],
            gamma=a["gamma"],
            gae_lambda=a["gae_lambda"],
            ent_coef=a["ent_coef"],
            vf_coef=a["vf_coef"],
            max_grad_norm=a["max_grad_norm"],
            policy_kwargs=policy_kwargs,
            seed=seed,
        )
        if algo == "a2c":
            return A2C(policy, env, learning_rate=a["lr"], **common)
        anneal = a["anneal"]
        if a["variant"] != "clip" or a["clip_value"] is not None:
            raise ValueError("the SB3 baseline covers PPO's clip variant without value clipping")
        return PPO(
            policy,
            env,
            learning_rate=linear(a["lr"]) if anneal else a["lr"],
            clip_range=linear(a["clip_coef"]) if anneal else a["clip_coef"],
            batch_size=a["minibatch_size"],
            n_epochs=a["update_epochs"],
            **common,
        )
    env = Monitor(gym.make(a["env_id"]))
    common = dict(
        learning_rate=a["lr"],
        buffer_size=a["buffer_size"],
        learning_starts=a["learning_starts"],
        batch_size=a["batch_size"],
        gamma=a["gamma"],
        train_freq=a["train_freq"],
        gradient_steps=a["gradient_steps"],
        policy_kwargs=dict(net_arch=hidden),
        seed=seed,
    )
    if algo in ("dqn", "qrdqn"):
        # The config's Adam epsilon and gradient clipping, where SB3's DQN has 1e-8 and a norm
        # of 10 and sb3-contrib's QR-DQN 0.01 / batch_size and none (configs older than these
        # keys had PARL's defaults, 1e-8 and 10).
        optimizer = dict(
            optimizer_class=torch.optim.Adam, optimizer_kwargs=dict(eps=a.get("adam_eps", 1e-8))
        )
        clip = a.get("max_grad_norm", 10.0)
        cls = DQN
        common["policy_kwargs"] = dict(net_arch=hidden, **optimizer)
        if algo == "qrdqn":
            from sb3_contrib import QRDQN as cls

            common["policy_kwargs"]["n_quantiles"] = a["n_atoms"]
        elif clip is None:  # SB3's DQN always clips
            clip = float("inf")
        return cls(
            "MlpPolicy",
            env,
            max_grad_norm=clip,
            target_update_interval=a["target_update_interval"],
            exploration_fraction=a["exploration_fraction"],
            exploration_final_eps=a["eps_end"],
            **common,
        )
    if algo == "sac":
        alpha = a["alpha"]
        return SAC(
            "MlpPolicy", env, tau=a["tau"], ent_coef="auto" if alpha is None else alpha, **common
        )
    n_actions = env.action_space.shape[0]
    noise = NormalActionNoise(np.zeros(n_actions), a["exploration_noise"] * np.ones(n_actions))
    if algo == "ddpg":
        return DDPG("MlpPolicy", env, tau=a["tau"], action_noise=noise, **common)
    return TD3(
        "MlpPolicy",
        env,
        tau=a["tau"],
        action_noise=noise,
        policy_delay=a["policy_delay"],
        target_policy_noise=a["policy_noise"],
        target_noise_clip=a["noise_clip"],
        **common,
    )


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["args"]["torch_threads"])
    model = build(spec["algo"], spec["args"], spec["seed"], spec["cap"])
    callback = StopAtThreshold(spec["threshold"], stop=spec.get("stop_at_threshold", True))
    phases = Phases()
    start = callback.start = time.perf_counter()  # like PARL's TrainingRun: after building
    cpu = time.process_time()
    model.learn(total_timesteps=spec["cap"], callback=[callback, phases])
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu
    evaluation = None
    if spec.get("eval_episodes"):
        a = spec["args"]
        env = (
            atari_env(a, 1, spec["seed"] + 10_000)
            if a.get("atari")
            else Monitor(gym.make(a["env_id"]))
        )
        evaluation, _ = evaluate_policy(
            model, env, n_eval_episodes=spec["eval_episodes"], deterministic=not a.get("atari")
        )
    print(
        "RESULT",
        json.dumps(
            {
                "reached_at": callback.reached_at,
                "seconds": round(callback.reached_seconds or total, 2),
                "total_seconds": round(total, 2),
                "final_mean_return": (
                    float(np.mean(callback.returns[-10:])) if callback.returns else None
                ),
                "last_100": float(np.mean(callback.returns[-100:])) if callback.returns else None,
                "evaluation": None if evaluation is None else float(evaluation),
                "env_steps": model.num_timesteps,
                "curve": callback.curve,
                "timed_curve": callback.timed_curve,
                "cpu_seconds": round(cpu, 3),
                "rollout_cpu_seconds": round(phases.rollout_cpu, 3),
            }
        ),
    )


if __name__ == "__main__":
    main()
