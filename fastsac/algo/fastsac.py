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
(its target projection, loss and gradients, its AdamW step and Polyak average; in the actor step
its Q and dQ/da) runs on its own thread on a CPU with two or more (TwinRunner); the actor, on the
calling thread, backpropagates the twins' mean dQ/da. On a CPU, forward and backward are computed
by hand with fused kernels (hand_grads.py); on CUDA by autograd, optionally compiled. Every
optimizer is fused AdamW, stepped without optimizer.step()'s Python (adamw_step.py).
Observations are normalized once per batch and normalizer.
"""
from __future__ import annotations

import copy
import functools
import math
import warnings
from concurrent.futures import Future
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import torch
from torch import Tensor

from fastsac.algo.adamw_step import fused_adamw_step
from fastsac.algo.cpu_kernels import kernels_in_use
from fastsac.algo.hand_grads import ActorTape, CriticTargets, HandGrads
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
        self._target_net_params = tuple(list(net.parameters()) for net in self._target_nets)
        self._twins = TwinRunner(dev)
        # on a CPU, forward and backward by hand with fused kernels (hand_grads.py), compiled (once per
        # machine) or loaded here, at the start, not in the first update; else autograd
        self._by_hand = None
        if dev.type == "cpu":
            kernels_in_use()
            self._by_hand = HandGrads(self.actor, self._nets, self._target_nets, self.critic.support, cfg.v_min,
                                      cfg.v_max)

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

    def _critic_net_grads(self, k: int, targets: Future[CriticTargets], x: Tensor, step: bool):
        """One twin's half of the critic step (on its own thread, see TwinRunner): loss, mean Q, grads;
        with step, also its AdamW step and Polyak average (nothing couples the twins' steps then)."""
        if self._by_hand is not None:
            loss, q_value, grads = self._by_hand.critic_net_grads(k, targets, x)
            if step:
                self._install(self._net_params[k], grads)
                self._critic_net_step(k)
            return loss, q_value, grads
        next_x, target_atoms, _ = targets.result()
        loss, q_value = self._critic_loss(k, next_x, x, target_atoms)
        return loss.detach(), q_value, torch.autograd.grad(loss, self._net_params[k])

    def _q_eager(self, k: int, x: Tensor) -> Tensor:
        with self._autocast():
            return self.critic.q_values(self._nets[k](x))

    def _q_action_grad(self, k: int, x: Tensor) -> tuple[Tensor, Tensor]:
        """One twin's half of the actor step: Q_k at x [B] and d(sum Q_k)/dx (x's rows are independent)."""
        if self._by_hand is not None:
            return self._by_hand.q_action_grad(k, x)
        x = x.detach().requires_grad_(True)
        q = self._q(k, x)
        return q.detach(), torch.autograd.grad(q.sum(), x)[0]

    def _noise(self, obs_n: Tensor) -> Tensor:
        """The actor's eps for a batch, drawn before the step that uses it (a rerun after a compile
        fallback reuses it): the same draws as one actor.sample call."""
        return torch.randn(obs_n.shape[0], self.act_dim, device=obs_n.device)

    def _sample(self, obs_n: Tensor, noise: Tensor, grad: bool) -> tuple[Tensor, Tensor, ActorTape | None]:
        """a ~ pi(.|s) and log pi(a|s) for a batch of normalized observations, and (by hand, with
        grad) the tape the actor's backward needs; with autograd the graph is in the tensors."""
        if self._by_hand is not None:
            return self._by_hand.sample(obs_n, noise, save=grad)
        with torch.set_grad_enabled(grad), self._autocast():
            return *self.actor.sample(obs_n, noise=noise), None

    def _actor_grads(self, sampled: tuple[Tensor, Tensor, ActorTape | None], daction: Tensor,
                     dlog_prob: Tensor) -> Sequence[Tensor]:
        """The actor's gradients: backpropagate dL/daction and dL/dlog_prob (the same for every row)."""
        action, log_prob, tape = sampled
        if tape is not None:
            return self._by_hand.actor_grads(tape, daction, dlog_prob)
        return torch.autograd.grad([action, log_prob], self._actor_params, [daction, dlog_prob.expand_as(log_prob)])

    # ------------------------------------------------------------------ one gradient step
    def update(self, batch: dict) -> dict[str, Tensor]:
        """One critic and alpha step (+ an actor step every policy_frequency-th call). Detached
        scalar tensors, no .item(): the caller decides when to sync."""
        cfg = self.cfg
        alpha = self.alpha
        obs, next_obs = batch["obs"], batch["next_obs"]
        critic_in = self._critic_input(obs, batch.get("critic_obs"))      # normalized once, used twice

        next_obs_n = self.obs_normalizer(next_obs)
        next_noise = self._noise(next_obs_n)         # drawn once: a rerun after a fallback reuses it
        x = self.critic.joint_input(critic_in, self.actor.to_unit(batch["actions"]))

        def critic_halves():
            # each net learns its own target distribution; the losses add up over the two nets. The
            # targets (an actor forward) are made while the worker's twin runs its forward at x.
            targets: Future[CriticTargets] = Future()
            prepare = functools.partial(self._resolve_targets, targets, batch, next_obs_n, next_noise, alpha)
            halves = self._twins.run_after(prepare, self._critic_net_grads, targets, x, step_in_halves)
            return halves, targets.result()

        # each twin steps in its own half unless its step needs the other's gradients (clipping by
        # their joint norm, averaging over learner ranks), or a compile fallback may redo the halves
        step_in_halves = self._by_hand is not None and self.grad_sync is None and not cfg.max_grad_norm > 0
        halves, (_, _, next_log_prob) = self._guarded("critic", critic_halves)
        qf_loss, q_value = halves[0][0] + halves[1][0], (halves[0][1] + halves[1][1]) / 2
        if not step_in_halves:
            self._install(self._critic_params, [*halves[0][2], *halves[1][2]])
            self._twins.run(self._critic_net_step)
        if cfg.autotune_alpha:
            # d/dlog_alpha of -mean(alpha * (log pi(a'|s') + target_entropy)), alpha = exp(log_alpha)
            alpha_grad = -(self.log_alpha.detach().exp() * (next_log_prob + self.target_entropy).mean())
            self._install([self.log_alpha], [alpha_grad], clip=False)
            fused_adamw_step(self.alpha_optimizer, [self.log_alpha], [self.log_alpha.grad])
        self._num_updates += 1

        if self._num_updates % cfg.policy_frequency == 0:
            self._actor_step(obs, critic_in, alpha)
        return {"qf_loss": qf_loss, "q_value": q_value, **self._actor_metrics, "alpha": self.alpha}

    def _resolve_targets(self, targets: Future[CriticTargets], batch: dict, next_obs_n: Tensor, noise: Tensor,
                         alpha: Tensor) -> None:
        """targets <- the critics' input at (s', a' ~ pi(s')) and the soft return atoms, or the error."""
        try:
            next_action, next_log_prob, _ = self._sample(next_obs_n, noise, grad=False)
            with torch.no_grad(), self._autocast():
                next_log_prob = next_log_prob.float()
                # soft return atoms r + discount * bootstrap * (z - alpha * log pi(a'|s')), shared by both nets
                soft_next = self.critic.support.unsqueeze(0) - (alpha * next_log_prob).unsqueeze(1)    # [B, N]
                scale = (batch["discount"] * batch["bootstrap"]).unsqueeze(1)
                target_atoms = batch["rewards"].unsqueeze(1) + scale * soft_next
                next_x = self.critic.joint_input(self._critic_input(batch["next_obs"], batch.get("next_critic_obs")),
                                                 next_action)
        except BaseException as exc:
            targets.set_exception(exc)      # the worker's twin is waiting for them
            raise
        targets.set_result(CriticTargets(next_x, target_atoms, next_log_prob))

    def _actor_step(self, obs: Tensor, critic_in: Tensor, alpha: Tensor) -> None:
        """Minimize mean(alpha * log pi(a|s) - (Q1 + Q2) / 2) over the actor's parameters: each twin
        gives dQ/da on its own thread, the actor backpropagates their mean and alpha / B per
        log-prob (the critics' weight gradients are neither needed nor computed)."""
        obs_n = self.obs_normalizer(obs)
        batch, noise = obs_n.shape[0], self._noise(obs_n)     # drawn once: a rerun after a fallback reuses it

        def grads() -> tuple[list[Tensor], Tensor, Tensor]:
            sampled = self._sample(obs_n, noise, grad=True)
            (q1, dq1), (q2, dq2) = self._twins.run(self._q_action_grad,
                                                   self.critic.joint_input(critic_in, sampled[0].detach()))
            # d/da of -mean((Q1 + Q2) / 2): the rows' Q gradients (the action's columns of the critics'
            # input), summed over the twins, / (2 B)
            daction, dlog_prob = (dq1 + dq2)[:, -self.act_dim:] / (-2.0 * batch), alpha / batch
            log_prob = sampled[1].detach()
            loss = (alpha * log_prob - (q1 + q2) / 2).mean()
            return self._actor_grads(sampled, daction, dlog_prob), loss, log_prob

        actor_grads, actor_loss, log_prob = self._guarded("actor", grads)
        self._install(self._actor_params, actor_grads)
        fused_adamw_step(self.actor_optimizer, self._actor_params, [p.grad for p in self._actor_params])
        self._actor_metrics = {"actor_loss": actor_loss, "policy_entropy": -log_prob.mean()}

    def _install(self, params: list[Tensor], grads: Sequence[Tensor], clip: bool = True) -> None:
        """Install the gradients, average them over learner ranks, clip: what the step reads."""
        for p, g in zip(params, grads):
            p.grad = g
        if self.grad_sync is not None:
            self.grad_sync(params)
        if clip and self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)

    @torch.no_grad()
    def _critic_net_step(self, k: int) -> None:
        """Twin k's AdamW step and Polyak averaging, target <- target + tau * (online - target)
        (element-wise: each twin on its own thread gives what one step of all does)."""
        params = self._net_params[k]
        fused_adamw_step(self.critic_optimizer, params, [p.grad for p in params])
        torch._foreach_lerp_(self._target_net_params[k], params, self.cfg.tau)

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
