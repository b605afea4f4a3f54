"""Each solver reaches its target on sphere and Rosenbrock; CMA-ES against pycma's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from parl_evo import (
    CMAES,
    GA,
    SGD,
    Adam,
    ConfigError,
    FutureSampleError,
    GaussianES,
    NoUsableSamplesError,
    SampleError,
    SamplingInfo,
    SeedNoise,
    SepCMAES,
    centered_ranks,
)
from tests.evo.conftest import minimize, rastrigin, rosenbrock, sphere

# pycma 4.5.0 (`cma.CMAEvolutionStrategy(np.zeros(10), 0.5, {"ftarget": 1e-8})`, seeds 1-10)
# needs a median of 4780 evaluations to reach f < 1e-8 on 10-D Rosenbrock over the 9 runs that
# reach it (range 4430-6070; the tenth ends in the local minimum near f = 3.99).
# benchmarks/es_bench.py measures it afresh where pycma is installed. We must stay within 1.5x.
PYCMA_ROSENBROCK_10D_MEDIAN = 4780


def test_centered_ranks():
    np.testing.assert_allclose(centered_ranks([3.0, -1.0, 10.0]), [0.0, -0.5, 0.5])
    # ties share their mean rank: [5, 5] are ranks 1 and 2 of 0..3 -> 1.5 / 3 - 0.5
    np.testing.assert_allclose(centered_ranks([5.0, 0.0, 5.0, 9.0]), [0.0, -0.5, 0.0, 0.5])
    np.testing.assert_array_equal(centered_ranks([7.0]), [0.0])
    assert centered_ranks(np.arange(101.0)).sum() == pytest.approx(0.0, abs=1e-12)


def es(x0, sigma, optimizer, **kwargs):
    return GaussianES(x0=x0, sigma=sigma, noise=SeedNoise(), optimizer=optimizer, **kwargs)


def cma(kind, x0, sigma, **kwargs):
    return kind(x0=x0, sigma=sigma, noise=SeedNoise(), **kwargs)


# name: (solver factory, function, target, evaluation budget, check the mean (ES) or the best)
FAST_RUNS = {
    "es-sphere": (lambda: es(np.full(10, 3.0), 0.1, Adam(lr=0.05)), sphere, 1e-3, 8000, True),
    "es-rosenbrock": (lambda: es(np.zeros(5), 0.02, Adam(lr=0.01)), rosenbrock, 0.1, 40_000, True),
    "cma-sphere": (lambda: cma(CMAES, np.full(10, 3.0), 1.0), sphere, 1e-8, 4000, False),
    "cma-rosenbrock": (lambda: cma(CMAES, np.zeros(10), 0.5), rosenbrock, 1e-8, 12_000, False),
    "sep-sphere": (lambda: cma(SepCMAES, np.full(10, 3.0), 1.0), sphere, 1e-8, 3000, False),
    "sep-rosenbrock": (lambda: cma(SepCMAES, np.zeros(3), 0.5), rosenbrock, 1e-8, 80_000, False),
    "ga-sphere": (lambda: cma(GA, np.full(5, 3.0), 0.1), sphere, 1e-2, 30_000, False),
    "ga-rosenbrock": (lambda: cma(GA, np.zeros(5), 0.05), rosenbrock, 0.1, 30_000, False),
}
SLOW_RUNS = {
    "es-rosenbrock-10d": (
        lambda: es(np.zeros(10), 0.01, Adam(lr=0.003), population_size=40),
        rosenbrock,
        0.1,
        1_500_000,
        True,
    ),
    "sep-rosenbrock-10d": (
        lambda: cma(SepCMAES, np.zeros(10), 0.5),
        rosenbrock,
        1e-8,
        200_000,
        False,
    ),
    "ga-rosenbrock-10d": (
        lambda: cma(GA, np.zeros(10), 0.02, population_size=100),
        rosenbrock,
        0.5,
        1_500_000,
        False,
    ),
    "sep-sphere-1000d": (lambda: cma(SepCMAES, np.ones(1000), 0.5), sphere, 1e-6, 400_000, False),
}


@pytest.mark.parametrize("name", FAST_RUNS)
def test_solver_reaches_target(name):
    make, f, target, budget, on_mean = FAST_RUNS[name]
    evals = minimize(make(), f, target=target, max_evals=budget, on_mean=on_mean)
    assert evals is not None, f"{name} did not reach f < {target} in {budget} evaluations"


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_RUNS)
def test_solver_reaches_target_in_higher_dimensions(name):
    make, f, target, budget, on_mean = SLOW_RUNS[name]
    evals = minimize(make(), f, target=target, max_evals=budget, on_mean=on_mean)
    assert evals is not None, f"{name} did not reach f < {target} in {budget} evaluations"


def test_cma_es_matches_pycma_on_rosenbrock_10d():
    evals = [
        minimize(
            CMAES(x0=np.zeros(10), sigma=0.5, noise=SeedNoise()),
            rosenbrock,
            target=1e-8,
            max_evals=20_000,
            seed=seed,
        )
        for seed in range(5)
    ]
    reached = sorted(e for e in evals if e is not None)
    assert len(reached) >= 4, evals  # like pycma, a run may end in the local minimum
    assert np.median(reached) <= 1.5 * PYCMA_ROSENBROCK_10D_MEDIAN, evals


def test_cma_es_single_run_stalls_on_rastrigin_and_says_so():
    # The documented limit: one run with the default population ends in a local minimum of
    # Rastrigin; `stop_reason` tells when, so that a caller can restart (see the slow test).
    solver = CMAES(x0=np.full(5, 3.0), sigma=2.0, noise=SeedNoise())
    rng = np.random.default_rng(0)
    best = np.inf
    for _ in range(3000):
        if solver.stop_reason is not None:
            break
        infos = solver.ask(rng)
        values = [rastrigin(solver.candidate(i)) for i in infos]
        best = min(best, *values)
        solver.tell(infos, [-v for v in values])
    assert solver.stop_reason in ("tolfun", "tolx")
    assert best > 0.5  # a local minimum: Rastrigin's global minimum is 0


@pytest.mark.slow
def test_ipop_cma_es_solves_rastrigin_with_restarts():
    # IPOP-CMA-ES (Auger & Hansen 2005): restart from a random point with twice the
    # population whenever a run stops; 10-D Rastrigin needs populations of 160-320.
    for seed in range(3):
        rng = np.random.default_rng(seed)
        evals, population, best = 0, 0, np.inf
        while best >= 1e-8 and evals < 300_000:
            solver = CMAES(
                x0=rng.uniform(-4, 4, 10), sigma=2.0, noise=SeedNoise(), population_size=population
            )
            while solver.stop_reason is None and best >= 1e-8 and evals < 300_000:
                infos = solver.ask(rng)
                values = [rastrigin(solver.candidate(i)) for i in infos]
                evals += len(values)
                best = min(best, *values)
                solver.tell(infos, [-v for v in values])
            population = 2 * solver.population_size
        assert best < 1e-8, f"seed {seed}: best {best} after {evals} evaluations"


def test_es_mirrored_pairs_and_fitness_shaping_direction():
    solver = es(np.zeros(3), 0.1, SGD(lr=1.0), population_size=4)
    infos = solver.ask(np.random.default_rng(0))
    assert [i.sign for i in infos] == [1, -1, 1, -1]
    assert infos[0].key == infos[1].key and infos[2].key != infos[0].key
    np.testing.assert_allclose(
        solver.candidate(infos[0]) + solver.candidate(infos[1]), 0.0, atol=1e-12
    )
    # Reward the + side of the first pair: the mean moves along that noise vector.
    e = solver.perturbation(infos[0])
    solver.tell(infos, [1.0, 0.0, 0.5, 0.5])
    assert solver.version == 1
    assert float(solver.mean @ e) > 0


def test_es_update_is_the_documented_formula():
    solver = es(np.array([1.0, -1.0]), 0.5, SGD(lr=0.1), population_size=4, weight_decay=0.01)
    infos = solver.ask(np.random.default_rng(3))
    rewards = [3.0, 1.0, 0.0, 2.0]
    eps = [solver.perturbation(i) for i in infos]
    u = centered_ranks(rewards)
    g = sum(ui * e for ui, e in zip(u, eps, strict=True)) / (4 * 0.5)
    expected = np.array([1.0, -1.0]) - 0.1 * (-g + 0.01 * np.array([1.0, -1.0]))
    solver.tell(infos, rewards)
    np.testing.assert_allclose(solver.mean, expected, rtol=1e-13)


def test_es_staleness_rule_corrects_reweights_and_discards():
    x0 = np.array([0.5, -0.5, 2.0])
    solver = es(x0, 0.2, SGD(lr=0.05), population_size=4, max_staleness=1, staleness_decay=0.5)
    rng = np.random.default_rng(1)
    old = solver.ask(rng)  # version 0
    old_candidates = [solver.candidate(i) for i in old]
    solver.tell(old, [1.0, 2.0, 3.0, 4.0])  # -> version 1
    theta1 = solver.mean
    fresh = solver.ask(rng)  # version 1
    infos, rewards = [*fresh, old[0], old[3]], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    # Expected: stale samples count with their true offset from theta1, weighted 0.5.
    offsets = [solver.perturbation(i) for i in fresh] + [
        (c - theta1) / 0.2 for c in (old_candidates[0], old_candidates[3])
    ]
    weights = np.array([1, 1, 1, 1, 0.5, 0.5])
    u = centered_ranks(rewards) * weights
    g = sum(ui * e for ui, e in zip(u, offsets, strict=True)) / (0.2 * weights.sum())
    stats = solver.tell(infos, rewards)  # -> version 2
    assert (stats.used, stats.discarded, stats.version) == (6, 0, 2)
    np.testing.assert_allclose(solver.mean, theta1 + 0.05 * g, rtol=1e-12)
    # Version-0 samples are now 2 versions old: beyond max_staleness=1, discarded.
    newer = solver.ask(rng)
    stats = solver.tell([*newer, *old], [1, 2, 3, 4, 9, 9, 9, 9])
    assert (stats.used, stats.discarded) == (4, 4)
    with pytest.raises(NoUsableSamplesError, match="at least 2 usable samples, got 0 .4 discarded"):
        solver.tell(old, [1, 2, 3, 4])


def test_samples_from_the_future_are_refused():
    solver = CMAES(x0=np.zeros(3), sigma=1.0, noise=SeedNoise())
    with pytest.raises(FutureSampleError, match="drawn around version 5.*at version 0"):
        solver.tell([SamplingInfo(1, 1, 5), SamplingInfo(2, 1, 0)], [1.0, 2.0])


@pytest.mark.parametrize("kind", [CMAES, SepCMAES, GA])
def test_distribution_solvers_use_current_samples_only(kind):
    solver = kind(x0=np.zeros(4), sigma=0.3, noise=SeedNoise(), population_size=10)
    rng = np.random.default_rng(0)
    first = solver.ask(rng)
    solver.tell(first, np.arange(10.0))
    second = solver.ask(rng)
    stats = solver.tell(second + first[:3], np.arange(13.0))
    assert (stats.used, stats.discarded) == (10, 3)
    with pytest.raises(SampleError, match="current version 2 only"):
        solver.candidate(second[0])


def test_bad_batches_are_refused_with_the_fix():
    solver = es(np.zeros(2), 0.1, SGD(lr=0.1))
    infos = solver.ask(np.random.default_rng(0), 4)
    with pytest.raises(SampleError, match="4 sampling infos but 3 rewards"):
        solver.tell(infos, [1.0, 2.0, 3.0])
    with pytest.raises(SampleError, match="reward 2 is nan"):
        solver.tell(infos, [1.0, 2.0, float("nan"), 3.0])
    with pytest.raises(ConfigError, match="n=3 must be even"):
        solver.ask(np.random.default_rng(0), 3)
    with pytest.raises(ConfigError, match="sigma=0 must be positive"):
        CMAES(x0=np.zeros(2), sigma=0, noise=SeedNoise())
    with pytest.raises(ConfigError, match="elites=5 must be in"):
        GA(x0=np.zeros(2), sigma=1, noise=SeedNoise(), population_size=10, elites=5)


def test_ga_keeps_its_elite():
    solver = GA(x0=np.zeros(3), sigma=0.5, noise=SeedNoise(), population_size=6, parents=2)
    rng = np.random.default_rng(0)
    infos = solver.ask(rng)
    solver.tell(infos, [0, 0, 10, 0, 0, 0])
    best = solver.mean  # the individual that scored 10
    assert solver.best_reward == 10
    infos = solver.ask(rng)
    solver.tell(infos, [1, 2, 3, 4, 5, 6])  # all children worse: the elite survives
    assert solver.best_reward == 10
    np.testing.assert_array_equal(solver.mean, best)
