"""Collector-side policy: a read-only actor + observation normalizer fed from the flat vector.

All parameters and normalizer buffers are views into ONE contiguous float32 tensor laid out
like `FastSAC.policy_flat()` (see shm_layout/policy_layout.py), so `load_flat` is a single copy
(typically straight out of a shared-memory snapshot) and never aliases the caller's memory.
"""
from __future__ import annotations

import numpy as np
import torch

from fastsac.algo.networks import Actor
from fastsac.algo.normalizer import RunningNormalizer
from fastsac.config import AlgoConfig
from fastsac.shm_layout.policy_layout import actor_param_shapes, actor_widths, policy_flat_numel


class InferencePolicy:
    def __init__(self, obs_dim: int, act_dim: int, action_low: np.ndarray, action_high: np.ndarray,
                 cfg: AlgoConfig, device: torch.device | str = "cpu", seed: int | None = None):
        self.device = torch.device(device)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.actor = Actor(obs_dim, act_dim, actor_widths(cfg), cfg.log_std_min,
                           cfg.log_std_max, action_low, action_high).to(self.device).requires_grad_(False).eval()
        self.normalizer = RunningNormalizer(obs_dim, enabled=cfg.obs_normalization).to(self.device)
        self.numel = policy_flat_numel(obs_dim, act_dim, cfg)
        self._flat = torch.zeros(self.numel, device=self.device)

        # Re-point every parameter / buffer at its slice of self._flat.
        expected = actor_param_shapes(obs_dim, act_dim, cfg)
        actual = [(name, tuple(p.shape)) for name, p in self.actor.named_parameters()]
        if actual != expected:  # networks.py and policy_layout.py disagree: a programming error
            raise RuntimeError(f"actor parameters {actual} do not match policy_layout {expected}")
        offset = 0
        with torch.no_grad():
            for _, p in self.actor.named_parameters():
                view = self._flat[offset:offset + p.numel()].view_as(p)
                view.copy_(p)        # keep the fresh init until the first load_flat
                p.data = view
                offset += p.numel()
            for name in ("mean", "var"):
                buf = getattr(self.normalizer, name)
                view = self._flat[offset:offset + self.obs_dim]
                view.copy_(buf)
                setattr(self.normalizer, name, view)   # replaces the registered buffer
                offset += self.obs_dim
        assert offset == self.numel
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(seed)

    def load_flat(self, flat: np.ndarray) -> None:
        """Copy a vector with FastSAC.policy_flat()'s layout into the policy (one memcpy)."""
        flat = np.asarray(flat)
        if flat.shape != (self.numel,):
            raise ValueError(f"InferencePolicy.load_flat: expected shape ({self.numel},), got {flat.shape}")
        src = torch.from_numpy(np.ascontiguousarray(flat, dtype=np.float32))
        self._flat.copy_(src)

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Env-scaled float32 actions [N, act_dim]. Stochastic by default: SAC explores with its own policy."""
        x = torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32)).to(self.device)
        unit_action, _ = self.actor.sample(self.normalizer(x), deterministic, generator=self.generator)
        return self.actor.to_env(unit_action).cpu().numpy()
