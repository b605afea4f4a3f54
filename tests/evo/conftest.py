"""Test functions and a driver loop shared by the evo tests."""

from __future__ import annotations

import numpy as np
import pytest


def sphere(x: np.ndarray) -> float:
    return float(x @ x)


def rosenbrock(x: np.ndarray) -> float:
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))


def rastrigin(x: np.ndarray) -> float:
    return float(10 * x.size + np.sum(x * x - 10 * np.cos(2 * np.pi * x)))


def minimize(solver, f, *, target, max_evals, seed=0, on_mean=False):
    """Drive `solver` on `f` (minimized: rewards are -f) until `target`; return evaluations.

    The target is checked on the best candidate, or on the solver's mean with `on_mean` (for
    ES, whose candidates stay sigma away from the optimum). Returns None if the budget ran out.
    """
    rng = np.random.default_rng(seed)
    evals = 0
    while evals < max_evals:
        infos = solver.ask(rng)
        values = [f(solver.candidate(info)) for info in infos]
        evals += len(values)
        solver.tell(infos, [-v for v in values])
        best = f(solver.mean) if on_mean else min(values)
        if best < target:
            return evals
    return None


@pytest.fixture
def noise_dir(tmp_path):
    """A private directory for noise tables, so tests never share or leak /dev/shm files."""
    directory = tmp_path / "noise"
    directory.mkdir()
    return directory
