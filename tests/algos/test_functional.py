"""The zoo's return estimators and losses against values computed by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from parl_algos.functional import (
    gae,
    ppo_clip_loss,
    sac_actor_loss,
    sac_alpha_loss,
    td_target,
    vtrace,
)


def test_td_target_stops_at_termination_but_bootstraps_through_truncation():
    reward = torch.tensor([1.0, 1.0, 1.0])
    next_value = torch.tensor([10.0, 10.0, 10.0])
    # transition 0 terminated; 1 was truncated by a time limit (terminated=0); 2 is mid-episode.
    terminated = torch.tensor([1.0, 0.0, 0.0])
    y = td_target(reward, next_value, terminated, gamma=0.9)
    torch.testing.assert_close(y, torch.tensor([1.0, 10.0, 10.0]))
    # Boolean flags work the same.
    torch.testing.assert_close(td_target(reward, next_value, terminated.bool(), 0.9), y)


def test_gae_by_hand_with_a_truncation_and_a_termination():
    # Step 1 is truncated (bootstraps from its final observation's value, 4.0, but the
    # advantage recursion stops there); step 2 terminates.
    reward = torch.tensor([1.0, 2.0, 3.0])
    value = torch.tensor([0.5, 1.0, 1.5])
    next_value = torch.tensor([1.0, 4.0, 2.0])
    terminated = torch.tensor([0.0, 0.0, 1.0])
    done = torch.tensor([0.0, 1.0, 1.0])
    advantage = gae(reward, value, next_value, terminated, done, gamma=0.9, lam=0.8)
    delta0 = 1 + 0.9 * 1.0 - 0.5  # 1.4
    delta1 = 2 + 0.9 * 4.0 - 1.0  # 4.6
    delta2 = 3 - 1.5  # 1.5: no bootstrap after termination
    expected = [delta0 + 0.9 * 0.8 * delta1, delta1, delta2]
    torch.testing.assert_close(advantage, torch.tensor(expected))


def test_gae_lambda_one_is_the_discounted_return_minus_the_value():
    reward = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 1.0]])  # (T=3, N=2)
    value = torch.tensor([[0.3, 0.1], [0.2, 0.4], [0.1, 0.9]])
    next_value = torch.cat([value[1:], torch.tensor([[5.0, 7.0]])])
    zeros = torch.zeros(3, 2)
    advantage = gae(reward, value, next_value, zeros, zeros, gamma=0.5, lam=1.0)
    returns = torch.tensor(
        [
            [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 5, 0 + 0.5 * 1 + 0.25 * 1 + 0.125 * 7],
            [2 + 0.5 * 3 + 0.25 * 5, 1 + 0.5 * 1 + 0.25 * 7],
            [3 + 0.5 * 5, 1 + 0.5 * 7],
        ]
    )
    torch.testing.assert_close(advantage, returns - value)


def _vtrace_reference(log_rho, discount, reward, value, bootstrap, rho_bar, c_bar):
    """Espeholt et al. 2018, eq. 1, summed term by term (per-step discounts gamma_t).

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) rho_t delta_t,
    delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t).
    """
    steps, batch = len(reward), len(reward[0])
    rho = [[min(rho_bar, math.exp(log_rho[t][b])) for b in range(batch)] for t in range(steps)]
    c = [[min(c_bar, math.exp(log_rho[t][b])) for b in range(batch)] for t in range(steps)]
    values = [[*[value[t][b] for t in range(steps)], bootstrap[b]] for b in range(batch)]
    vs = [[0.0] * batch for _ in range(steps)]
    adv = [[0.0] * batch for _ in range(steps)]
    for b in range(batch):
        for s in range(steps):
            total = values[b][s]
            for t in range(s, steps):
                weight = 1.0
                for i in range(s, t):
                    weight *= discount[i][b] * c[i][b]
                delta = reward[t][b] + discount[t][b] * values[b][t + 1] - values[b][t]
                total += weight * rho[t][b] * delta
            vs[s][b] = total
    for b in range(batch):
        for s in range(steps):
            next_vs = vs[s + 1][b] if s + 1 < steps else bootstrap[b]
            adv[s][b] = rho[s][b] * (reward[s][b] + discount[s][b] * next_vs - values[b][s])
    return torch.tensor(vs), torch.tensor(adv)


@pytest.mark.parametrize(("rho_bar", "c_bar"), [(1.0, 1.0), (2.0, 0.5), (0.8, 1.2)])
def test_vtrace_matches_the_papers_equation(rho_bar, c_bar):
    generator = torch.Generator().manual_seed(0)
    steps, batch = 6, 3
    log_rho = torch.randn(steps, batch, generator=generator, dtype=torch.float64)
    discount = torch.full((steps, batch), 0.9, dtype=torch.float64)
    discount[2, 0] = 0.0  # an episode ends mid-trajectory
    discount[4, 2] = 0.0
    reward = torch.randn(steps, batch, generator=generator, dtype=torch.float64)
    value = torch.randn(steps, batch, generator=generator, dtype=torch.float64)
    bootstrap = torch.randn(batch, generator=generator, dtype=torch.float64)
    vs, adv = vtrace(log_rho, discount, reward, value, bootstrap, rho_bar=rho_bar, c_bar=c_bar)
    ref_vs, ref_adv = _vtrace_reference(
        log_rho.tolist(),
        discount.tolist(),
        reward.tolist(),
        value.tolist(),
        bootstrap.tolist(),
        rho_bar,
        c_bar,
    )
    torch.testing.assert_close(vs, ref_vs.to(vs.dtype))
    torch.testing.assert_close(adv, ref_adv.to(adv.dtype))


def test_vtrace_on_policy_is_the_bootstrapped_discounted_return():
    reward = torch.tensor([[1.0], [2.0], [3.0]])
    value = torch.tensor([[9.0], [9.0], [9.0]])  # any value: on-policy V-trace ignores it
    discount = torch.full((3, 1), 0.5)
    vs, _ = vtrace(torch.zeros(3, 1), discount, reward, value, torch.tensor([4.0]))
    torch.testing.assert_close(
        vs, torch.tensor([[1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4], [2 + 0.5 * 3 + 0.25 * 4], [5.0]])
    )


def test_ppo_clip_loss_by_hand_and_its_gradient():
    ratio = torch.tensor([0.5, 1.0, 1.5, 1.5], requires_grad=True)
    advantage = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss = ppo_clip_loss(ratio, advantage, clip_coef=0.2)
    # min(r A, clip(r) A): 0.5 (r below the range: unclipped is smaller), -1, 1.2 (clipped), -1.5
    assert loss.item() == pytest.approx(-(0.5 - 1.0 + 1.2 - 1.5) / 4)
    loss.backward()
    # The clipped term (sample 2) passes no gradient; the others pass -A / 4.
    torch.testing.assert_close(ratio.grad, torch.tensor([-0.25, 0.25, 0.0, 0.25]))


def test_sac_actor_loss_and_temperature_loss_by_hand():
    log_prob = torch.tensor([-1.0, -2.0])
    q = torch.tensor([3.0, 5.0])
    assert sac_actor_loss(log_prob, q, 0.5).item() == pytest.approx(((-0.5 - 3) + (-1 - 5)) / 2)
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    loss = sac_alpha_loss(log_alpha, log_prob, target_entropy=-1.0)
    # -(log 0.5 * mean(log_prob + target)) = -(log 0.5 * -2.5)
    assert loss.item() == pytest.approx(2.5 * math.log(0.5))
    loss.backward()
    # The entropy (1.5) is above the target (-1): the gradient pushes log alpha down.
    assert log_alpha.grad.item() == pytest.approx(2.5)


def test_sac_squashed_gaussian_log_prob_matches_torch(tmp_path):
    from parl_algos.sac import SAC
    from tests.algos.models import FixedGaussianPolicy

    model = FixedGaussianPolicy(mean=[0.3, -1.2], log_std=[-0.5, 0.2])
    alg = SAC(model)
    torch.manual_seed(0)
    action, log_prob = alg._action_and_log_prob(model, torch.zeros(5000, 1))
    dist = TransformedDistribution(
        Normal(torch.tensor([0.3, -1.2]), torch.tensor([-0.5, 0.2]).exp()), [TanhTransform()]
    )
    expected = dist.log_prob(action.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1)
    close = action.abs().max(-1).values < 0.999  # TanhTransform's inverse is unstable at +-1
    torch.testing.assert_close(log_prob[close], expected[close], rtol=1e-4, atol=1e-4)
    # The entropy estimate -mean(log pi) is what the temperature loss compares to the target.
    assert action.abs().max() <= 1.0
