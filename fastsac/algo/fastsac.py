"""FastSAC: SAC with distributional (C51) twin critics, LayerNorm/SiLU nets and large-batch updates.

One `update` is one gradient step, readable top to bottom:

  critic  for each of the two Q-nets separately, the target distribution is the target
          net's distribution at (s', a' ~ pi(s')) shifted by the soft value,
              z_j  ->  r + discount * bootstrap * (z_j - alpha * log pi(a'|s')),
          projected back onto the fixed support; loss = cross-entropy (sum over both nets).
          Target nets follow by Polyak averaging (tau) after every critic step.
  alpha   in every update too (as the reference's), from the log-probs of the next-state
          actions a' the critic target has just sampled: minimize
          -alpha * (log pi(a'|s') + target_entropy).
  actor   every `policy_frequency` critic steps (a persistent counter, so the ratio is
          exact across calls and checkpoints): minimize alpha * log pi(a|s) - mean(Q1, Q2),
          where Q is the expected value of each distribution.

The same alpha (read before the step) serves the critic target and the actor of one update;
the new alpha takes effect from the next update.

`rewards`, `discount` and `bootstrap` come from the replay buffer's n-step windows
(discount = gamma^k for the actual window length, bootstrap = 0 after a termination).
Observations are stored raw and normalized here with the current running statistics.
Log-probs and the critic's action input live in the unit box, see networks.py.

How it is computed: the two Q-nets are independent until the optimizer step, so each twin's half
(its target projection, loss and gradients; in the actor step its Q and dQ/da) runs on its own
thread on a CPU with two or more (TwinRunner); the actor backpropagates the twins' mean dQ/da.
Every optimizer is fused AdamW. Observations are normalized once per batch and normalizer.
"""
from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import torch
from torch import Tensor

from fastsac.algo.networks import Actor, TwinDistributionalCritic, categorical_projection
from fastsac.algo.normalizer import RunningNormalizer
from fastsac.algo.twin_runner import TwinRunner
from fastsac.config import AlgoConfig
from fastsac.shm_layout.policy_layout import actor_widths, critic_widths

# 2: tapered trunks and zero-initialised actor heads; version-1 state has other shapes.
STATE_DICT_VERSION = 2

T = TypeVar("T")


class FastSAC:
    def __init__(self, obs_dim: int, critic_obs_dim: int, act_dim: int, action_low: np.ndarray,
                 action_high: np.ndarray, cfg: AlgoConfig, device: torch.device):
        self.cfg, self.device = cfg, torch.device(device)
        self.obs_dim, self.critic_obs_dim, self.act_dim = obs_dim, critic_obs_dim, act_dim
        # critic_obs_dim == 0: the critic sees the actor's observation (normalized by its own
        # normalizer, which then tracks the same data as the actor's)
        self.has_critic_obs = critic_obs_dim > 0
        critic_in = critic_obs_dim if self.has_critic_obs else obs_dim
        dev = self.device

        self.actor = Actor(obs_dim, act_dim, actor_widths(cfg), cfg.log_std_min, cfg.log_std_max,
                           action_low, action_high).to(dev)
        self.critic = TwinDistributionalCritic(critic_in, act_dim, critic_widths(cfg), cfg.num_atoms,
                                               cfg.v_min, cfg.v_max, cfg.critic_init).to(dev)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self._actor_params = list(self.actor.parameters())
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())
        self.obs_normalizer = RunningNormalizer(obs_dim, enabled=cfg.obs_normalization).to(dev)
        self.critic_obs_normalizer = RunningNormalizer(critic_in, enabled=cfg.obs_normalization).to(dev)

        self.log_alpha = torch.tensor(math.log(cfg.alpha_init), device=dev, requires_grad=True)
        self.target_entropy = -act_dim * cfg.target_entropy_ratio

        on_cuda = dev.type == "cuda"
        betas = (cfg.adam_beta1, cfg.adam_beta2)
        # fused: one kernel per step for all of an optimizer's tensors instead of a dozen per-tensor
        # ops each (CPU and CUDA); on CUDA it also keeps the step count on the device (no host sync)
        self.actor_optimizer = torch.optim.AdamW(self._actor_params, lr=cfg.actor_lr, betas=betas,
                                                 weight_decay=cfg.weight_decay, fused=True)
        self.critic_optimizer = torch.optim.AdamW(self._critic_params, lr=cfg.critic_lr, betas=betas,
                                                  weight_decay=cfg.weight_decay, fused=True)
        # No weight decay on log_alpha: decoupled decay would pull log_alpha towards 0, i.e.
        # alpha towards 1, a bias unrelated to the entropy target.
        self.alpha_optimizer = torch.optim.AdamW([self.log_alpha], lr=cfg.alpha_lr, betas=betas, weight_decay=0.0,
                                                 fused=True)
        self._optimizers = {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer,
                            "alpha_optimizer": self.alpha_optimizer}

        # the twins, each with its own online net, target net and parameters (see TwinRunner)
        self._nets = (self.critic.q1, self.critic.q2)
        self._target_nets = (self.critic_target.q1, self.critic_target.q2)
        self._net_params = tuple(list(net.parameters()) for net in self._nets)
        self._twins = TwinRunner(dev)

        # bf16 autocast and torch.compile only pay off (and are only tested) on CUDA
        self.amp = bool(cfg.amp and on_cuda)
        self.compiled = bool(cfg.compile and on_cuda)
        self._critic_loss = torch.compile(self._critic_loss_eager) if self.compiled else self._critic_loss_eager
        self._q = torch.compile(self._q_eager) if self.compiled else self._q_eager
        self._compile_checked: set[str] = set()        # steps whose first (compiled) call has run
        self.compile_fallback_reason: str | None = None   # why the update runs eager after all

        self._num_updates = 0
        # Data-parallel learners (fastsac.learner.distributed.LearnerGroup.install): called with the
        # parameter list right after each backward (critic, actor, log_alpha), before clipping and
        # the optimizer step, to average the gradients over the learner ranks. None: one learner.
        self.grad_sync: Callable[[list[Tensor]], None] | None = None
        zero = torch.zeros((), device=dev)
        # actor-side metrics of the latest actor step, reported by every update
        self._actor_metrics: dict[str, Tensor] = {"actor_loss": zero, "policy_entropy": zero.clone()}

    # ------------------------------------------------------------------ helpers
    @property
    def num_updates_done(self) -> int:
        """Critic updates done so far (persistent across calls and checkpoints)."""
        return self._num_updates

    def set_threads(self, n: int) -> None:
        """The CPUs the updates may use (the learner's thread tuner calls it; see TwinRunner)."""
        self._twins.set_threads(n)

    def close(self) -> None:
        """Stop the critic worker thread (also stopped with the process)."""
        self._twins.close()

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()

    def _autocast(self):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=self.amp)

    def _critic_input(self, obs: Tensor, critic_obs: Tensor | None) -> Tensor:
        return self.critic_obs_normalizer(critic_obs if self.has_critic_obs else obs)

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Env-scaled actions for raw observations [N, obs_dim]; normalizer stats are read-only."""
        unit_action, _ = self.actor.sample(self.obs_normalizer(obs.to(self.device)), deterministic)
        return self.actor.to_env(unit_action)

    @torch.no_grad()
    def update_normalizers(self, obs: Tensor, critic_obs: Tensor | None) -> None:
        """Fold a batch of new raw observations into the running statistics (learner only)."""
        self.obs_normalizer.update(obs)
        self.critic_obs_normalizer.update(critic_obs if self.has_critic_obs else obs)

    # ------------------------------------------------------------------ losses
    def _critic_loss_eager(self, k: int, next_x: Tensor, x: Tensor, target_atoms: Tensor) -> tuple[Tensor, Tensor]:
        """Critic net k's loss: cross-entropy of its distribution at x against its target net's at
        next_x shifted onto target_atoms and projected onto the support. -> (loss, mean Q)."""
        support = self.critic.support
        with torch.no_grad(), self._autocast():
            target_probs = torch.softmax(self._target_nets[k](next_x).float(), dim=-1)        # [B, N]
            target = categorical_projection(target_atoms, target_probs, self.cfg.v_min, self.cfg.v_max)
        with self._autocast():
            logits = self._nets[k](x)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        loss = -(target * log_probs).sum(-1).mean()
        return loss, (log_probs.detach().exp() * support).sum(-1).mean()

    def _critic_net_grads(self, k: int, next_x: Tensor, x: Tensor, target_atoms: Tensor):
        """One twin's half of the critic step (on its own thread, see TwinRunner): loss, mean Q, grads."""
        loss, q_value = self._critic_loss(k, next_x, x, target_atoms)
        return loss.detach(), q_value, torch.autograd.grad(loss, self._net_params[k])

    def _q_eager(self, k: int, x: Tensor) -> Tensor:
        with self._autocast():
            return self.critic.q_values(self._nets[k](x))

    def _q_action_grad(self, k: int, x: Tensor) -> tuple[Tensor, Tensor]:
        """One twin's half of the actor step: Q_k at x [B] and d(sum Q_k)/dx (x's rows are independent)."""
        x = x.detach().requires_grad_(True)
        q = self._q(k, x)
        return q.detach(), torch.autograd.grad(q.sum(), x)[0]

    def _row_parts(self, n: int) -> list[slice]:
        """The batch rows of each thread's share of the actor's work: two halves when the twins
        run in parallel (the actor's rows are as independent as the twins), else one part."""
        return [slice(0, n // 2), slice(n // 2, n)] if self._twins.parallel else [slice(0, n)]

    def _each_part(self, parts: list[slice], fn: Callable[..., T], *args) -> list[T]:
        return list(self._twins.run(fn, parts, *args)) if len(parts) == 2 else [fn(0, parts, *args)]

    def _sample_part(self, h: int, parts: list[slice], obs_n: Tensor, noise: Tensor, grad: bool):
        """The actor's action and log-prob for rows parts[h] (grad and autocast are per thread)."""
        with torch.set_grad_enabled(grad), self._autocast():
            return self.actor.sample(obs_n[parts[h]], noise=noise[parts[h]])

    def _noise(self, obs_n: Tensor) -> Tensor:
        """The actor's eps for a batch, drawn once: the same draws as one actor.sample call."""
        return torch.randn(obs_n.shape[0], self.act_dim, device=obs_n.device)

    def _sample(self, obs_n: Tensor, noise: Tensor, grad: bool) -> tuple[list[slice], list[tuple[Tensor, Tensor]]]:
        """a ~ pi(.|s) for a batch of normalized observations, its rows split over the threads."""
        parts = self._row_parts(obs_n.shape[0])
        return parts, self._each_part(parts, self._sample_part, obs_n, noise, grad)

    def _actor_part_grads(self, h: int, parts: list[slice], xs: list[Tensor], log_probs: list[Tensor],
                          dx: Tensor, dlog_prob: Tensor) -> tuple[Tensor, ...]:
        """The actor's gradients from rows parts[h]: backpropagate dL/dx and dL/dlog_prob."""
        return torch.autograd.grad([xs[h], log_probs[h]], self._actor_params,
                                   [dx[parts[h]], dlog_prob.expand_as(log_probs[h])])

    # ------------------------------------------------------------------ one gradient step
    def update(self, batch: dict) -> dict[str, Tensor]:
        """One critic and alpha step (+ an actor step every policy_frequency-th call). Detached
        scalar tensors, no .item(): the caller decides when to sync."""
        cfg = self.cfg
        alpha = self.alpha
        obs, next_obs = batch["obs"], batch["next_obs"]
        critic_in = self._critic_input(obs, batch.get("critic_obs"))      # normalized once, used twice

        next_obs_n = self.obs_normalizer(next_obs)
        _, sampled = self._sample(next_obs_n, self._noise(next_obs_n), grad=False)
        with torch.no_grad(), self._autocast():
            next_action = torch.cat([a for a, _ in sampled])
            next_log_prob = torch.cat([lp for _, lp in sampled]).float()
            # soft return atoms r + discount * bootstrap * (z - alpha * log pi(a'|s')), shared by both nets
            soft_next = self.critic.support.unsqueeze(0) - (alpha * next_log_prob).unsqueeze(1)    # [B, N]
            scale = (batch["discount"] * batch["bootstrap"]).unsqueeze(1)
            target_atoms = batch["rewards"].unsqueeze(1) + scale * soft_next
            next_x = self.critic.joint_input(self._critic_input(next_obs, batch.get("next_critic_obs")), next_action)
        x = self.critic.joint_input(critic_in, self.actor.to_unit(batch["actions"]))
        # each net learns its own target distribution; the losses add up over the two nets
        halves = self._guarded("critic", lambda: self._twins.run(self._critic_net_grads, next_x, x, target_atoms))
        qf_loss, q_value = halves[0][0] + halves[1][0], (halves[0][1] + halves[1][1]) / 2
        self._step(self.critic_optimizer, self._critic_params, [*halves[0][2], *halves[1][2]])
        with torch.no_grad():
            # Polyak averaging: target <- target + tau * (online - target)
            torch._foreach_lerp_(self._target_params, self._critic_params, cfg.tau)
        if cfg.autotune_alpha:
            alpha_loss = -(self.log_alpha.exp() * (next_log_prob + self.target_entropy)).mean()
            self._step(self.alpha_optimizer, [self.log_alpha], torch.autograd.grad(alpha_loss, [self.log_alpha]),
                       clip=False)
        self._num_updates += 1

        if self._num_updates % cfg.policy_frequency == 0:
            self._actor_step(obs, critic_in, alpha)
        return {"qf_loss": qf_loss, "q_value": q_value, **self._actor_metrics, "alpha": self.alpha}

    def _actor_step(self, obs: Tensor, critic_in: Tensor, alpha: Tensor) -> None:
        """Minimize mean(alpha * log pi(a|s) - (Q1 + Q2) / 2) over the actor's parameters: each twin
        gives dQ/da on its own thread, the actor backpropagates their mean and alpha / B per
        log-prob, its rows split over the threads too (the critics' weight gradients are neither
        needed nor computed)."""
        obs_n = self.obs_normalizer(obs)
        batch, noise = obs_n.shape[0], self._noise(obs_n)     # drawn once: a rerun after a fallback reuses it

        def grads() -> tuple[list[Tensor], Tensor, Tensor]:
            parts, sampled = self._sample(obs_n, noise, grad=True)
            log_probs = [lp for _, lp in sampled]
            xs = [self.critic.joint_input(critic_in[rows], a) for rows, (a, _) in zip(parts, sampled)]
            (q1, dq1), (q2, dq2) = self._twins.run(self._q_action_grad, torch.cat([x.detach() for x in xs]))
            # d/dx of -mean((Q1 + Q2) / 2): the rows' Q gradients, summed over the twins, / (2 B)
            dx, dlog_prob = (dq1 + dq2) / (-2.0 * batch), alpha / batch
            per_part = self._each_part(parts, self._actor_part_grads, xs, log_probs, dx, dlog_prob)
            log_prob = torch.cat([lp.detach() for lp in log_probs])
            loss = (alpha * log_prob - (q1 + q2) / 2).mean()
            return [sum(g) for g in zip(*per_part)], loss, log_prob

        actor_grads, actor_loss, log_prob = self._guarded("actor", grads)
        self._step(self.actor_optimizer, self._actor_params, actor_grads)
        self._actor_metrics = {"actor_loss": actor_loss, "policy_entropy": -log_prob.mean()}

    def _step(self, optimizer: torch.optim.Optimizer, params: list[Tensor], grads: Sequence[Tensor],
              clip: bool = True) -> None:
        """Install the gradients, average them over learner ranks, clip, step."""
        for p, g in zip(params, grads):
            p.grad = g
        if self.grad_sync is not None:
            self.grad_sync(params)
        if clip and self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        optimizer.step()

    def _guarded(self, name: str, step: Callable[[], T]) -> T:
        """step() (a loss and its gradients, before any optimizer step). With torch.compile: if the
        first call fails anywhere, forward or backward, run eager from then on, say so loudly
        (warning + compile_fallback_reason, which the learner logs and reports) and redo it eagerly."""
        if not self.compiled or name in self._compile_checked:
            return step()
        try:
            out = step()
        except Exception as exc:  # noqa: BLE001 - any compiler failure -> eager
            self.compile_fallback_reason = f"{name} step: {type(exc).__name__}: {exc}"
            warnings.warn(f"fastsac: torch.compile failed in the {self.compile_fallback_reason}; the update runs eager")
            self._critic_loss, self._q = self._critic_loss_eager, self._q_eager
            out = step()
        self._compile_checked.add(name)
        return out

    def train(self, buffer, num_updates: int) -> dict[str, Tensor]:
        """num_updates x (sample cfg.batch_size transitions, update). Returns the mean critic
        loss / Q-value over these updates and the latest actor-side metrics; {} for 0 updates."""
        if num_updates <= 0:
            return {}
        qf_losses, q_values = [], []
        for _ in range(num_updates):
            metrics = self.update(buffer.sample(self.cfg.batch_size))
            qf_losses.append(metrics["qf_loss"])
            q_values.append(metrics["q_value"])
        metrics["qf_loss"] = torch.stack(qf_losses).mean()
        metrics["q_value"] = torch.stack(q_values).mean()
        return metrics

    # ------------------------------------------------------------------ publishing
    @torch.no_grad()
    def policy_flat(self) -> Tensor:
        """1-D float32 on the agent device: actor parameters then obs-normalizer mean and var
        (layout: fastsac.shm_layout.policy_layout; loaded by fastsac.algo.policy.InferencePolicy)."""
        parts = [p.detach().reshape(-1).float() for p in self.actor.parameters()]
        parts += [self.obs_normalizer.mean, self.obs_normalizer.var]
        return torch.cat(parts)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit-for-bit (except RNG state): plain tensors and Python
        values, loadable with torch.load(weights_only=True). Tensors are references to live
        state (like nn.Module.state_dict): torch.save them, or clone, before training on."""
        return {
            "version": STATE_DICT_VERSION,
            "dims": {"obs_dim": self.obs_dim, "critic_obs_dim": self.critic_obs_dim, "act_dim": self.act_dim},
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "obs_normalizer": self.obs_normalizer.state_dict(),
            "critic_obs_normalizer": self.critic_obs_normalizer.state_dict(),
            "log_alpha": self.log_alpha.detach(),
            **{name: opt.state_dict() for name, opt in self._optimizers.items()},
            "num_updates_done": self._num_updates,
            "actor_metrics": dict(self._actor_metrics),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if d.get("version") != STATE_DICT_VERSION:
            raise ValueError(f"FastSAC state dict version {d.get('version')!r} is not {STATE_DICT_VERSION}")
        mine = {"obs_dim": self.obs_dim, "critic_obs_dim": self.critic_obs_dim, "act_dim": self.act_dim}
        if d["dims"] != mine:
            raise ValueError(f"FastSAC state dict is for dims {d['dims']}, this agent has {mine}")
        self.actor.load_state_dict(d["actor"])
        self.critic.load_state_dict(d["critic"])
        self.critic_target.load_state_dict(d["critic_target"])
        self.obs_normalizer.load_state_dict(d["obs_normalizer"])
        self.critic_obs_normalizer.load_state_dict(d["critic_obs_normalizer"])
        with torch.no_grad():
            self.log_alpha.copy_(d["log_alpha"])          # in place: the alpha optimizer holds this tensor
        for name, opt in self._optimizers.items():
            # keep this machine's kernel choice (fused on CUDA), not the one the checkpoint was saved with
            impl = [{k: g.get(k) for k in ("fused", "foreach")} for g in opt.param_groups]
            opt.load_state_dict(d[name])
            for g, kept in zip(opt.param_groups, impl):
                g.update(kept)
        self._num_updates = int(d["num_updates_done"])
        self._actor_metrics = {k: v.to(self.device) for k, v in d.get("actor_metrics", {}).items()} \
            or self._actor_metrics
