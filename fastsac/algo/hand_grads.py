"""The update's losses and gradients computed by hand (mlp_backprop.py): FastSAC's CPU path.

The same quantities as FastSAC's autograd path (fastsac.py, `_critic_loss_eager` and friends),
piece for piece, so the update reads the same on both: one twin's critic loss and gradients, one
twin's Q and dQ/dx, and the actor's sample with what its backward needs. Derivations:

critic, net k, logits l, target distribution p* (sums to 1 up to rounding), B rows:
    loss = -mean_rows(sum_j p*_j log softmax(l)_j);  dloss/dl = (softmax(l) * sum_j p*_j - p*) / B
Q of a row, c = support:  Q = sum_j softmax(l)_j c_j;  dQ/dl = softmax(l) * (c - Q)
actor, per action dim (eps fixed, t = tanh(raw log-std head), a = tanh(u), u = mean + std * eps):
    log pi = sum_i [-eps^2/2 - log_std - log sqrt(2 pi) - 2 (log 2 - u - softplus(-2u))]
    dlog pi/du = 2a,  dlog pi/dlog_std = -1 (+ through u: du/dlog_std = std * eps),
    da/du = 1 - a^2,  dlog_std/draw = (log_std_max - log_std_min) / 2 * (1 - t^2)
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fastsac.algo.cpu_kernels import c51_critic_head, c51_q_head
from fastsac.algo.mlp_backprop import TrunkTape, hidden_layers, linear_backward, trunk_backward, trunk_forward
from fastsac.algo.networks import Actor, DistributionalQNet


class CriticTargets(NamedTuple):
    """What the critics' targets need from the next states (made while the critics' forward at the
    current states runs, see FastSAC.update)."""
    next_x: Tensor            # the critics' input at (s', a' ~ pi(s'))
    target_atoms: Tensor      # r + discount * bootstrap * (z - alpha * log pi(a'|s')), [B, N]
    next_log_prob: Tensor     # log pi(a'|s') [B]


class ActorTape(NamedTuple):
    """An actor sample's forward values that its backward needs."""
    trunk: TrunkTape
    eps: Tensor
    std: Tensor
    squash_slope: Tensor       # 1 - t^2 of the log-std head's tanh
    action: Tensor


class HandGrads:
    """Losses and gradients of the twin critics and the actor, forward and backward by hand."""

    def __init__(self, actor: Actor, nets: tuple[DistributionalQNet, ...], target_nets: tuple[DistributionalQNet, ...],
                 support: Tensor, v_min: float, v_max: float):
        self.actor, self.nets, self.target_nets = actor, nets, target_nets
        self.support, self.v_min, self.v_max = support, v_min, v_max
        self._actor_layers = hidden_layers(actor.trunk)
        self._layers = [hidden_layers(net.trunk) for net in nets]
        self._target_layers = [hidden_layers(net.trunk) for net in target_nets]

    @staticmethod
    def _logits(net: DistributionalQNet, h: Tensor) -> Tensor:
        return F.linear(h, net.head.weight, net.head.bias)

    @torch.no_grad()
    def critic_net_grads(self, k: int, targets: Future[CriticTargets],
                         x: Tensor) -> tuple[Tensor, Tensor, list[Tensor]]:
        """Twin k's cross-entropy against its target net's projected distribution: (loss, mean Q,
        gradients in net.parameters() order). The forward at x runs before it waits for targets."""
        net, target_net = self.nets[k], self.target_nets[k]
        h, tape = trunk_forward(self._layers[k], x, save=True)
        next_x, target_atoms, _ = targets.result()
        target_h, _ = trunk_forward(self._target_layers[k], next_x, save=False)
        loss, q, dlogits = c51_critic_head(self._logits(target_net, target_h), self._logits(net, h), target_atoms,
                                           self.support, self.v_min, self.v_max, 1.0 / x.shape[0])
        grads, _ = trunk_backward(self._layers[k], tape, dlogits.mm(net.head.weight), param_grads=True,
                                  input_grad=False)
        return loss.mean(), q.mean(), grads + linear_backward(net.head, h, dlogits)

    @torch.no_grad()
    def q_action_grad(self, k: int, x: Tensor) -> tuple[Tensor, Tensor]:
        """Q_k at x [B] and d(sum Q_k)/dx (the rows are independent)."""
        net = self.nets[k]
        h, tape = trunk_forward(self._layers[k], x, save=True)
        q, dlogits = c51_q_head(self._logits(net, h), self.support)
        _, dx = trunk_backward(self._layers[k], tape, dlogits.mm(net.head.weight), param_grads=False,
                               input_grad=True)
        return q, dx

    @torch.no_grad()
    def sample(self, obs_n: Tensor, noise: Tensor, save: bool) -> tuple[Tensor, Tensor, ActorTape | None]:
        """(unit action, log-prob) of Actor.sample(obs_n, noise=noise); with save, the tape for
        actor_grads."""
        actor = self.actor
        h, trunk_tape = trunk_forward(self._actor_layers, obs_n, save)
        mean, log_std = actor.heads(h)
        action, log_prob = Actor.squash(mean, log_std, noise)
        if not save:
            return action, log_prob, None
        t = (log_std - actor.log_std_min) * (2.0 / (actor.log_std_max - actor.log_std_min)) - 1.0
        return action, log_prob, ActorTape(trunk_tape, noise, log_std.exp(), 1.0 - t.square(), action)

    @torch.no_grad()
    def actor_grads(self, tape: ActorTape, daction: Tensor, dlog_prob: Tensor) -> list[Tensor]:
        """The actor's gradients (actor.parameters() order) from dL/daction [B, act] and
        dL/dlog_prob (a scalar for every row)."""
        actor = self.actor
        du = daction * (1.0 - tape.action.square()) + 2.0 * dlog_prob * tape.action
        dlog_std = du * tape.std * tape.eps - dlog_prob
        draw = dlog_std * (0.5 * (actor.log_std_max - actor.log_std_min)) * tape.squash_slope
        h = tape.trunk.output
        dh = du.mm(actor.mean_head.weight).addmm_(draw, actor.log_std_head.weight)
        trunk_grads, _ = trunk_backward(self._actor_layers, tape.trunk, dh, param_grads=True, input_grad=False)
        return trunk_grads + linear_backward(actor.mean_head, h, du) + linear_backward(actor.log_std_head, h, draw)
