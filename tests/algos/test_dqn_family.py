"""The DQN family's pieces against hand-computed values: C51's projection, the quantile Huber
loss, noisy layers, dueling heads, and the options of `DQN` on one tiny batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parl.algorithms import C51, DDQN, DQN, QRDQN, DuelingDQN, Rainbow
from parl.utils import NStepAdder, ReplayMemory
from parl_algos.agents import DQNAgent
from parl_algos.functional import categorical_projection, quantile_huber_loss
from parl_algos.nets import DuelingHead, NoisyLinear, QHead, QNetwork, noise_free, reset_noise

SUPPORT = torch.tensor([0.0, 1.0, 2.0])  # v_min 0, v_max 2, delta z 1


def _project(probs, reward, discount):
    return categorical_projection(
        torch.tensor([probs]), torch.tensor([reward]), torch.tensor([discount]), SUPPORT
    )[0]


@pytest.mark.parametrize(
    ("probs", "reward", "discount", "expected"),
    [
        # Tz = 0.5, 1.5, 2.5 -> 2 (clipped): halves between neighbours, the top atom stays.
        ([1 / 3, 1 / 3, 1 / 3], 0.5, 1.0, [1 / 6, 1 / 3, 1 / 2]),
        # Atoms at the support's ends: all of the mass pushed past v_max lands on v_max ...
        ([0.0, 0.0, 1.0], 1.0, 1.0, [0.0, 0.0, 1.0]),
        # ... and past v_min on v_min.
        ([0.2, 0.3, 0.5], -5.0, 1.0, [1.0, 0.0, 0.0]),
        # Tz landing exactly on atoms (lower == upper) keeps all its mass there.
        ([0.2, 0.3, 0.5], 1.0, 1.0, [0.0, 0.2, 0.8]),
        # Discount 0.5: Tz = 0, 0.5, 1 -> atom 0 gets 0.2 + 0.15, atom 1 gets 0.15 + 0.5.
        ([0.2, 0.3, 0.5], 0.0, 0.5, [0.35, 0.65, 0.0]),
        # Terminal (discount 0): every atom moves to r = 0.25, split 0.75 / 0.25.
        ([0.2, 0.3, 0.5], 0.25, 0.0, [0.75, 0.25, 0.0]),
    ],
)
def test_categorical_projection_by_hand(probs, reward, discount, expected):
    target = _project(probs, reward, discount)
    torch.testing.assert_close(target, torch.tensor(expected))
    assert target.sum().item() == pytest.approx(1.0)


def test_categorical_projection_of_a_batch_keeps_rows_apart():
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    target = categorical_projection(
        probs, torch.tensor([0.5, 0.0]), torch.tensor([1.0, 0.0]), SUPPORT
    )
    torch.testing.assert_close(target, torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))


def test_quantile_huber_loss_by_hand():
    # Quantiles 0 and 1 at tau = 0.25, 0.75; targets 0.5 and 3; kappa = 1.
    # i=0: u = 0.5 -> 0.25 * 0.125; u = 3 -> 0.25 * 2.5.   mean: 0.328125
    # i=1: u = -0.5 -> |0.75 - 1| * 0.125; u = 2 -> 0.75 * 1.5.   mean: 0.578125
    theta = torch.tensor([[0.0, 1.0]], requires_grad=True)
    loss = quantile_huber_loss(theta, torch.tensor([[0.5, 3.0]]), kappa=1.0)
    torch.testing.assert_close(loss, torch.tensor([0.90625]))
    # kappa = 0: the plain quantile loss |tau - 1{u<0}| |u|.
    plain = quantile_huber_loss(theta, torch.tensor([[0.5, 3.0]]), kappa=0.0)
    expected = (0.25 * 0.5 + 0.25 * 3.0) / 2 + (0.25 * 0.5 + 0.75 * 2.0) / 2
    torch.testing.assert_close(plain, torch.tensor([expected]))
    # Its minimiser over one quantile of a sample set is that quantile of the samples.
    samples = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    theta = torch.zeros(1, 2, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=0.05)
    for _ in range(400):
        opt.zero_grad()
        quantile_huber_loss(theta, samples, kappa=0.0).sum().backward()
        opt.step()
    assert 1.0 <= theta[0, 0].item() <= 2.0 and 3.0 <= theta[0, 1].item() <= 4.0


def test_noisy_layer_noise_is_factorised_fixed_until_reset_and_off_in_eval():
    torch.manual_seed(0)
    layer = NoisyLinear(3, 2, sigma0=0.5)
    assert layer.weight_sigma.detach().allclose(torch.full((2, 3), 0.5 / np.sqrt(3)))
    # Factorised: eps_w = f(eps_out) f(eps_in)^T with eps_b = f(eps_out).
    eps_out = layer.bias_epsilon
    f_in = layer.weight_epsilon[0] / eps_out[0]
    torch.testing.assert_close(layer.weight_epsilon, torch.outer(eps_out, f_in))
    x = torch.randn(4, 3)
    first, again = layer(x), layer(x)
    torch.testing.assert_close(first, again)  # the noise stays until it is reset
    reset_noise(layer)
    assert not torch.allclose(layer(x), first)
    layer.eval()
    mean = x @ layer.weight_mu.T + layer.bias_mu
    torch.testing.assert_close(layer(x), mean)  # evaluation: the means only
    reset_noise(layer)
    torch.testing.assert_close(layer(x), mean)  # ... whatever the noise
    assert set(layer.state_dict()) == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}


def test_dueling_head_combines_value_and_centred_advantage():
    head = DuelingHead(2, 3)
    with torch.no_grad():
        head.value.weight.copy_(torch.tensor([[1.0, 0.0]]))
        head.value.bias.zero_()
        head.advantage.weight.copy_(torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0]]))
        head.advantage.bias.zero_()
    q = head(torch.tensor([[5.0, 1.0]]))  # V = 5, A = 1, 2, 3 (mean 2)
    torch.testing.assert_close(q, torch.tensor([[4.0, 5.0, 6.0]]))
    assert DuelingHead(2, 3, n_atoms=4)(torch.zeros(5, 2)).shape == (5, 3, 4)
    assert QHead(2, 3, n_atoms=4)(torch.zeros(5, 2)).shape == (5, 3, 4)
    assert QNetwork(4, 2, dueling=True, noisy=True, n_atoms=7)(torch.zeros(3, 4)).shape == (
        3,
        2,
        7,
    )


def _batch(b: int = 8):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, 4, generator=g),
        torch.randint(0, 2, (b,), generator=g),
        torch.randn(b, generator=g),
        torch.randn(b, 4, generator=g),
        (torch.arange(b) % 3 == 0).float(),
    )


def test_n_step_discounts_the_bootstrap_by_gamma_to_the_n():
    torch.manual_seed(0)
    obs, action, reward, next_obs, terminal = _batch()
    model = QNetwork(4, 2, (8,))
    alg = DQN(model, lr=1e-9, gamma=0.9, n_step=3, double=False, loss="mse")
    with torch.no_grad():
        next_q = alg.target_model(next_obs).max(dim=1).values
        q = model(obs).gather(1, action.unsqueeze(1)).squeeze(1)
    y = reward + 0.9**3 * (1 - terminal) * next_q
    stats = alg.learn(obs, action, reward, next_obs, terminal)
    np.testing.assert_allclose(stats.td_error, (y - q).abs().numpy(), rtol=1e-5)
    assert stats.loss == pytest.approx(((y - q) ** 2).mean().item(), rel=1e-5)


class _Recording(ReplayMemory):
    """A replay memory that keeps the last batch it gave."""

    def sample_batch(self, batch_size):
        self.last = super().sample_batch(batch_size)
        return self.last


def test_a_truncated_episodes_last_windows_bootstrap_by_gamma_to_their_own_steps():
    """An episode cut by its time limit after 2 steps, with 3-step returns: windows of 2 and 1."""
    torch.manual_seed(0)
    obs = torch.randn(3, 4)  # s_0, s_1 and the final observation s_2
    model = QNetwork(4, 2, (8,))
    alg = DQN(model, lr=1e-9, gamma=0.9, n_step=3, double=False, loss="mse")
    memory = _Recording(8, 4, 0, seed=0)
    adder = NStepAdder(memory, n_step=3, gamma=0.9)
    adder.append(obs[0].numpy(), 1, 1.0, obs[1].numpy(), False)
    adder.append(obs[1].numpy(), 0, 2.0, obs[2].numpy(), False, truncated=True)
    with torch.no_grad():
        next_q = alg.target_model(obs[2:]).max(dim=1).values[0]
        q = model(obs[:2]).gather(1, torch.tensor([[1], [0]])).squeeze(1)
    y = torch.stack([1.0 + 0.9 * 2.0 + 0.9**2 * next_q, 2.0 + 0.9 * next_q])
    stats = DQNAgent(alg, 2).learn(memory, 16)
    row = torch.from_numpy(memory.last.obs[:, 0] == obs[1, 0].numpy()).long()  # 0: s_0's window
    assert 0 < int(row.sum()) < 16  # both windows are in the batch
    np.testing.assert_allclose(stats.td_error, (y - q)[row].abs().numpy(), rtol=1e-5)
    # Given to the learner directly, a row's discount replaces gamma^n_step.
    b_obs, action, reward, next_obs, terminal = _batch()
    discount = 0.9 ** torch.tensor([3.0, 3.0, 2.0, 1.0, 3.0, 2.0, 1.0, 3.0])
    with torch.no_grad():
        next_q = alg.target_model(next_obs).max(dim=1).values
        q = model(b_obs).gather(1, action.unsqueeze(1)).squeeze(1)
    y = reward + discount * (1 - terminal) * next_q
    stats = alg.learn(b_obs, action, reward, next_obs, terminal, discount=discount)
    np.testing.assert_allclose(stats.td_error, (y - q).abs().numpy(), rtol=1e-5)


def test_c51_loss_is_the_kl_divergence_from_the_projected_target():
    torch.manual_seed(0)
    obs, action, reward, next_obs, terminal = _batch()
    model = QNetwork(4, 2, (8,), n_atoms=5)
    alg = C51(model, lr=1e-9, gamma=0.5, n_atoms=5, v_min=-2, v_max=2)
    support = torch.linspace(-2, 2, 5)
    with torch.no_grad():
        next_probs = alg.target_model(next_obs).softmax(-1)
        next_action = (next_probs * support).sum(-1).argmax(1)  # C51: the target's own argmax
        p = next_probs[torch.arange(8), next_action]
        m = categorical_projection(p, reward, 0.5 * (1 - terminal), support)
        log_p = model(obs).log_softmax(-1)[torch.arange(8), action]
    stats = alg.learn(obs, action, reward, next_obs, terminal)
    kl = (torch.where(m > 0, m * m.log(), 0.0) - m * log_p).sum(-1)  # KL(m || p)
    np.testing.assert_allclose(stats.td_error, kl.numpy(), rtol=1e-5, atol=1e-6)
    q = alg.predict(obs)
    assert q.shape == (8, 2) and q.min() >= -2 and q.max() <= 2

    # Prioritizing by the cross-entropy adds the target's entropy to the priority alone.
    torch.manual_seed(0)
    model = QNetwork(4, 2, (8,), n_atoms=5)
    alg = C51(model, lr=1e-9, gamma=0.5, n_atoms=5, v_min=-2, v_max=2, c51_priority="cross_entropy")
    stats = alg.learn(obs, action, reward, next_obs, terminal)
    np.testing.assert_allclose(stats.td_error, -(m * log_p).sum(-1).numpy(), rtol=1e-5)
    assert stats.loss == pytest.approx(kl.mean().item(), rel=1e-5)
    with pytest.raises(ValueError, match="c51_priority='l2' must be 'kl' or 'cross_entropy'"):
        C51(QNetwork(4, 2, (8,), n_atoms=5), c51_priority="l2")


def test_qr_dqn_loss_regresses_quantiles_on_the_shifted_target_quantiles():
    torch.manual_seed(0)
    obs, action, reward, next_obs, terminal = _batch()
    model = QNetwork(4, 2, (8,), n_atoms=4)
    alg = QRDQN(model, lr=1e-9, gamma=0.5, n_atoms=4)
    with torch.no_grad():
        next_theta = alg.target_model(next_obs)
        a = next_theta.mean(-1).argmax(1)
        target = reward[:, None] + 0.5 * (1 - terminal[:, None]) * next_theta[torch.arange(8), a]
        theta = model(obs)[torch.arange(8), action]
    stats = alg.learn(obs, action, reward, next_obs, terminal)
    expected = quantile_huber_loss(theta, target, kappa=1.0)
    np.testing.assert_allclose(stats.td_error, expected.numpy(), rtol=1e-5)
    torch.testing.assert_close(alg.predict(obs), model(obs).mean(-1).detach())


def test_named_variants_set_their_options_and_check_the_model():
    plain, dueling = QNetwork(4, 2), QNetwork(4, 2, dueling=True)
    assert DDQN(plain).double and DuelingDQN(dueling).dueling
    c51 = C51(QNetwork(4, 2, n_atoms=51))
    assert (c51.distributional, c51.n_atoms, c51.double) == ("c51", 51, False)
    assert QRDQN(QNetwork(4, 2, n_atoms=200)).n_atoms == 200
    rainbow = Rainbow(QNetwork(4, 2, dueling=True, noisy=True, n_atoms=51))
    assert (rainbow.n_step, rainbow.noisy, rainbow.dueling, rainbow.double) == (3, True, True, True)
    assert rainbow.distributional == "c51"
    with pytest.raises(ValueError, match="dueling=True but the model has no DuelingHead"):
        DuelingDQN(plain)
    with pytest.raises(ValueError, match="noisy=True but the model has no NoisyLinear"):
        Rainbow(QNetwork(4, 2, dueling=True, n_atoms=51))
    with pytest.raises(ValueError, match="n_atoms=51"):
        C51(plain).learn(*_batch())
    with pytest.raises(ValueError, match="distributional='iqn'"):
        DQN(plain, distributional="iqn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="adam_eps=0.0 must be positive"):
        DQN(plain, adam_eps=0.0)


def test_noisy_learning_draws_new_noise_and_evaluation_is_deterministic():
    torch.manual_seed(0)
    model = QNetwork(4, 2, (8,), dueling=True, noisy=True, n_atoms=5)
    alg = Rainbow(model, lr=1e-3, n_atoms=5)
    obs = _batch()[0]
    before = model.head.advantage.weight_epsilon.clone()
    alg.learn(*_batch())
    assert not torch.equal(model.head.advantage.weight_epsilon, before)
    model.eval()
    first = alg.predict(obs)
    reset_noise(model)
    torch.testing.assert_close(alg.predict(obs), first)


def test_acting_noise_free_uses_the_means_and_gives_the_mode_back():
    from parl_algos.agents import DQNAgent

    torch.manual_seed(0)
    model = QNetwork(4, 3, (8,), dueling=True, noisy=True)
    dropout = torch.nn.Dropout(0.5)  # not a noisy layer: keeps its mode
    model.add_module("extra", dropout)
    obs = _batch(256)[0]
    model.eval()
    means = model(obs)
    model.train()
    noisy = model(obs)
    assert means.argmax(dim=1).tolist() != noisy.argmax(dim=1).tolist()
    with noise_free(model):
        torch.testing.assert_close(model(obs), means)
        assert dropout.training and not model.head.advantage.training
    assert model.head.advantage.training and model.training
    torch.testing.assert_close(model(obs), noisy)
    # The agent's greedy action (epsilon 0) on the means, or on the noise.
    for act_with_noise, q in ((False, means), (True, noisy)):
        alg = DQN(model, lr=1e-3, noisy=True, dueling=True)
        agent = DQNAgent(alg, 3, eps_start=0.0, eps_end=0.0, act_with_noise=act_with_noise)
        actions = [agent.sample(o.numpy()) for o in obs]
        assert actions == q.argmax(dim=1).tolist()
        assert model.training


# Learning to a threshold: `examples/dqn/train.py` with each member's flags and a light
# schedule (64-unit layers, 16 updates every 64 env steps after 500), seed 1, in a fresh
# interpreter. Threshold: the mean return of the last 10 training episodes reaches 195 on
# CartPole-v1 within 30k env steps (seed 1: QR-DQN at 14.1k, Rainbow at 5.4k). About a minute
# each on 2 quiet cores; 4-5 minutes when the machine ran 6 times more processes than cores.
LIGHT = ["--hidden-size", "64", "--learning-starts", "500", "--train-freq", "64"]
LIGHT += ["--gradient-steps", "16"]
RAINBOW = ["--distributional", "c51", "--n-step", "3", "--dueling", "--noisy", "--prioritized"]
LEARNING = {
    "QRDQN": ["--distributional", "qr", "--n-atoms", "10", "--no-double", *LIGHT],
    "Rainbow": [*RAINBOW, *LIGHT],
}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(LEARNING))
def test_reaches_195_on_cartpole_within_30k_steps(name, tmp_path):
    from tests.e2e.example_runner import run_example

    result = run_example(
        "dqn",
        tmp_path,
        *LEARNING[name],
        "--seed",
        "1",
        "--total-steps",
        "30000",
        "--target-return",
        "195",
        "--stop-at-target",
        "--eval-every",
        "0",
        "--logdir",
        str(tmp_path / "out"),
        timeout=580,
    )
    assert result["reached_at"] is not None and result["reached_at"] <= 30_000, result
    assert result["final_mean_return"] >= 195
