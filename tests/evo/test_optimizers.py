"""Optimizer steps against values worked out by hand (descent convention: params += step)."""

from __future__ import annotations

import numpy as np
import pytest

from parl_evo import SGD, Adam, ConfigError, Momentum, SolverStateError

G1 = np.array([1.0, -2.0])
G2 = np.array([0.5, 0.5])


def test_sgd():
    opt = SGD(lr=0.1)
    np.testing.assert_array_equal(opt.step(G1), [-0.1, 0.2])
    np.testing.assert_array_equal(opt.step(G2), [-0.05, -0.05])
    assert opt.state_dict() == {}
    with pytest.raises(SolverStateError, match="has no state"):
        opt.load_state_dict({"velocity": 1})


def test_momentum():
    opt = Momentum(lr=0.1, momentum=0.9)
    # v1 = g1 = [1, -2]; v2 = 0.9 v1 + g2 = [1.4, -1.3]
    np.testing.assert_allclose(opt.step(G1), [-0.1, 0.2], rtol=1e-15)
    np.testing.assert_allclose(opt.step(G2), [-0.14, 0.13], rtol=1e-15)
    np.testing.assert_allclose(opt.state_dict()["velocity"], [1.4, -1.3], rtol=1e-15)


def test_adam():
    opt = Adam(lr=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8)
    # t=1: m = [0.1, -0.2], v = [0.001, 0.004]; bias-corrected m^ = g1, v^ = g1**2, so the
    # step is -0.1 * g1 / (|g1| + 1e-8) = [-0.1 / (1 + 1e-8), 0.2 / (2 + 1e-8)].
    np.testing.assert_allclose(opt.step(G1), [-0.099999999, 0.0999999995], rtol=1e-12)
    # t=2: m = 0.9 m + 0.1 g2 = [0.14, -0.13]; v = 0.999 v + 0.001 g2**2 = [0.001249, 0.004246];
    # m^ = m / 0.19, v^ = v / 0.001999; step = -0.1 m^ / (sqrt(v^) + 1e-8).
    np.testing.assert_allclose(opt.step(G2), [-0.0932179627018, 0.0469468167987], rtol=1e-11)
    state = opt.state_dict()
    assert state["t"] == 2
    np.testing.assert_allclose(state["m"], [0.14, -0.13], rtol=1e-15)
    np.testing.assert_allclose(state["v"], [0.001249, 0.004246], rtol=1e-14)


@pytest.mark.parametrize(
    "make",
    [lambda: Momentum(lr=0.01, momentum=0.5), lambda: Adam(lr=0.01, beta1=0.8, beta2=0.99)],
)
def test_state_round_trip_continues_exactly(make):
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((6, 4))
    straight = make()
    steps = [straight.step(g) for g in grads]
    first, second = make(), make()
    for g in grads[:3]:
        first.step(g)
    second.load_state_dict(first.state_dict())
    resumed = [second.step(g) for g in grads[3:]]
    for a, b in zip(steps[3:], resumed, strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SGD(lr=0), "lr=0 must be positive"),
        (lambda: Momentum(lr=1, momentum=1.0), "momentum=1.0 must be in"),
        (lambda: Adam(lr=1, beta2=1.5), "beta2=1.5 must be in"),
        (lambda: Adam(lr=1, epsilon=0), "epsilon=0 must be positive"),
    ],
)
def test_bad_arguments(make, message):
    with pytest.raises(ConfigError, match=message):
        make()
