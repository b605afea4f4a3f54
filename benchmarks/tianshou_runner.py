"""One Tianshou run (C51 or Rainbow) for benchmarks/dqn_peers.py, inside Tianshou's own venv.

Reads a JSON spec from argv (`algo`: "c51" or "rainbow", `threshold`, `cap`, `seed`, and `args`:
the `[agent]` section of a PARL config as a dict, with `env_id` and `torch_threads`), builds
Tianshou's (2.x) `C51` or `RainbowDQN` with those hyperparameters and runs PARL's off-policy
schedule step by step with Tianshou's own pieces (`Collector`, replay buffers, the algorithm's
`update`): uniformly random actions for the first `learning_starts` steps, then epsilon falls
linearly to `eps_end` at `exploration_fraction` of the cap; `gradient_steps` updates of
`batch_size` every `train_freq` steps past the warm-up; the target network copied every
`target_update_interval` env steps. It stops when the mean return of the last 10 training
episodes reaches the threshold, or at the cap, and prints `RESULT {json}` (the fields of
sb3_runner.py's). Imports nothing of PARL: only Tianshou, gymnasium, numpy and torch.

The network is Tianshou's `Net`: `hidden_size`-unit ReLU layers, a softmax over `n_atoms` atoms
on `[v_min, v_max]`; Rainbow's has a dueling head of `NoisyLinear` layers (one layer a stream,
as PARL's `DuelingHead`), a `PrioritizedReplayBuffer` (the config's `priority_alpha`, and its
`priority_beta` rising to 1 over the run's updates, as PARL's memory; 0.6 and 0.4 where the
spec has none) and `n_step` returns. Gradients are clipped to the config's
`max_grad_norm` (10 where it has none, as PARL's DQN; Tianshou's default is no clipping), and
Adam takes the config's `adam_eps` (1e-8 where none, Tianshou's default too). Tianshou's C51
picks the next action with the online network (a double target) by design; with the config's
`double = false` (PARL's `c51` configs, and the C51 paper's algorithm 1) the target network
picks it, as in PARL (`_plain_target`). Where Tianshou differs by design otherwise, it keeps its
own way: its collector acts in eval mode, where `NoisyLinear` is noise-free, so its Rainbow
explores with the config's epsilon schedule (as Tianshou's own Rainbow examples do with
epsilon) where PARL's explores with the noise alone (epsilon 0); `noise_only` true in the spec
gives Tianshou's Rainbow PARL's epsilon 0 after the warm-up. Its prioritized replay takes a
sample's cross-entropy `-sum m log p` as its priority (PARL's `agent.c51_priority =
"cross_entropy"`), where PARL's default is the KL divergence, the Rainbow paper's. With
`n_step > 1` (the Rainbow configs' 3) Tianshou 2.0.1's C51 and Rainbow shift the target
distribution of the state one step on by the n-step return, where the paper (and PARL) take that
of the state n steps on; `bootstrap_after_n` true in the spec gives Tianshou's the paper's
(`_bootstrap_after_n`), and `benchmarks/tianshou_gradients.py` checks that it then computes
PARL's gradient.
"""

from __future__ import annotations

import json
import sys
import time
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm import C51, RainbowDQN
from tianshou.algorithm.modelfree.c51 import C51Policy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, PrioritizedReplayBuffer, ReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.utils.net.common import Net
from tianshou.utils.net.discrete import NoisyLinear
from tianshou.utils.torch_utils import policy_within_training_step

MAX_GRAD_NORM = 10.0  # PARL's DQN's, for configs that do not name one
NEVER = 10**15  # Tianshou's own target copies: only at its first update (this loop copies)


def _clipped(cls: type, max_grad_norm: float | None) -> type:
    """`cls` whose optimizer clips the gradient's norm to `max_grad_norm` (None: no clipping)."""

    class Clipped(cls):
        def _create_policy_optimizer(self, optim):
            return self._create_optimizer(self.policy, optim, max_grad_norm=max_grad_norm)

    Clipped.__name__ = cls.__name__
    return Clipped


def _plain_target(cls: type) -> type:
    """`cls` (a C51) whose target network both picks the next action and gives its distribution."""

    class PlainTarget(cls):
        def _target_dist(self, batch):
            obs_next = Batch(obs=batch.obs_next, info=[None] * len(batch))
            out = self.policy(obs_next, model=self.model_old)  # act: argmax of the target's Q
            next_dist = out.logits[np.arange(len(out.act)), out.act, :]
            p = self.policy
            target_support = batch.returns.clamp(p.v_min, p.v_max)
            # Tianshou's C51._target_dist from here on: the same projection onto the support.
            distance = (target_support.unsqueeze(1) - p.support.view(1, -1, 1)).abs()
            return ((1 - distance / self.delta_z).clamp(0, 1) * next_dist.unsqueeze(1)).sum(-1)

    PlainTarget.__name__ = cls.__name__
    return PlainTarget


def _bootstrap_after_n(cls: type) -> type:
    """`cls` (a C51 or Rainbow) whose target distribution is that of the state `n_step` on.

    Tianshou 2.0.1's C51 (and so its Rainbow) takes the next distribution at `batch.obs_next`,
    the state one step on, while the returns it shifts it by are `n_step`-step ones, discounted
    by `gamma^n_step`: with `n_step > 1` that bootstraps from the wrong state. Here the batch's
    `obs_next` becomes the state `n_step` steps on (or where the episode ended before that), the
    one Tianshou's n-step returns were computed to, as in the Rainbow paper and PARL.
    """

    class BootstrapAfterN(cls):
        def _preprocess_batch(self, batch, buffer, indices):
            batch = super()._preprocess_batch(batch, buffer, indices)
            last = indices
            for _ in range(self.n_step - 1):
                last = buffer.next(last)  # stays at an episode's (or the buffer's) last step
            batch.obs_next = buffer.obs_next[last]
            return batch

    BootstrapAfterN.__name__ = cls.__name__
    return BootstrapAfterN


def build(algo: str, a: dict, env: gym.Env, bootstrap_after_n: bool = False):
    n_actions = int(env.action_space.n)
    hidden = [a["hidden_size"], a["hidden_size"]]
    dueling = None
    if algo == "rainbow":
        linear = partial(NoisyLinear, noisy_std=0.5) if a["noisy"] else torch.nn.Linear
        dueling = ({"linear_layer": linear}, {"linear_layer": linear})
    elif a.get("dueling") or a.get("noisy"):
        raise ValueError("the c51 peer has neither a dueling head nor noisy layers")
    net = Net(
        state_shape=env.observation_space.shape,
        action_shape=n_actions,
        hidden_sizes=hidden,
        softmax=True,
        num_atoms=a["n_atoms"],
        dueling_param=dueling,
    )
    policy = C51Policy(
        model=net,
        action_space=env.action_space,
        observation_space=env.observation_space,
        num_atoms=a["n_atoms"],
        v_min=a["v_min"],
        v_max=a["v_max"],
    )
    cls = RainbowDQN if algo == "rainbow" else C51
    if not a.get("double", True):
        cls = _plain_target(cls)
    if bootstrap_after_n and a["n_step"] > 1:
        cls = _bootstrap_after_n(cls)
    cls = _clipped(cls, a.get("max_grad_norm", MAX_GRAD_NORM))
    return cls(
        policy=policy,
        optim=AdamOptimizerFactory(lr=a["lr"], eps=a.get("adam_eps", 1e-8)),
        gamma=a["gamma"],
        n_step_return_horizon=a["n_step"],
        target_update_freq=NEVER,
    )


def main() -> None:
    spec = json.loads(sys.argv[1])
    a, cap, seed, threshold = spec["args"], spec["cap"], spec["seed"], spec["threshold"]
    if spec["algo"] not in ("c51", "rainbow") or a.get("distributional") != "c51":
        raise ValueError(f"the Tianshou peer runs C51 and Rainbow, not {spec['algo']!r}")
    torch.set_num_threads(a["torch_threads"])
    torch.manual_seed(seed)
    np.random.seed(seed)
    env = DummyVectorEnv([lambda: gym.make(a["env_id"])])
    probe = gym.make(a["env_id"])
    algorithm = build(spec["algo"], a, probe, spec.get("bootstrap_after_n", False))
    policy = algorithm.policy
    updates = max(cap * a["gradient_steps"] // a["train_freq"], 1)
    if a["prioritized"]:
        alpha, beta = a.get("priority_alpha", 0.6), a.get("priority_beta", 0.4)
        buffer = PrioritizedReplayBuffer(a["buffer_size"], alpha=alpha, beta=beta)
    else:
        buffer = ReplayBuffer(a["buffer_size"])
    collector = Collector(policy, env, buffer, exploration_noise=True)
    collector.reset(gym_reset_kwargs={"seed": seed})
    env.action_space[0].seed(seed)
    decay = max(int(a["exploration_fraction"] * cap) - a["learning_starts"], 1)
    eps_start, eps_end = (0.0, 0.0) if spec.get("noise_only") else (1.0, a["eps_end"])
    returns: list[float] = []
    curve: list[tuple[int, float]] = []  # (env step, mean of the last 10) at each episode's end
    reached_at, reached_seconds, done_updates = None, None, 0
    start = time.perf_counter()  # like PARL's TrainingRun: after building
    step = 0
    with policy_within_training_step(policy):
        for step in range(1, cap + 1):
            warm = step <= a["learning_starts"]
            frac = min((step - 1 - a["learning_starts"]) / decay, 1.0)
            policy.set_eps_training(eps_start + frac * (eps_end - eps_start))
            stats = collector.collect(n_step=1, random=warm)
            returns.extend(float(r) for r in stats.returns)
            if len(stats.returns):
                curve.append((step, round(float(np.mean(returns[-10:])), 2)))
            if step > a["learning_starts"] and step % a["train_freq"] == 0:
                for _ in range(a["gradient_steps"]):
                    if a["prioritized"]:
                        buffer.set_beta(beta + (1.0 - beta) * min(done_updates / updates, 1.0))
                    algorithm.update(buffer, sample_size=a["batch_size"])
                    done_updates += 1
            if step % a["target_update_interval"] == 0:
                algorithm._update_lagged_network_weights()
            if len(stats.returns) and len(returns) >= 10 and np.mean(returns[-10:]) >= threshold:
                reached_at, reached_seconds = step, time.perf_counter() - start
                break
    total = time.perf_counter() - start
    result = {
        "reached_at": reached_at,
        "seconds": round(reached_seconds or total, 2),
        "total_seconds": round(total, 2),
        "final_mean_return": float(np.mean(returns[-10:])) if returns else None,
        "env_steps": step,
        "curve": curve,
    }
    print("RESULT", json.dumps(result))


if __name__ == "__main__":
    main()
