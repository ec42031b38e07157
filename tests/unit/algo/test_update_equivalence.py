"""The product's update (twin halves, fused AdamW, on one or two threads; on the CPU by hand with
fused kernels, and with autograd as on CUDA) against the update as it was
(benchmarks/reference_update.py: one twin-critic loss and backward, per-tensor AdamW): from the
same weights, seeds and batches, the same losses, gradients and parameters after K steps.

Tolerance: fp32, |new - ref| <= ATOL + RTOL * |ref|. The autograd path differs from the reference
only in the order of float sums (measured: parameters 1.4e-7, gradients 3e-8 apart after K steps).
The path by hand also computes LayerNorm + SiLU with other roundings (its own exp, ~1 ulp), and
AdamW's first step, lr * g / (|g| + 1e-8), turns rounding-level differences of a gradient element
near zero into differences of a few % of lr in that element's step: PARAM_ATOL_BY_HAND is 2% of
the test's lr. For scale, the reference against itself with its initial weights moved by 1 ulp
ends up to 5.7e-6 apart after K steps (4 perturbations); the path by hand, at most 6.4e-6."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastsac.algo.fastsac import FastSAC
from fastsac.config import AlgoConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[3]
K = 12
RTOL, ATOL = 1e-5, 2e-6
PARAM_ATOL_BY_HAND = 2e-5
PATHS = ["by hand", "autograd"]
OBS, ACT = 7, 3
LOW, HIGH = np.full(ACT, -2.0, np.float32), np.full(ACT, 1.0, np.float32)


def reference_module():
    spec = importlib.util.spec_from_file_location("reference_update", REPO / "benchmarks" / "reference_update.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


def make_agent(critic_obs_dim: int, **kw) -> FastSAC:
    cfg = dict(actor_hidden_dim=48, critic_hidden_dim=64, actor_num_layers=2, critic_num_layers=2, num_atoms=31,
               v_min=-20.0, v_max=20.0, batch_size=96, policy_frequency=2, critic_lr=1e-3, actor_lr=1e-3,
               alpha_lr=1e-3, alpha_init=0.2, target_entropy_ratio=1.0, tau=0.05)
    cfg.update(kw)
    torch.manual_seed(0)
    agent = FastSAC(OBS, critic_obs_dim, ACT, LOW, HIGH, AlgoConfig(**cfg), torch.device("cpu"))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, OBS, generator=g) * 2 + 1
    agent.update_normalizers(x, torch.randn(256, critic_obs_dim, generator=g) if critic_obs_dim else None)
    return agent


def batches(critic_obs_dim: int, n: int = 96):
    g = torch.Generator().manual_seed(11)
    for i in range(K):
        b = {"obs": torch.randn(n, OBS, generator=g) * 2 + 1, "next_obs": torch.randn(n, OBS, generator=g) * 2 + 1,
             "actions": torch.tensor(LOW) + torch.rand(n, ACT, generator=g) * torch.tensor(HIGH - LOW),
             "rewards": torch.randn(n, generator=g) * 3, "discount": torch.full((n,), 0.9),
             "bootstrap": (torch.rand(n, generator=g) > 0.1).float(), "critic_obs": None, "next_critic_obs": None}
        if critic_obs_dim:
            b["critic_obs"] = torch.randn(n, critic_obs_dim, generator=g)
            b["next_critic_obs"] = torch.randn(n, critic_obs_dim, generator=g)
        yield b


def close(new: torch.Tensor, ref: torch.Tensor, atol: float = ATOL) -> bool:
    return bool(((new - ref).abs() <= atol + RTOL * ref.abs()).all())


def on_path(agent: FastSAC, path: str) -> FastSAC:
    """The agent computing its losses and gradients by hand (a CPU's default) or with autograd (CUDA's)."""
    assert agent._by_hand is not None
    if path == "autograd":
        agent._by_hand = None
    return agent


def named_tensors(agent: FastSAC) -> dict[str, torch.Tensor]:
    out = {f"actor.{k}": v for k, v in agent.actor.state_dict().items()}
    out.update({f"critic.{k}": v for k, v in agent.critic.state_dict().items()})
    out.update({f"critic_target.{k}": v for k, v in agent.critic_target.state_dict().items()})
    out["log_alpha"] = agent.log_alpha.detach()
    return out


def grads(agent: FastSAC) -> dict[str, torch.Tensor]:
    mods = {"actor": agent.actor, "critic": agent.critic}
    return {f"{m}.{k}": p.grad.clone() for m, mod in mods.items() for k, p in mod.named_parameters()}


def run_both(critic_obs_dim: int, threads: int, path: str, **kw):
    new, ref_agent = on_path(make_agent(critic_obs_dim, **kw), path), make_agent(critic_obs_dim, **kw)
    ref = reference_module().ReferenceUpdate(ref_agent)
    new.set_threads(threads)
    losses, first_grads = [], None
    try:
        for i, b in enumerate(batches(critic_obs_dim)):
            torch.manual_seed(100 + i)
            m_new = new.update(b)
            torch.manual_seed(100 + i)
            m_ref = ref.update(b)
            losses.append((m_new, m_ref))
            if i == 1:       # after the first update with an actor step: every parameter has a gradient
                first_grads = grads(new), grads(ref_agent)
    finally:
        new.close()
    return new, ref_agent, losses, first_grads


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("critic_obs_dim,threads,extra", [
    (0, 1, {}), (0, 2, {}), (4, 2, {}), (0, 2, {"max_grad_norm": 0.5}),
    (0, 1, {"num_atoms": 51, "policy_frequency": 1}),
])
def test_update_matches_the_reference_update(critic_obs_dim, threads, extra, path):
    new, ref_agent, losses, (g_new, g_ref) = run_both(critic_obs_dim, threads, path, **extra)
    param_atol = PARAM_ATOL_BY_HAND if path == "by hand" else ATOL
    for step, (m_new, m_ref) in enumerate(losses):
        for key in ("qf_loss", "q_value", "actor_loss", "policy_entropy"):
            if key in m_ref:
                assert close(m_new[key], m_ref[key]), (step, key, float(m_new[key]), float(m_ref[key]))
    for name, g in g_ref.items():
        assert close(g_new[name], g), (name, float((g_new[name] - g).abs().max()))
    t_new, t_ref = named_tensors(new), named_tensors(ref_agent)
    assert t_new.keys() == t_ref.keys()
    for name, t in t_ref.items():
        assert close(t_new[name], t, param_atol), (name, float((t_new[name] - t).abs().max()))
    # and it trained: the parameters moved well beyond the tolerance
    moved = make_agent(critic_obs_dim, **extra).critic.state_dict()
    assert any(not close(t_new[f"critic.{k}"], v) for k, v in moved.items())


@pytest.mark.parametrize("path", PATHS)
def test_two_cpus_run_the_twins_on_two_threads(path):
    """set_threads(2) on a CPU: twin 1's halves run on the worker thread (the equivalence above
    holds for both settings); set_threads(1): all on the caller's."""
    import threading
    agent = on_path(make_agent(0), path)
    seen: list[str] = []
    grads = agent._critic_net_grads
    agent._critic_net_grads = lambda *a, **kw: (seen.append(threading.current_thread().name), grads(*a, **kw))[1]
    try:
        for threads, want in ((2, 2), (1, 1)):
            agent.set_threads(threads)
            seen.clear()
            agent.update(next(batches(0)))
            assert agent._twins.parallel == (threads == 2)
            assert len(set(seen)) == want, seen
    finally:
        agent.close()


def test_critic_parameters_are_the_twins_in_order():
    """The critic optimizer's state (and so every checkpoint) lists q1's parameters, then q2's."""
    agent = make_agent(0)
    assert [id(p) for p in agent.critic.parameters()] == [id(p) for half in agent._net_params for p in half]


class _FailingBackward(torch.autograd.Function):
    """Identity whose backward fails, as a compiled graph's backward that does not compile."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("inductor: C++ compile of the backward failed")


@pytest.mark.parametrize("where", ["critic forward", "actor backward"])
def test_a_compile_failure_in_the_first_step_falls_back_to_eager_loudly(where):
    """torch.compile failing anywhere in the first step, forward or backward: that step reruns
    eagerly, the agent says why (compile_fallback_reason, a warning), and it trains as eager does."""
    eager, agent = on_path(make_agent(0), "autograd"), on_path(make_agent(0), "autograd")   # CUDA's path
    agent.compiled = True
    if where == "critic forward":
        def broken(*a, **kw):
            raise RuntimeError("inductor: no working C++ compiler")
        agent._critic_loss = broken
    else:
        q_eager = agent._q_eager
        agent._q = lambda k, x: _FailingBackward.apply(q_eager(k, x))
    with pytest.warns(UserWarning, match="torch.compile failed"):
        for i, b in enumerate(batches(0)):
            if i == 4:
                break
            torch.manual_seed(i)
            m = agent.update(b)
            torch.manual_seed(i)
            want = eager.update(b)
            assert torch.equal(m["qf_loss"], want["qf_loss"]) and torch.equal(m["actor_loss"], want["actor_loss"])
    assert agent.compile_fallback_reason is not None
    assert agent.compile_fallback_reason.startswith("critic" if where == "critic forward" else "actor")
    assert "compile" in agent.compile_fallback_reason
    for x, y in zip(named_tensors(agent).values(), named_tensors(eager).values()):
        assert torch.equal(x, y)
