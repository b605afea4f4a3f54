"""The return estimators and losses of the zoo as pure functions of tensors.

Each is a few lines straight from its paper, used by the algorithms and unit-tested on its own
against hand-computed values. Time-major layout throughout: `(T, ...)` with `T` the time axis;
anything after it (a batch of environments) is broadcast.
"""

from __future__ import annotations

import torch

__all__ = [
    "categorical_projection",
    "gae",
    "ppo_clip_loss",
    "quantile_huber_loss",
    "sac_actor_loss",
    "sac_alpha_loss",
    "td_target",
    "vtrace",
]


def td_target(
    reward: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor, gamma: float
) -> torch.Tensor:
    """The one-step TD target `r + gamma * (1 - terminated) * V(s')`.

    `terminated` marks transitions into a terminal state of the MDP, where the future is worth
    zero. A time-limit *truncation* is not a termination: the target still bootstraps from the
    value of the last observation, so pass `terminated=0` there.
    """
    return reward + gamma * (1.0 - terminated.to(reward.dtype)) * next_value


def categorical_projection(
    next_probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """C51's target: the distribution of `r + discount * Z(s')` projected onto `support`.

    Bellemare et al., "A distributional perspective on reinforcement learning", ICML 2017,
    https://arxiv.org/abs/1707.06887, algorithm 1: each atom `z_j` moves to
    `Tz_j = clip(r + discount * z_j, V_min, V_max)` and its probability is split between the two
    neighbouring atoms of the support in proportion to closeness (all of it to one atom when
    `Tz_j` lands on it).

    Args:
        next_probs: `(B, N)` probabilities of the next state's distribution (of the action the
            target picks).
        reward: `(B,)` rewards (n-step returns for n-step learning).
        discount: `(B,)` `gamma^n * (1 - terminal)`: 0 at a terminal state, where the whole
            mass goes to `r`.
        support: `(N,)` the atoms `z_0 < ... < z_{N-1}`, evenly spaced.

    Returns:
        `(B, N)` the projected target probabilities (each row sums to 1).
    """
    n_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    tz = (reward.unsqueeze(1) + discount.unsqueeze(1) * support.unsqueeze(0)).clamp(v_min, v_max)
    b = (tz - v_min) / delta_z
    lower, upper = b.floor().long(), b.ceil().long()
    # When Tz_j lands on an atom, lower == upper and both shares below are 0: give it all.
    lower_share = next_probs * (upper.to(b.dtype) - b + (lower == upper).to(b.dtype))
    upper_share = next_probs * (b - lower.to(b.dtype))
    target = torch.zeros_like(next_probs)
    target.scatter_add_(1, lower, lower_share)
    target.scatter_add_(1, upper, upper_share)
    return target


def quantile_huber_loss(
    quantiles: torch.Tensor, target: torch.Tensor, kappa: float = 1.0
) -> torch.Tensor:
    """QR-DQN's loss per sample: the quantile Huber loss of every (quantile, target) pair.

    Dabney et al., "Distributional reinforcement learning with quantile regression", AAAI 2018,
    https://arxiv.org/abs/1710.10044, equations 9-10: with `u = T theta_j - theta_i`,
    `rho_tau(u) = |tau - 1{u < 0}| * L_kappa(u) / kappa` and `L_kappa` the Huber loss, the
    loss is `sum_i mean_j rho_{tau_i}(u_ij)` over the quantile midpoints
    `tau_i = (2i + 1) / 2N`.

    Args:
        quantiles: `(B, N)` the predicted quantiles `theta_i(s, a)`.
        target: `(B, N')` the target samples `r + discount * theta_j(s', a*)` (no gradient).
        kappa: the Huber threshold (0: the plain quantile loss).

    Returns:
        `(B,)` the loss of each sample.
    """
    n = quantiles.shape[1]
    tau = (torch.arange(n, dtype=quantiles.dtype, device=quantiles.device) + 0.5) / n
    u = target.unsqueeze(1) - quantiles.unsqueeze(2)  # (B, N, N'): pairs (i, j)
    if kappa > 0:
        huber = torch.where(u.abs() <= kappa, 0.5 * u.pow(2), kappa * (u.abs() - 0.5 * kappa))
        huber = huber / kappa
    else:
        huber = u.abs()
    weight = (tau.view(1, -1, 1) - (u.detach() < 0).to(u.dtype)).abs()
    return (weight * huber).mean(dim=2).sum(dim=1)


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalized advantage estimation (Schulman et al., 2016, https://arxiv.org/abs/1506.02438).

    `A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}` with the TD error
    `delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)`.

    Args:
        reward: `(T, ...)` rewards.
        value: `(T, ...)` values `V(s_t)` of the observations the actions were taken in.
        next_value: `(T, ...)` values of the observation after each step: `V(s_{t+1})`. Where an
            episode was truncated, the value of its last observation (not of the reset one).
        terminated: `(T, ...)` 1 where the step ended the episode in a terminal state.
        done: `(T, ...)` 1 where the step ended the episode for any reason (termination or
            truncation): the advantage recursion stops there.
        gamma: discount factor.
        lam: the GAE lambda: 0 gives the one-step TD error, 1 the Monte-Carlo advantage.

    Returns:
        `(T, ...)` advantages; the value targets are `advantages + value`.
    """
    not_terminated = 1.0 - terminated.to(reward.dtype)
    not_done = 1.0 - done.to(reward.dtype)
    delta = reward + gamma * not_terminated * next_value - value
    advantage = torch.zeros_like(delta)
    running = torch.zeros_like(delta[0])
    for t in reversed(range(delta.shape[0])):
        running = delta[t] + gamma * lam * not_done[t] * running
        advantage[t] = running
    return advantage


def vtrace(
    log_rho: torch.Tensor,
    discount: torch.Tensor,
    reward: torch.Tensor,
    value: torch.Tensor,
    bootstrap_value: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al., 2018, eq. 1).

    `v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) rho_t delta_t` with
    `delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t)`, `rho_t = min(rho_bar, pi/mu)` and
    `c_i = min(c_bar, pi/mu)`, computed backwards as
    `v_s - V(x_s) = rho_s delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))`.
    The advantage of the policy gradient is `rho_s (r_s + gamma_s v_{s+1} - V(x_s))`.
    Everything is computed without gradient.

    Args:
        log_rho: `(T, ...)` `log pi(a_t|x_t) - log mu(a_t|x_t)`, target over behaviour policy.
        discount: `(T, ...)` `gamma_t`: the discount, 0 where the episode ended after step `t`.
        reward: `(T, ...)` rewards.
        value: `(T, ...)` `V(x_t)` under the current value function.
        bootstrap_value: `(...)` `V(x_T)`, the value after the last step.
        rho_bar: truncation of the importance weights in the TD errors (the fixed point).
        c_bar: truncation of the trace-cutting coefficients (the contraction speed).

    Returns:
        `(vs, pg_advantage)`, both `(T, ...)`.
    """
    with torch.no_grad():
        rho = torch.exp(log_rho)
        clipped_rho = rho.clamp(max=rho_bar)
        c = rho.clamp(max=c_bar)
        next_value = torch.cat([value[1:], bootstrap_value.unsqueeze(0)], dim=0)
        delta = clipped_rho * (reward + discount * next_value - value)
        vs_minus_v = torch.zeros_like(value)
        running = torch.zeros_like(bootstrap_value)
        for t in reversed(range(value.shape[0])):
            running = delta[t] + discount[t] * c[t] * running
            vs_minus_v[t] = running
        vs = vs_minus_v + value
        next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        pg_advantage = clipped_rho * (reward + discount * next_vs - value)
    return vs, pg_advantage


def ppo_clip_loss(ratio: torch.Tensor, advantage: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """PPO's clipped surrogate as a loss to minimise (Schulman et al., 2017, eq. 7).

    `-mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))` with `ratio = pi/pi_old`.
    """
    unclipped = ratio * advantage
    clipped = ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef) * advantage
    return -torch.min(unclipped, clipped).mean()


def sac_actor_loss(
    log_prob: torch.Tensor, q_value: torch.Tensor, alpha: torch.Tensor | float
) -> torch.Tensor:
    """SAC's policy loss `mean(alpha * log pi(a|s) - Q(s, a))`, `a` sampled by reparameterization.

    Haarnoja et al., 2018, https://arxiv.org/abs/1812.05905, eq. 7 (as a sample estimate).
    """
    return (alpha * log_prob - q_value).mean()


def sac_alpha_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float
) -> torch.Tensor:
    """SAC's temperature loss `-mean(log_alpha * (log pi(a|s) + target_entropy))`.

    Its gradient raises alpha while the policy's entropy `-log pi` is below the target and
    lowers it above (Haarnoja et al., 2018, eq. 18, written in `log alpha` for a positive
    alpha). `log_prob` is treated as a constant.
    """
    return -(log_alpha * (log_prob.detach() + target_entropy)).mean()
