"""The CPU update's kernels (fastsac/algo/cpu_kernels.py: C, and the torch ops that replace them
where no compiler works) and the MLP backward by hand (mlp_backprop.py) against autograd on the
same modules: values and gradients within float32 rounding."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastsac.algo import cpu_kernels
from fastsac.algo.cpu_kernels import c51_critic_head, c51_q_head, kernels_in_use, layer_norm_silu, \
    layer_norm_silu_backward
from fastsac.algo.mlp_backprop import hidden_layers, linear_backward, trunk_backward, trunk_forward
from fastsac.algo.networks import categorical_projection, mlp_trunk

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(params=["C", "torch"])
def kernels(request, monkeypatch):
    """Each test runs with the C kernels and with the torch ops that stand in for them."""
    if request.param == "C":
        assert kernels_in_use().startswith("C kernels"), kernels_in_use()
    else:
        monkeypatch.setattr(cpu_kernels, "_usable", lambda *tensors: False)
    return request.param


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 2e-5) -> bool:
    return bool(((a - b).abs() <= rtol * (1 + b.abs().max())).all())


def test_layer_norm_silu_forward_and_backward_match_autograd(kernels):
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(37, 96, generator=g) * 3 + 0.5).requires_grad_()
    gamma = (torch.rand(96, generator=g) + 0.5).requires_grad_()
    beta = (torch.randn(96, generator=g) * 0.1).requires_grad_()
    ref = F.silu(F.layer_norm(z, [96], gamma, beta, 1e-5))
    dh = torch.randn(37, 96, generator=g)
    ref.backward(dh)
    # the kernels consume their input (z, dh): the callers hand them tensors of their own
    h, saved = layer_norm_silu(z.detach().clone(), gamma.detach(), beta.detach(), 1e-5, save=True)
    assert close(h, ref.detach())
    h_only, none = layer_norm_silu(z.detach().clone(), gamma.detach(), beta.detach(), 1e-5, save=False)
    assert none is None and h_only.data_ptr() != h.data_ptr() and close(h_only, h, 1e-7)
    dz, dgamma, dbeta, dz_sum = layer_norm_silu_backward(dh.clone(), saved, gamma.detach(), beta.detach())
    assert close(dz, z.grad) and close(dgamma, gamma.grad) and close(dbeta, beta.grad)
    assert close(dz_sum, z.grad.sum(0))


def test_the_c51_heads_match_autograd(kernels):
    g = torch.Generator().manual_seed(1)
    rows, n, v_min, v_max = 45, 31, -20.0, 20.0
    support = torch.linspace(v_min, v_max, n)
    target_logits = torch.randn(rows, n, generator=g)
    logits = torch.randn(rows, n, generator=g).requires_grad_()
    # atoms beyond both ends and exactly on support points: clipping and the lower <= n - 2 cap
    target_atoms = torch.randn(rows, 1, generator=g) * 15 + 0.95 * support
    target_atoms[0] = support
    target = categorical_projection(target_atoms, torch.softmax(target_logits, -1), v_min, v_max)
    ref_loss = -(target * torch.log_softmax(logits, -1)).sum(-1)
    ref_loss.mean().backward()
    loss, q, dlogits = c51_critic_head(target_logits, logits.detach(), target_atoms.expand(rows, n).contiguous(),
                                       support, v_min, v_max, 1.0 / rows)
    assert close(loss, ref_loss.detach()) and close(dlogits, logits.grad)
    assert close(q, (torch.softmax(logits.detach(), -1) * support).sum(-1))

    x = logits.detach().clone().requires_grad_()
    ref_q = (torch.softmax(x, -1) * support).sum(-1)
    ref_q.sum().backward()
    q, dq = c51_q_head(logits.detach(), support)
    assert close(q, ref_q.detach()) and close(dq, x.grad)


def test_a_nan_target_atom_is_an_error_not_a_stray_write(kernels):
    """NaN rewards or log-probs make NaN atom positions: both paths refuse them (the C projection
    would otherwise index outside its row)."""
    rows, n = 4, 11
    support = torch.linspace(-1.0, 1.0, n)
    atoms = support.expand(rows, n).clone()
    atoms[2, 5] = float("nan")
    with pytest.raises(RuntimeError):
        c51_critic_head(torch.zeros(rows, n), torch.zeros(rows, n), atoms, support, -1.0, 1.0, 0.25)


@pytest.mark.parametrize("input_grad", [False, True])
def test_the_trunk_backward_by_hand_gives_autograds_gradients(kernels, input_grad):
    torch.manual_seed(2)
    trunk, head = mlp_trunk(11, [64, 48]), torch.nn.Linear(48, 5)
    x = torch.randn(33, 11, requires_grad=input_grad)
    dy = torch.randn(33, 5)
    head(trunk(x)).backward(dy)
    layers = hidden_layers(trunk)
    h, tape = trunk_forward(layers, x.detach(), save=True)
    assert close(h, trunk(x).detach())
    grads, dx = trunk_backward(layers, tape, dy.mm(head.weight), param_grads=True, input_grad=input_grad)
    grads += linear_backward(head, h, dy)
    params = [*trunk.parameters(), *head.parameters()]
    assert len(grads) == len(params)
    for p, got in zip(params, grads):
        assert close(got, p.grad), float((got - p.grad).abs().max())
    assert (dx is None) == (not input_grad)
    if input_grad:
        assert close(dx, x.grad)


def test_a_trunk_that_is_not_linear_norm_silu_is_refused():
    with pytest.raises(ValueError, match="not an mlp_trunk"):
        hidden_layers(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.SiLU()))


def test_large_blocks_on_two_threads_give_what_one_thread_gives():
    """Blocks of >= 32768 values run their rows on the calling thread's OpenMP threads (the
    column sums of the backward reduced over threads): the same values as on one thread."""
    assert kernels_in_use().startswith("C kernels"), kernels_in_use()
    g = torch.Generator().manual_seed(3)
    z, dh = torch.randn(600, 128, generator=g) * 2, torch.randn(600, 128, generator=g)
    gamma, beta = torch.rand(128, generator=g) + 0.5, torch.randn(128, generator=g) * 0.1
    logits, target_logits = torch.randn(600, 61, generator=g), torch.randn(600, 61, generator=g)
    support = torch.linspace(-10.0, 10.0, 61)
    atoms = (support * 0.9 + torch.randn(600, 1, generator=g)).contiguous()

    def run() -> list[torch.Tensor]:
        h, saved = layer_norm_silu(z.clone(), gamma, beta, 1e-5, save=True)
        return [h, *layer_norm_silu_backward(dh.clone(), saved, gamma, beta),
                *c51_critic_head(target_logits, logits, atoms, support, -10.0, 10.0, 1 / 600), *c51_q_head(logits, support)]

    one = run()
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = run()
    finally:
        torch.set_num_threads(n)
    for a, b in zip(two, one):
        assert close(a, b, 1e-5)
