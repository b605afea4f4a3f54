"""PPO's update with its flat Adam step against `torch.optim.Adam` (`foreach=True`, `fused=True`).

`PPO._lean_step` clips the gradient's norm and takes Adam's step on parameters and moments
packed into one flat tensor each (the same arithmetic as `clip_grad_norm_` and Adam's
multi-tensor step). This measures what it buys on CPU on PPO's own update: `PPO.learn` on
CartPole's actor-critic MLP (two hidden layers of `--hidden`), the shipped config's batch (8
environments x 32 steps), `minibatch_size` 256 and 20 epochs, one torch thread, in three
variants built from the same weights:

- `flat`: PPO as shipped (the flat step after Adam's first);
- `foreach`: the same optimizer with the flat step turned off (`clip_grad_norm_`, then
  `Adam.step` with `foreach=True`);
- `fused`: `torch.optim.Adam(fused=True)` (then `clip_grad_norm_`).

The variants take turns, one `learn` each, for `--rounds` rounds (a shared machine's load
moves within seconds, so each sees the same load); the table gives each one's median seconds
per `learn` and its ratio to `foreach`, with the load average before and after.

    nice python benchmarks/optim.py                 # about a minute
    nice python benchmarks/optim.py --rounds 50 --hidden 256

Each variant's median goes to the result file `optim` (`benchmarks/results/optim.json`, see
`_results.py`) as a row against `foreach`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _results import Row, command_line, record

from parl_algos.nets import ActorCriticMLP
from parl_algos.ppo import PPO

OBS_DIM, N_ACTIONS = 4, 2


def _ppo(hidden: int, variant: str) -> PPO:
    torch.manual_seed(0)
    model = ActorCriticMLP(OBS_DIM, N_ACTIONS, (hidden, hidden))
    alg = PPO(model, lr=1e-3, update_epochs=20, minibatch_size=256, seed=0)
    if variant == "foreach":
        alg._lean_step = lambda optimizer, params: False  # type: ignore[method-assign]
    elif variant == "fused":
        optimizer = torch.optim.Adam(alg._parameters, lr=1e-3, eps=1e-5, fused=True)
        alg.optimizer = optimizer
        alg._steps = [(optimizer, alg._parameters)]
    return alg


def _batch(n: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(n, OBS_DIM, generator=g)
    action = torch.randint(N_ACTIONS, (n,), generator=g)
    advantage = torch.randn(n, generator=g)
    value_target = torch.randn(n, generator=g)
    return obs, action, advantage, value_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="learn() calls of each variant")
    parser.add_argument("--hidden", type=int, default=64, help="width of the MLP's layers")
    parser.add_argument("--batch", type=int, default=256, help="samples per learn()")
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = {name: _ppo(args.hidden, name) for name in ("flat", "foreach", "fused")}
    batch = _batch(args.batch)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    load_before = os.getloadavg()
    for alg in variants.values():  # Adam's first step (state made), imports, warm caches
        alg.learn(*batch)
    for _ in range(args.rounds):
        for name, alg in variants.items():
            start = time.perf_counter()
            alg.learn(*batch)
            seconds[name].append(time.perf_counter() - start)
    load_after = os.getloadavg()
    base = statistics.median(seconds["foreach"])
    print(f"PPO.learn, MLP {args.hidden}x{args.hidden}, batch {args.batch}, 20 epochs of 256")
    print(f"{'variant':<10}{'s / learn':>12}{'vs foreach':>12}")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"{name:<10}{median:>12.4f}{base / median:>11.2f}x")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    rows = [
        Row(
            task=f"PPO.learn, CartPole MLP {args.hidden}x{args.hidden}, batch {args.batch}",
            algorithm=f"Adam step: {name}",
            metric="seconds a learn() (median), one torch thread",
            better="lower",
            ours=round(statistics.median(seconds[name]), 5),
            peer=f"torch {torch.__version__.split('+')[0]} Adam(foreach=True)",
            peer_value=round(base, 5),
            seeds=[],
            command=command_line(),
            note=f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after",
        )
        for name in ("flat", "fused")
    ]
    path = record("optim", rows, title="Optimizer steps: PPO's flat Adam against torch's Adam")
    if path:
        print(f"result rows: {path}")


if __name__ == "__main__":
    main()
