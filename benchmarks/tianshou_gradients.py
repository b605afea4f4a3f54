"""PARL's C51 and Rainbow learners beside Tianshou's on the same batch: do they compute the same?

`dqn_peers.py tianshou` compares the two in env steps to a threshold, where runs of one
algorithm part ways after a few hundred updates (Adam amplifies float-level differences in
gradients near zero) and a 3-seed median is noisy. This script checks the learners directly:
for each config, Tianshou's algorithm (built by `tianshou_runner.py` from the config's
hyperparameters) and PARL's (built by `parl-train`'s own builder) start from the same weights
(Tianshou's, copied) and the same noise in the noisy layers, and take one update on the same
batch of n-step transitions, sampled by Tianshou's replay buffer from random-action episodes
(prioritized, with random priorities where the config's replay is prioritized, so the
importance weights vary). It prints, side by side for Tianshou as shipped and with
`tianshou_runner.py`'s bootstrap after n steps, the largest difference between the two
gradients relative to the largest gradient, the two losses (Tianshou's cross-entropy; PARL's
KL divergence plus the target's entropy), and the largest relative difference between the
priorities each would write back. Before the check Tianshou's learner trains for `--pretrain`
updates on the buffer, so that the distributions are no longer near uniform. Float32 arithmetic
in a different order gives ~1e-6 of the largest gradient, and up to ~5e-4 where the fit to the
random-action data is close and the gradient is mostly cancellation (C51 on Acrobot, whose
largest gradient is then ~1e-4); a near tie between the best two next actions would flip one
sample's target, so the last column gives the least gap.

    python benchmarks/tianshou_gradients.py
    python benchmarks/tianshou_gradients.py --configs rainbow/lunarlander --seeds 1,2,3

It runs in this repository's venv with the Tianshou venv's site-packages appended (made by
`dqn_peers.py`, with the repository's pinned torch and numpy: the two must match).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dqn_peers import tianshou_python

CONFIGS = ("c51/acrobot", "c51/lunarlander", "rainbow/acrobot", "rainbow/lunarlander")


def _append_tianshou(python: str) -> None:
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    sys.path.append(site)


def check(name: str, seed: int, bootstrap_after_n: bool, fill: int, pretrain: int) -> dict:
    """One update of each learner on one batch; the differences between them."""
    import gymnasium as gym
    import numpy as np
    import tianshou_runner
    import torch
    from tianshou.data import Collector, PrioritizedReplayBuffer, ReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.discrete import NoisyLinear as TianshouNoisy
    from tianshou.utils.torch_utils import policy_within_training_step

    from parl_algos.nets import NoisyLinear
    from parl_algos.train import load_config
    from parl_algos.train._off_policy import _build_dqn

    config = load_config(name)
    config = dataclasses.replace(
        config, agent=dataclasses.replace(config.agent, c51_priority="cross_entropy")
    )
    a = {**dataclasses.asdict(config.agent), "env_id": config.env.id, "torch_threads": 1}
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    np.random.seed(seed)
    probe = gym.make(config.env.id)
    theirs = tianshou_runner.build(
        config.algorithm.lower(), a, probe, bootstrap_after_n=bootstrap_after_n
    )
    ours = _build_dqn(config, probe.observation_space, probe.action_space).agent.alg
    # A buffer of random-action episodes; the batch's n-step windows lie inside one episode.
    n, gamma = a["n_step"], a["gamma"]
    if a["prioritized"]:
        buffer = PrioritizedReplayBuffer(
            fill + 1, alpha=a["priority_alpha"], beta=a["priority_beta"]
        )
    else:
        buffer = ReplayBuffer(fill + 1)
    env = DummyVectorEnv([lambda: gym.make(config.env.id)])
    collector = Collector(theirs.policy, env, buffer)
    collector.reset(gym_reset_kwargs={"seed": seed})
    env.action_space[0].seed(seed)
    collector.collect(n_step=fill, random=True)
    size = len(buffer)
    ends = buffer.terminated[:size] | buffer.truncated[:size]
    inside = np.array([i for i in range(size - n) if not ends[i : i + n - 1].any()])

    # Tianshou's learner trains a while (its own batches), so that the distributions are no
    # longer near uniform; then PARL's networks take its weights, online and target.
    with policy_within_training_step(theirs.policy):
        for i in range(pretrain):
            if i % 250 == 0:
                theirs._update_lagged_network_weights()
            theirs.update(buffer, sample_size=a["batch_size"])
    pairs = ((theirs.policy.model, ours.model), (theirs.model_old, ours.target_model))
    for t_model, o_model in pairs:
        t_list = [p for p in t_model.parameters() if p.requires_grad]
        o_list = list(o_model.parameters())
        if [p.shape for p in t_list] != [p.shape for p in o_list]:
            raise RuntimeError(f"{name}: the two networks' parameters differ in shape")
        with torch.no_grad():
            for t, o in zip(t_list, o_list, strict=True):
                o.copy_(t)

    # Fix the noise: Tianshou's drawn once for each network, then copied.
    if a["noisy"]:
        theirs._sample_noise(theirs.policy.model)
        theirs._sample_noise(theirs.model_old)
        theirs._sample_noise = lambda model: True
        ours.noisy = False  # PARL's learn would draw new noise
        for t_model, o_model in pairs:
            t_layers = [m for m in t_model.modules() if isinstance(m, TianshouNoisy)]
            o_layers = [m for m in o_model.modules() if isinstance(m, NoisyLinear)]
            with torch.no_grad():
                for t, o in zip(t_layers, o_layers, strict=True):
                    o.weight_epsilon.copy_(torch.outer(t.eps_q, t.eps_p))
                    o.bias_epsilon.copy_(t.eps_q)
    theirs._iter = max(theirs._iter, 1)  # Tianshou copies the target at its update 0 only
    t_params = [p for p in theirs.policy.model.parameters() if p.requires_grad]
    o_params = list(ours.model.parameters())

    rng = np.random.default_rng(seed)
    if a["prioritized"]:  # random priorities over the windows, none elsewhere
        buffer.update_weight(np.arange(size), np.full(size, 1e-12))
        buffer.update_weight(inside, rng.uniform(0.1, 3.0, len(inside)))
        batch_indices = buffer.sample_indices(a["batch_size"])
    else:
        batch_indices = rng.choice(inside, a["batch_size"])
    buffer.sample_indices = lambda size: batch_indices

    grads: dict[int, torch.Tensor] = {}
    for i, p in enumerate(t_params):
        p.register_hook(lambda g, i=i: grads.__setitem__(i, g.clone()))
    seen: dict[str, np.ndarray] = {}
    update_with_batch = theirs._update_with_batch

    def spy(batch):
        seen["weight"] = np.asarray(batch.weight) if "weight" in batch else None
        out = update_with_batch(batch)
        seen["priority"] = np.asarray(batch.weight)  # Tianshou's priority goes back there
        return out

    theirs._update_with_batch = spy
    with policy_within_training_step(theirs.policy):
        t_loss = theirs.update(buffer, sample_size=a["batch_size"]).loss

    idx, last = batch_indices, batch_indices + n - 1
    reward = sum(gamma**k * buffer.rew[idx + k] for k in range(n))

    def tensor(x, dtype=torch.float32):
        return torch.as_tensor(np.asarray(x), dtype=dtype)

    weight = None if seen["weight"] is None else tensor(seen["weight"])
    with torch.no_grad():  # how near a tie the next action was (a flip changes a sample's target)
        chooser = ours.model if ours.double else ours.target_model
        q = ours.q_values(chooser(tensor(buffer.obs_next[last]))).sort(dim=1).values
        tie_gap = (q[:, -1] - q[:, -2]).min().item()
    o_grads: dict[int, torch.Tensor] = {}
    for i, p in enumerate(o_params):
        p.register_hook(lambda g, i=i: o_grads.__setitem__(i, g.clone()))
    stats = ours.learn(
        tensor(buffer.obs[idx]),
        tensor(buffer.act[idx], torch.int64),
        tensor(reward),
        tensor(buffer.obs_next[last]),
        tensor(buffer.terminated[last]),
        weight=weight,
    )
    largest = max(g.abs().max().item() for g in grads.values())
    gap = max((grads[i] - o_grads[i]).abs().max().item() for i in grads)
    # PARL's loss is the KL divergence; the cross-entropy adds the target's entropy.
    priority = np.abs(stats.td_error - seen["priority"]) / np.abs(seen["priority"])
    return {
        "grad_gap": gap / largest,
        "t_loss": t_loss,
        "o_loss": float((stats.td_error * (1.0 if weight is None else weight.numpy())).mean()),
        "priority_gap": float(priority.max()),
        "tie_gap": tie_gap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configs")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds")
    parser.add_argument("--fill", type=int, default=3000, help="random-action steps in the buffer")
    parser.add_argument(
        "--pretrain", type=int, default=1000, help="updates of Tianshou's learner before the check"
    )
    parser.add_argument("--tianshou-python", help="the python of a venv with Tianshou")
    args = parser.parse_args()
    _append_tianshou(tianshou_python(args.tianshou_python))
    print(
        "| config | seed | Tianshou | max gradient difference / max gradient "
        "| loss: Tianshou, PARL (cross-entropy) | max priority difference (relative) "
        "| least gap between the best two next Q-values |"
    )
    print("|---|---|---|---|---|---|---|")
    from parl_algos.train import load_config

    for name in args.configs.split(","):
        n_step = load_config(name).agent.n_step
        for seed in (int(s) for s in args.seeds.split(",")):
            for after_n in (False, True) if n_step > 1 else (False,):
                r = check(name, seed, after_n, args.fill, args.pretrain)
                which = "bootstrap after n steps" if after_n else f"as shipped (n = {n_step})"
                print(
                    f"| `{name}` | {seed} | {which} | {r['grad_gap']:.1e} "
                    f"| {r['t_loss']:.6f}, {r['o_loss']:.6f} | {r['priority_gap']:.1e} "
                    f"| {r['tie_gap']:.1e} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
