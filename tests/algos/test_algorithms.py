"""Behaviour of single updates: targets, schedules and adaptive coefficients of the zoo."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import parl
from parl.algorithms import A2C, DQN, IMPALA, PPO, SAC, TD3
from parl_algos.agents import IMPALAAgent
from parl_algos.nets import ActorCriticMLP, ContinuousActorCriticMLP
from tests.algos.models import FixedGaussianPolicy


class LinearQ(parl.Model):
    def __init__(self, weight):
        super().__init__()
        self.fc = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor(weight))

    def forward(self, obs):
        return self.fc(obs)


@pytest.mark.parametrize(
    ("double", "terminal", "target"),
    [(True, 0.0, 1 + 0.5 * 3), (False, 0.0, 1 + 0.5 * 5), (True, 1.0, 1.0)],
)
def test_dqn_target_double_vanilla_and_terminal(double, terminal, target):
    # Online Q(s') = [1, 2] picks action 1; target Q(s') = [5, 3]. Q(s, a=0) = 0.
    alg = DQN(LinearQ([[1.0, 0.0], [2.0, 0.0]]), lr=1e-9, gamma=0.5, double=double, loss="mse")
    alg.target_model.set_weights({"fc.weight": torch.tensor([[5.0, 0.0], [3.0, 0.0]]).numpy()})
    stats = alg.learn(
        obs=torch.tensor([[0.0, 1.0]]),
        action=torch.tensor([0]),
        reward=torch.tensor([1.0]),
        next_obs=torch.tensor([[1.0, 0.0]]),
        terminal=torch.tensor([terminal]),
    )
    assert stats.loss == pytest.approx(target**2)
    assert stats.td_error.tolist() == pytest.approx([target])


def test_dqn_importance_weights_scale_the_loss_and_sync_copies_the_model():
    alg = DQN(LinearQ([[1.0, 0.0], [2.0, 0.0]]), lr=1e-9, gamma=0.5, loss="mse")
    batch = dict(
        obs=torch.tensor([[0.0, 1.0], [0.0, 1.0]]),
        action=torch.tensor([0, 0]),
        reward=torch.tensor([1.0, 2.0]),
        next_obs=torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
        terminal=torch.tensor([1.0, 1.0]),
    )
    stats = alg.learn(**batch, weight=torch.tensor([0.5, 0.25]))
    assert stats.loss == pytest.approx((0.5 * 1 + 0.25 * 4) / 2)
    alg.model.fc.weight.data.fill_(7.0)
    alg.sync_target()
    assert torch.equal(alg.target_model.fc.weight, alg.model.fc.weight)


def _cartpole_batch(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, 4, generator=g),
        torch.randint(0, 2, (n,), generator=g),
        torch.randn(n, generator=g),
        torch.randn(n, generator=g),
    )


@pytest.mark.parametrize(("lr", "direction"), [(0.05, 2.0), (1e-7, 0.5)])
def test_ppo_kl_penalty_coefficient_adapts(lr, direction):
    torch.manual_seed(0)
    alg = PPO(ActorCriticMLP(4, 2), lr=lr, variant="kl", kl_target=0.01, kl_coef=1.0, seed=0)
    stats = alg.learn(*_cartpole_batch())
    assert alg.kl_coef == pytest.approx(direction) == stats.kl_coef
    assert stats.updates == alg.update_epochs  # one minibatch of 64 per epoch


def test_ppo_first_minibatch_has_ratio_one_and_clip_fraction_grows_with_lr():
    torch.manual_seed(0)
    gentle = PPO(ActorCriticMLP(4, 2), lr=1e-6, update_epochs=1, seed=0).learn(*_cartpole_batch())
    torch.manual_seed(0)
    wild = PPO(ActorCriticMLP(4, 2), lr=0.1, update_epochs=8, minibatch_size=16, seed=0)
    stats = wild.learn(*_cartpole_batch())
    assert gentle.clip_fraction == 0.0 and gentle.approx_kl < 1e-6
    assert stats.clip_fraction > 0.0 and stats.approx_kl > gentle.approx_kl


class _TorchStepPPO(PPO):
    """PPO with torch's own `clip_grad_norm_` and `Adam.step` on every minibatch."""

    def _lean_step(self, optimizer, params):
        return False


def test_ppo_lean_step_matches_torchs_clip_and_adam_to_the_bit():
    results = []
    for cls in (PPO, _TorchStepPPO):
        torch.manual_seed(0)
        alg = cls(ActorCriticMLP(4, 2), lr=0.01, update_epochs=3, minibatch_size=16, seed=0)
        alg.optimizer.param_groups[0]["lr"] = 0.005  # annealed between calls, as parl-train does
        stats = [alg.learn(*_cartpole_batch(seed=s)) for s in range(2)]
        state = alg.optimizer.state_dict()["state"]
        results.append((stats, [p.detach().clone() for p in alg.model.parameters()], state))
    (lean_stats, lean_params, lean_state), (stats, params, state) = results
    assert lean_stats == stats and lean_stats[1].updates == 12
    assert all(torch.equal(a, b) for a, b in zip(lean_params, params, strict=True))
    for i in state:
        assert all(torch.equal(lean_state[i][k], state[i][k]) for k in state[i])


def _learned(alg):
    """`alg`'s parameters and Adam state after learning, cloned."""
    state = alg.optimizer.state_dict()["state"]
    return [p.detach().clone() for p in alg.model.parameters()], {
        i: {k: v.clone() for k, v in s.items()} for i, s in state.items()
    }


@pytest.mark.parametrize("how", ["load_state_dict", "pickle", "to"])
def test_ppo_lean_step_still_matches_torchs_after_its_tensors_are_rebound(how):
    """The flat tensors of the lean step are made again when a resume, a copy or `.to`
    rebinds the parameters or Adam's state; the steps stay torch's to the bit."""
    import pickle

    results = []
    for cls in (PPO, _TorchStepPPO):
        torch.manual_seed(0)
        alg = cls(ActorCriticMLP(4, 2), lr=0.01, update_epochs=2, minibatch_size=16, seed=0)
        alg.learn(*_cartpole_batch(seed=0))
        if how == "load_state_dict":
            torch.manual_seed(1)
            resumed = cls(ActorCriticMLP(4, 2), lr=0.01, update_epochs=2, minibatch_size=16)
            resumed.load_state_dict(alg.state_dict())
            resumed._generator.set_state(alg._generator.get_state())
            alg = resumed
        elif how == "pickle":
            alg = pickle.loads(pickle.dumps(alg))
        else:
            alg.model.to(torch.float64).to(torch.float32)  # new tensors for every parameter
        alg.learn(*_cartpole_batch(seed=1))
        assert _one_flat_tensor(alg) == (cls is PPO)  # made again, not left to torch
        results.append(_learned(alg))
    (lean_params, lean_state), (params, state) = results
    assert all(torch.equal(a, b) for a, b in zip(lean_params, params, strict=True))
    for i in state:
        assert all(torch.equal(lean_state[i][k], state[i][k]) for k in state[i])


def _one_flat_tensor(alg):
    """Whether the parameters and Adam's moments are views of the lean step's flat tensors."""
    params = list(alg.model.parameters())
    flat = alg._flat_step.flat_tensors(alg.optimizer)
    if flat is None or flat[0].numel() != sum(p.numel() for p in params):
        return False
    state = alg.optimizer.state
    return all(
        t.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
        for whole, key in zip(flat, (None, "exp_avg", "exp_avg_sq"), strict=True)
        for t in (params if key is None else [state[p][key] for p in params])
    )


def test_ppo_value_clipping_needs_the_old_values():
    alg = PPO(ActorCriticMLP(4, 2), clip_value=0.2)
    with pytest.raises(ValueError, match="needs `value=`"):
        alg.learn(*_cartpole_batch())


def test_a2c_loss_terms_by_hand():
    torch.manual_seed(0)
    model = ActorCriticMLP(4, 2)
    alg = A2C(model, lr=1e-9, vf_coef=0.5, ent_coef=0.1)
    obs, action, advantage, target = _cartpole_batch(8)
    with torch.no_grad():
        dist = torch.distributions.Categorical(logits=model.policy(obs))
        policy_loss = -(advantage * dist.log_prob(action)).mean()
        value_loss = ((model.value(obs) - target) ** 2).mean()
        entropy = dist.entropy().mean()
    stats = alg.learn(obs, action, advantage, target)
    assert stats.policy_loss == pytest.approx(policy_loss.item(), rel=1e-5)
    assert stats.value_loss == pytest.approx(value_loss.item(), rel=1e-5)
    assert stats.entropy == pytest.approx(entropy.item(), rel=1e-5)


def test_impala_on_policy_batch_has_unit_importance_weights():
    torch.manual_seed(0)
    alg = IMPALA(ActorCriticMLP(4, 2))
    obs = torch.randn(6, 3, 4)
    with torch.no_grad():
        logits = alg.model.policy(obs[:-1])
    action = torch.distributions.Categorical(logits=logits).sample()
    stats = alg.learn(obs, action, logits, torch.ones(5, 3), torch.zeros(5, 3))
    assert stats.mean_rho == pytest.approx(1.0)


@pytest.mark.parametrize(("target_entropy", "moves"), [(-10.0, "down"), (10.0, "up")])
def test_sac_temperature_follows_the_entropy_target(target_entropy, moves):
    alg = SAC(FixedGaussianPolicy([0.0], [0.0]), alpha_lr=0.1, target_entropy=target_entropy)
    batch = (torch.zeros(32, 1), torch.zeros(32, 1), torch.zeros(32), torch.zeros(32, 1))
    alg.learn(*batch, torch.zeros(32))
    assert (alg.alpha < 1.0) if moves == "down" else (alg.alpha > 1.0)


def test_sac_fixed_alpha_stays():
    alg = SAC(FixedGaussianPolicy([0.0], [0.0]), alpha=0.2)
    batch = (torch.zeros(8, 1), torch.zeros(8, 1), torch.zeros(8), torch.zeros(8, 1))
    stats = alg.learn(*batch, torch.zeros(8))
    assert stats.alpha == pytest.approx(0.2) and stats.alpha_loss == 0.0


def test_td3_updates_the_actor_every_policy_delay_calls():
    alg = TD3(ContinuousActorCriticMLP(3, 1, (16, 16), twin=True), policy_delay=3, seed=0)
    batch = (torch.randn(8, 3), torch.rand(8, 1), torch.randn(8), torch.randn(8, 3), torch.zeros(8))
    actor_before = [p.clone() for p in alg.model.get_actor_params()]
    losses = [alg.learn(*batch).actor_loss for _ in range(6)]
    assert [loss is None for loss in losses] == [True, True, False, True, True, False]
    assert any(
        not torch.equal(a, b)
        for a, b in zip(actor_before, alg.model.get_actor_params(), strict=True)
    )


def test_models_without_the_needed_methods_are_refused():
    with pytest.raises(TypeError, match="policy"):
        A2C(LinearQ([[0.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(TypeError, match="get_actor_params"):
        SAC(ActorCriticMLP(4, 2))
    with pytest.raises(ValueError, match="lr=0 must be positive"):
        PPO(ActorCriticMLP(4, 2), lr=0)


def test_impala_agent_drives_impala_only():
    with pytest.raises(TypeError, match="IMPALAAgent drives IMPALA, got A2C"):
        IMPALAAgent(A2C(ActorCriticMLP(4, 2)))
