"""One fused AdamW step for a list of parameters of a torch.optim.AdamW(fused=True): the kernel
optimizer.step() calls, without optimizer.step()'s Python around it.

Why: on a CPU an update takes ~15 ms and steps three optimizers; optimizer.step()'s hooks,
profiler records, state grouping and per-call checks cost ~0.5 ms of Python each, more than the
fused kernel itself for fastsac's networks. The state lives where optimizer.step() keeps it
(optimizer.state[p]: step, exp_avg, exp_avg_sq, created as it does), so state_dict(),
load_state_dict() and checkpoints are those of the optimizer, and a subset of a group's parameters
can be stepped on its own (each twin critic on its own thread, fastsac.py).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def fused_adamw_step(optimizer: torch.optim.AdamW, params: Sequence[Tensor], grads: Sequence[Tensor]) -> None:
    """optimizer.step() for these parameters (all in its one param group) with these gradients."""
    group = optimizer.param_groups[0]
    if len(optimizer.param_groups) != 1 or not group["fused"] or group["amsgrad"] or group["maximize"]:
        raise ValueError("fused_adamw_step needs an AdamW with one param group, fused=True, no amsgrad/maximize")
    states = [optimizer.state[p] for p in params]
    for p, state in zip(params, states):
        if not state:          # as Adam._init_group creates it for a fused optimizer
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    steps = [s["step"] for s in states]
    torch._foreach_add_(steps, 1)
    beta1, beta2 = group["betas"]
    torch._fused_adamw_(list(params), list(grads), [s["exp_avg"] for s in states],
                        [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=group["lr"],
                        beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                        maximize=False, grad_scale=None, found_inf=None)
