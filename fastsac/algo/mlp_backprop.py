"""Forward and backward of fastsac's MLPs by hand, for the CPU update: no autograd graph.

An MLP here is networks.mlp_trunk's (Linear -> LayerNorm -> SiLU) x L followed by linear heads.
On a CPU, autograd's cost per op (graph nodes, saved tensors, one Python call per op and per
backward node) and the separate LayerNorm and SiLU kernels are about as expensive as the update's
matrix products (benchmarks/bench_update.py). Here each hidden layer is one addmm plus one fused
LayerNorm+SiLU kernel forward (cpu_kernels.py), and two matrix products plus one fused kernel
backward; what the backward needs is kept in a tape.

The gradients are those autograd gives for the same modules (tests/unit/algo/test_mlp_backprop.py,
and the update as a whole: test_update_equivalence.py), in the order of `module.parameters()`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor, nn

from fastsac.algo.cpu_kernels import LayerNormSiLUSaved, layer_norm_silu, layer_norm_silu_backward


class HiddenLayer(NamedTuple):
    linear: nn.Linear
    norm: nn.LayerNorm


class TrunkTape(NamedTuple):
    """Each hidden layer's input and its LayerNorm+SiLU's saved values, and the trunk's output."""
    inputs: list[Tensor]
    saved: list[LayerNormSiLUSaved]
    output: Tensor


def hidden_layers(trunk: nn.Sequential) -> list[HiddenLayer]:
    """The (Linear, LayerNorm) pairs of an mlp_trunk (each followed by a SiLU)."""
    modules = list(trunk)
    kinds = (nn.Linear, nn.LayerNorm, nn.SiLU)
    if len(modules) % 3 or not all(isinstance(m, kinds[i % 3]) for i, m in enumerate(modules)):
        raise ValueError(f"not an mlp_trunk (Linear, LayerNorm, SiLU per layer): {trunk}")
    return [HiddenLayer(modules[i], modules[i + 1]) for i in range(0, len(modules), 3)]


def trunk_forward(layers: list[HiddenLayer], x: Tensor, save: bool) -> tuple[Tensor, TrunkTape | None]:
    """The trunk's output for x [B, in]; with save, the tape trunk_backward needs."""
    inputs, saved = [], []
    for linear, norm in layers:
        h, kept = layer_norm_silu(F.linear(x, linear.weight, linear.bias), norm.weight, norm.bias, norm.eps, save)
        if save:
            inputs.append(x)
            saved.append(kept)
        x = h
    return x, (TrunkTape(inputs, saved, x) if save else None)


def trunk_backward(layers: list[HiddenLayer], tape: TrunkTape, dout: Tensor, param_grads: bool,
                   input_grad: bool) -> tuple[list[Tensor], Tensor | None]:
    """From dL/d(trunk output): the parameter gradients in trunk.parameters() order (linear weight
    and bias, norm weight and bias, per layer; [] without param_grads) and dL/dx (None without
    input_grad). Products that are not asked for are not computed. dout is consumed (overwritten)."""
    grads: list[Tensor] = []
    dh = dout
    for i in reversed(range(len(layers))):
        linear, norm = layers[i]
        dz, dgamma, dbeta, dbias = layer_norm_silu_backward(dh, tape.saved[i], norm.weight, norm.bias)
        if param_grads:
            grads[:0] = [dz.t().mm(tape.inputs[i]), dbias, dgamma, dbeta]
        dh = dz.mm(linear.weight) if (i > 0 or input_grad) else None
    return grads, dh


def linear_backward(linear: nn.Linear, x: Tensor, dy: Tensor) -> list[Tensor]:
    """[dL/dweight, dL/dbias] of y = linear(x) from dy = dL/dy."""
    return [dy.t().mm(x), dy.sum(0)]
