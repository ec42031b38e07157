"""FastSAC networks: LayerNorm + SiLU MLPs, a tanh-squashed Gaussian actor, twin C51 critics.

Action spaces. The actor and the critics work in the *unit box* (-1, 1)^act_dim; only the
actions handed to envs (and stored in the replay buffer) are scaled to [action_low,
action_high]. Consequences worth knowing:
  * log-probs, the policy entropy and hence `target_entropy` refer to the unit box, so the
    same `target_entropy_ratio` means the same thing for every task whatever its torque units;
  * the critic sees unit-box actions, i.e. inputs of the same scale for every task.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def mlp_trunk(in_dim: int, widths: list[int]) -> nn.Sequential:
    """(Linear -> LayerNorm -> SiLU) per entry of widths (policy_layout.trunk_widths). LayerNorm
    keeps the large-batch, high-lr FastSAC regime stable; the layer order is part of the flat
    policy layout (fastsac/shm_layout/policy_layout.py)."""
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(in_dim, width), nn.LayerNorm(width), nn.SiLU()]
        in_dim = width
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """Gaussian policy squashed by tanh: a = tanh(mean + std * eps), eps ~ N(0, I).

    log_std is bounded smoothly: tanh maps the raw head output to (-1, 1), which is rescaled
    to (log_std_min, log_std_max). A hard clamp would zero the gradient at the bounds.

    Both heads start at zero (as the reference's): the first policy is centred in the action
    box (mean 0) with log_std in the middle of its bounds, whatever the observation.
    """

    def __init__(self, obs_dim: int, act_dim: int, widths: list[int],
                 log_std_min: float, log_std_max: float, action_low: np.ndarray, action_high: np.ndarray):
        super().__init__()
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.log_std_min, self.log_std_max = float(log_std_min), float(log_std_max)
        self.trunk = mlp_trunk(obs_dim, widths)
        self.mean_head = nn.Linear(widths[-1], act_dim)
        self.log_std_head = nn.Linear(widths[-1], act_dim)
        for head in (self.mean_head, self.log_std_head):
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
        low = torch.as_tensor(np.asarray(action_low, np.float32).reshape(act_dim))
        high = torch.as_tensor(np.asarray(action_high, np.float32).reshape(act_dim))
        if not (torch.isfinite(low).all() and torch.isfinite(high).all() and (high > low).all()):
            raise ValueError(f"Actor needs finite action bounds with high > low, got low={low.tolist()} high={high.tolist()}")
        # not persistent: they come from the env spec, not from training, and are not in the flat layout
        self.register_buffer("action_scale", (high - low) / 2, persistent=False)
        self.register_buffer("action_bias", (high + low) / 2, persistent=False)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Normalized obs -> (mean, log_std) of the pre-tanh Gaussian, float32 even under autocast."""
        return self.heads(self.trunk(obs))

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """The trunk's output -> (mean, log_std) of the pre-tanh Gaussian, float32."""
        mean = self.mean_head(h).float()
        log_std = torch.tanh(self.log_std_head(h).float())
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1.0)
        return mean, log_std

    def sample(self, obs: Tensor, deterministic: bool = False, generator: torch.Generator | None = None,
               noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Unit-box action in (-1, 1) and its log-prob [B] under the squashed Gaussian.

        log pi(a) = sum_i [ log N(u_i; mean_i, std_i) - log(1 - tanh(u_i)^2) ], with the
        Jacobian term in the overflow-free form log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)).
        (Deterministic: a = tanh(mean); the log-prob is then that of the mode.) `noise`: eps drawn
        by the caller ([B, act_dim] float32), e.g. once for a batch whose rows are split over threads.
        """
        mean, log_std = self(obs)
        if deterministic:
            eps = torch.zeros_like(mean)
        elif noise is not None:
            eps = noise
        else:
            eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return self.squash(mean, log_std, eps)

    @staticmethod
    def squash(mean: Tensor, log_std: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
        """(tanh(u), log pi) for u = mean + exp(log_std) * eps: the second half of sample."""
        u = mean + log_std.exp() * eps
        log_prob = -0.5 * eps.square() - log_std - _HALF_LOG_2PI
        log_prob = log_prob - 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))
        return torch.tanh(u), log_prob.sum(-1)

    def to_env(self, unit_action: Tensor) -> Tensor:
        return unit_action * self.action_scale + self.action_bias

    def to_unit(self, env_action: Tensor) -> Tensor:
        return (env_action - self.action_bias) / self.action_scale


class DistributionalQNet(nn.Module):
    """(critic obs, unit action) -> num_atoms logits of the return distribution (C51)."""

    def __init__(self, in_dim: int, widths: list[int], num_atoms: int):
        super().__init__()
        self.trunk = mlp_trunk(in_dim, widths)
        self.head = nn.Linear(widths[-1], num_atoms)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))


def zero_return_logits(support: Tensor) -> Tensor:
    """Head bias for an initial return distribution around 0: a Gaussian bump on the support,
    centred at 0 (clipped into [v_min, v_max]), 1/20 of the support's range wide.

    Why: the default head gives near-equal logits, i.e. a uniform distribution whose mean
    (v_min + v_max) / 2 is every initial Q. Bootstrapping removes that bias only at the
    target network's pace (~ln(10) / (1 - gamma) target "generations" of 1/tau updates each
    for a tenfold decrease: ~46k updates at gamma 0.99, tau 0.005). Until then a terminal
    transition looks (v_min + v_max) / 2 worse than any other: on Ant (support [-300, 1000])
    the critic's Q fell from 350 to its real ~30 only after ~110k env steps, and the policy
    learnt to stay upright at any control cost meanwhile instead of to walk.
    """
    span = float(support[-1] - support[0])
    centre = support.new_tensor(0.0).clamp(support[0], support[-1])
    return -0.5 * ((support - centre) / (span / 20.0)).square()


class TwinDistributionalCritic(nn.Module):
    """Two independent C51 Q-networks over the fixed support linspace(v_min, v_max, num_atoms).

    init "uniform": default-initialised heads (the reference's): a near-uniform initial
    distribution; "zero_return": the heads' biases start at zero_return_logits (initial Q ~ 0)."""

    def __init__(self, critic_obs_dim: int, act_dim: int, widths: list[int],
                 num_atoms: int, v_min: float, v_max: float, init: str = "uniform"):
        super().__init__()
        self.v_min, self.v_max, self.num_atoms = float(v_min), float(v_max), num_atoms
        self.q1 = DistributionalQNet(critic_obs_dim + act_dim, widths, num_atoms)
        self.q2 = DistributionalQNet(critic_obs_dim + act_dim, widths, num_atoms)
        self.register_buffer("support", torch.linspace(v_min, v_max, num_atoms), persistent=False)
        if init == "zero_return":
            with torch.no_grad():
                for net in (self.q1, self.q2):
                    net.head.bias.copy_(zero_return_logits(self.support))
        elif init != "uniform":
            raise ValueError(f"TwinDistributionalCritic: init must be 'uniform' or 'zero_return', got {init!r}")

    @staticmethod
    def joint_input(critic_obs: Tensor, unit_action: Tensor) -> Tensor:
        """What each Q-net reads: [B, critic_obs_dim + act_dim]."""
        return torch.cat([critic_obs, unit_action.to(critic_obs.dtype)], dim=-1)

    def forward(self, critic_obs: Tensor, unit_action: Tensor) -> Tensor:
        """-> logits [2, B, num_atoms] (index 0: q1, 1: q2)."""
        x = self.joint_input(critic_obs, unit_action)
        return torch.stack([self.q1(x), self.q2(x)])

    def q_values(self, logits: Tensor) -> Tensor:
        """Expected value of each distribution: [..., num_atoms] logits -> [...] (float32)."""
        return (torch.softmax(logits.float(), dim=-1) * self.support).sum(-1)


def categorical_projection(atoms: Tensor, probs: Tensor, v_min: float, v_max: float) -> Tensor:
    """Project a distribution onto the support linspace(v_min, v_max, N) (the C51 projection).

    atoms, probs: [..., N]: mass probs[..., j] sits at position atoms[..., j] (e.g. r + g * z_j);
    atoms broadcasts to probs' shape (one set of positions can serve both critics' distributions).
    Each mass is clipped to [v_min, v_max] and split between the two neighbouring support
    points in proportion to proximity, which preserves the mean whenever nothing is clipped.

    `lower` is capped at N - 2 so `lower + 1` is always a support point; then
      * a mass exactly on support point k < N-1 has b == k: all of it goes to k (weight 1 - 0),
      * a mass on (or clipped to) v_max has b == N-1, lower == N-2: all of it goes to N-1,
    with no special cases (the classic floor/ceil version loses mass when floor == ceil).
    """
    n = probs.shape[-1]
    delta = (v_max - v_min) / (n - 1)
    atoms = atoms.float().expand_as(probs)
    b = ((atoms.clamp(v_min, v_max) - v_min) / delta).clamp(0.0, n - 1)
    lower = b.floor().clamp(max=n - 2)
    upper_weight = b - lower                       # in [0, 1]
    lower_idx = lower.long()
    probs = probs.float()
    out = torch.zeros_like(probs)
    out.scatter_add_(-1, lower_idx, probs * (1.0 - upper_weight))
    out.scatter_add_(-1, lower_idx + 1, probs * upper_weight)
    return out
