"""The FastSAC update as it was before the twin-critic update (fastsac.algo.fastsac), kept as the
reference that benchmarks/bench_update.py times side by side and tests/unit/algo/
test_update_equivalence.py checks the product's update against. Not a product option.

It trains an agent's own modules (actor, critics, target critics, log_alpha, normalizers) with
optimizers of its own, as the agent did: per-tensor (foreach) AdamW on the CPU, fused on CUDA,
both twin critics in one loss and one backward, intra-op threads for every op.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fastsac.algo.networks import categorical_projection


class ReferenceUpdate:
    def __init__(self, agent):
        cfg = agent.cfg
        self.agent, self.cfg = agent, cfg
        fused = True if agent.device.type == "cuda" else None
        betas = (cfg.adam_beta1, cfg.adam_beta2)
        self.actor_optimizer = torch.optim.AdamW(agent.actor.parameters(), lr=cfg.actor_lr, betas=betas,
                                                 weight_decay=cfg.weight_decay, fused=fused)
        self.critic_optimizer = torch.optim.AdamW(agent.critic.parameters(), lr=cfg.critic_lr, betas=betas,
                                                  weight_decay=cfg.weight_decay, fused=fused)
        self.alpha_optimizer = torch.optim.AdamW([agent.log_alpha], lr=cfg.alpha_lr, betas=betas, weight_decay=0.0)
        self.actor_params, self.critic_params = list(agent.actor.parameters()), list(agent.critic.parameters())
        self.target_params = list(agent.critic_target.parameters())
        self.num_updates = 0

    def critic_input(self, obs: Tensor, critic_obs: Tensor | None) -> Tensor:
        a = self.agent
        return a.critic_obs_normalizer(critic_obs if a.has_critic_obs else obs)

    def critic_loss(self, obs, critic_obs, actions, rewards, next_obs, next_critic_obs, bootstrap, discount, alpha):
        a, support = self.agent, self.agent.critic.support
        with torch.no_grad():
            next_action, next_log_prob = a.actor.sample(a.obs_normalizer(next_obs))
            target_logits = a.critic_target(self.critic_input(next_obs, next_critic_obs), next_action)
            target_probs = torch.softmax(target_logits.float(), dim=-1)
            soft_next = support.unsqueeze(0) - (alpha * next_log_prob).unsqueeze(1)
            target_atoms = rewards.unsqueeze(1) + (discount * bootstrap).unsqueeze(1) * soft_next
            target = categorical_projection(target_atoms, target_probs, self.cfg.v_min, self.cfg.v_max)
        logits = a.critic(self.critic_input(obs, critic_obs), a.actor.to_unit(actions))
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        qf_loss = -(target * log_probs).sum(-1).mean(-1).sum()
        q_value = (log_probs.detach().exp() * support).sum(-1).mean()
        return qf_loss, q_value, next_log_prob.float()

    def actor_loss(self, obs, critic_obs, alpha):
        a = self.agent
        action, log_prob = a.actor.sample(a.obs_normalizer(obs))
        logits = a.critic(self.critic_input(obs, critic_obs), action)
        q = a.critic.q_values(logits).mean(0)
        return (alpha * log_prob - q).mean(), log_prob

    def step(self, optimizer, loss: Tensor, params: list[Tensor], clip: bool = True) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward(inputs=params)
        if clip and self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        optimizer.step()

    def update(self, batch: dict) -> dict[str, Tensor]:
        a, cfg = self.agent, self.cfg
        alpha = a.log_alpha.detach().exp()
        qf_loss, q_value, next_log_prob = self.critic_loss(
            batch["obs"], batch.get("critic_obs"), batch["actions"], batch["rewards"], batch["next_obs"],
            batch.get("next_critic_obs"), batch["bootstrap"], batch["discount"], alpha)
        self.step(self.critic_optimizer, qf_loss, self.critic_params)
        with torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.critic_params, cfg.tau)
        if cfg.autotune_alpha:
            alpha_loss = -(a.log_alpha.exp() * (next_log_prob + a.target_entropy)).mean()
            self.step(self.alpha_optimizer, alpha_loss, [a.log_alpha], clip=False)
        self.num_updates += 1
        out = {"qf_loss": qf_loss.detach(), "q_value": q_value}
        if self.num_updates % cfg.policy_frequency == 0:
            actor_loss, log_prob = self.actor_loss(batch["obs"], batch.get("critic_obs"), alpha)
            self.step(self.actor_optimizer, actor_loss, self.actor_params)
            out.update(actor_loss=actor_loss.detach(), policy_entropy=-log_prob.detach().mean())
        return out
