"""Networks, the C51 projection, the flat policy layout and the collector's InferencePolicy."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from fastsac.algo.fastsac import FastSAC
from fastsac.algo.networks import Actor, TwinDistributionalCritic, categorical_projection
from fastsac.algo.policy import InferencePolicy
from fastsac.config import AlgoConfig
from fastsac.shm_layout.policy_layout import actor_param_shapes, policy_flat_numel, trunk_widths

LOW, HIGH = np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # deterministic, and fast on 2 cores


def small_cfg(**kw) -> AlgoConfig:
    base = dict(actor_hidden_dim=16, critic_hidden_dim=16, actor_num_layers=2, critic_num_layers=2,
                num_atoms=11, batch_size=32)
    base.update(kw)
    return AlgoConfig(**base)


# ----------------------------------------------------------------------------- projection
def proj(atoms, probs, v_min=0.0, v_max=4.0):
    return categorical_projection(torch.tensor(atoms, dtype=torch.float32),
                                  torch.tensor(probs, dtype=torch.float32), v_min, v_max)


def test_projection_identity_when_atoms_on_support():
    p = [0.1, 0.2, 0.3, 0.25, 0.15]
    out = proj([0.0, 1.0, 2.0, 3.0, 4.0], p)      # every mass exactly on a support point
    torch.testing.assert_close(out, torch.tensor(p))


def test_projection_exact_hits_after_shift_and_clip_at_top():
    p = [0.1, 0.2, 0.3, 0.25, 0.15]
    out = proj([1.0, 2.0, 3.0, 4.0, 5.0], p)      # r = 1: shifted by one atom, the last one clipped to v_max
    torch.testing.assert_close(out, torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4]))


def test_projection_splits_between_neighbours():
    out = proj([1.25, 3.5, 9.0, 0.0, 0.0], [0.4, 0.4, 0.2, 0.0, 0.0])
    # 1.25 -> 0.75 on atom 1, 0.25 on atom 2; 3.5 -> half on 3 and 4; 9 -> clipped to 4
    expected = torch.tensor([0.0, 0.4 * 0.75, 0.4 * 0.25, 0.2, 0.2 + 0.2])
    torch.testing.assert_close(out, expected)


def test_projection_clips_below_v_min():
    out = proj([-3.0, -0.5, 0.5, 2.0, 2.0], [0.3, 0.2, 0.2, 0.2, 0.1])
    torch.testing.assert_close(out, torch.tensor([0.3 + 0.2 + 0.1, 0.1, 0.3, 0.0, 0.0]))


def test_projection_conserves_mass_and_mean_batched():
    g = torch.Generator().manual_seed(0)
    n, v_min, v_max = 51, -10.0, 10.0
    probs = torch.softmax(torch.randn(2, 64, n, generator=g), -1)
    support = torch.linspace(v_min, v_max, n)
    r = torch.rand(64, 1, generator=g) - 0.5
    atoms = (r + 0.9 * support).expand(2, 64, n)       # stays inside [v_min, v_max]: no clipping
    out = categorical_projection(atoms, probs, v_min, v_max)
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 64))
    assert (out >= 0).all()
    torch.testing.assert_close((out * support).sum(-1), (probs * atoms).sum(-1), atol=1e-4, rtol=0)
    # and with heavy clipping, mass is still conserved
    out = categorical_projection(r + 5.0 * support, probs, v_min, v_max)
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 64))


# ----------------------------------------------------------------------------- actor / critic
def test_actor_bounds_and_log_prob_match_torch_distributions():
    torch.manual_seed(0)
    actor = Actor(5, 2, [16, 8], -5.0, 0.0, LOW, HIGH)
    obs = torch.randn(256, 5) * 3
    with torch.no_grad():
        torch.nn.init.normal_(actor.mean_head.weight)
        torch.nn.init.normal_(actor.log_std_head.weight, std=100.0)   # push log_std into both saturation regions
    mean, log_std = actor(obs)
    assert log_std.min() >= -5.0 and log_std.max() <= 0.0
    assert log_std.min() < -4.0 and log_std.max() > -1.0

    torch.manual_seed(1)
    unit, log_prob = actor.sample(obs)
    assert unit.abs().max() < 1.0
    torch.manual_seed(1)
    eps = torch.randn(mean.shape)
    u = mean + log_std.exp() * eps
    dist = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform(cache_size=1)])
    y = dist.transforms[0](u)      # cache_size=1: log_prob(y) inverts to exactly this u (no atanh round-off)
    expected = dist.log_prob(y).sum(-1)
    torch.testing.assert_close(log_prob, expected, atol=1e-4, rtol=1e-4)

    env_action = actor.to_env(unit)
    assert (env_action >= torch.tensor(LOW)).all() and (env_action <= torch.tensor(HIGH)).all()
    torch.testing.assert_close(actor.to_unit(env_action), unit, atol=1e-6, rtol=0)
    det, _ = actor.sample(obs, deterministic=True)
    torch.testing.assert_close(det, torch.tanh(mean))


def test_actor_rejects_infinite_bounds():
    with pytest.raises(ValueError, match="finite action bounds"):
        Actor(3, 1, [8], -5.0, 0.0, np.array([-np.inf]), np.array([np.inf]))


def test_critic_shapes_and_q_values():
    critic = TwinDistributionalCritic(5, 2, [16, 8], num_atoms=11, v_min=-5.0, v_max=5.0)
    logits = critic(torch.randn(7, 5), torch.rand(7, 2) * 2 - 1)
    assert logits.shape == (2, 7, 11)
    q = critic.q_values(logits)
    assert q.shape == (2, 7) and (q >= -5).all() and (q <= 5).all()
    assert not torch.equal(logits[0], logits[1])          # two independently initialized nets



@pytest.mark.parametrize("v_min,v_max", [(-300.0, 1000.0), (-20.0, 20.0)])
def test_zero_return_init_starts_every_q_near_zero_the_default_at_the_support_middle(v_min, v_max):
    torch.manual_seed(0)
    obs, act = torch.randn(256, 5) * 3, torch.rand(256, 2) * 2 - 1
    span = v_max - v_min
    uniform = TwinDistributionalCritic(5, 2, [64, 64], 101, v_min, v_max)
    q = uniform.q_values(uniform(obs, act))
    assert (q - (v_min + v_max) / 2).abs().max() < 0.05 * span, q        # the reference's: about the middle
    zero = TwinDistributionalCritic(5, 2, [64, 64], 101, v_min, v_max, init="zero_return")
    logits = zero(obs, act)
    assert zero.q_values(logits).abs().max() < 0.02 * span, zero.q_values(logits)
    assert not torch.equal(logits[0], logits[1])           # the weights still break the symmetry
    agent = FastSAC(5, 0, 2, LOW, HIGH, AlgoConfig(num_atoms=101, v_min=v_min, v_max=v_max,
                                                   critic_init="zero_return"), torch.device("cpu"))
    for critic in (agent.critic, agent.critic_target):
        assert critic.q_values(critic(obs, act)).abs().max() < 0.02 * span
    with pytest.raises(ValueError, match="zero_return"):
        TwinDistributionalCritic(5, 2, [8], 11, v_min, v_max, init="zeros")

def linear_widths(module: torch.nn.Module) -> list[int]:
    return [m.out_features for m in module.modules() if isinstance(m, torch.nn.Linear)]


def test_trunks_taper_as_the_reference_by_default():
    agent = FastSAC(17, 0, 6, -np.ones(6), np.ones(6), AlgoConfig(num_atoms=11), torch.device("cpu"))
    assert linear_widths(agent.actor.trunk) == [512, 256, 128]              # reference actor: 512 -> 256 -> 128
    assert linear_widths(agent.critic.q1) == [768, 384, 192, 11]            # reference critic: 768 -> 384 -> 192
    assert [m.normalized_shape[0] for m in agent.critic.q2.modules()
            if isinstance(m, torch.nn.LayerNorm)] == [768, 384, 192]
    uniform = FastSAC(17, 0, 6, -np.ones(6), np.ones(6), AlgoConfig(num_atoms=11, trunk_shape="uniform"),
                      torch.device("cpu"))
    assert linear_widths(uniform.actor.trunk) == [512, 512, 512]
    assert trunk_widths(256, 2, "tapered") == [256, 128] and trunk_widths(8, 4, "tapered") == [8, 4, 2, 1]


def test_first_policy_is_centred_with_log_std_mid_bounds():
    actor = Actor(5, 2, [16, 8], -5.0, 1.0, LOW, HIGH)     # zero-initialised heads, as the reference's
    mean, log_std = actor(torch.randn(64, 5) * 10)
    torch.testing.assert_close(mean, torch.zeros(64, 2))
    torch.testing.assert_close(log_std, torch.full((64, 2), -2.0))          # (-5 + 1) / 2
    det, _ = actor.sample(torch.randn(3, 5), deterministic=True)
    torch.testing.assert_close(actor.to_env(det), torch.tensor((LOW + HIGH) / 2).expand(3, 2))


# ----------------------------------------------------------------------------- flat policy layout
@pytest.mark.parametrize("obs_dim,act_dim,kw", [
    (3, 1, dict(actor_hidden_dim=8, actor_num_layers=1)),
    (17, 6, dict(actor_hidden_dim=32, actor_num_layers=3)),
    (348, 17, dict()),                                       # reference GPU sizes (512, 256, 128)
    (17, 6, dict(actor_hidden_dim=32, actor_num_layers=3, trunk_shape="uniform")),
    (5, 2, dict(actor_hidden_dim=16, actor_num_layers=2, obs_normalization=False)),
])
def test_policy_layout_matches_torch(obs_dim, act_dim, kw):
    cfg = AlgoConfig(critic_hidden_dim=8, critic_num_layers=1, num_atoms=5, **kw)
    agent = FastSAC(obs_dim, 0, act_dim, -np.ones(act_dim), np.ones(act_dim), cfg, torch.device("cpu"))
    flat = agent.policy_flat()
    assert flat.dtype == torch.float32 and flat.dim() == 1
    assert flat.numel() == policy_flat_numel(obs_dim, act_dim, cfg)
    assert [(n, tuple(p.shape)) for n, p in agent.actor.named_parameters()] == actor_param_shapes(obs_dim, act_dim, cfg)


def test_inference_policy_matches_agent():
    torch.manual_seed(0)
    cfg = small_cfg()
    agent = FastSAC(5, 0, 2, LOW, HIGH, cfg, torch.device("cpu"))
    agent.update_normalizers(torch.randn(500, 5) * 4 + 2, None)     # non-trivial normalizer stats
    policy = InferencePolicy(5, 2, LOW, HIGH, cfg, "cpu", seed=3)
    obs = (np.random.default_rng(0).normal(size=(64, 5)) * 4 + 2).astype(np.float32)
    flat = agent.policy_flat().numpy().copy()
    policy.load_flat(flat)
    expected = agent.act(torch.from_numpy(obs), deterministic=True).numpy()
    np.testing.assert_array_equal(policy.act(obs, deterministic=True), expected)

    flat[:] = 0.0                          # load_flat copied: later writes to the source do not leak in
    np.testing.assert_array_equal(policy.act(obs, deterministic=True), expected)
    stochastic = policy.act(obs)
    assert stochastic.dtype == np.float32 and stochastic.shape == (64, 2)
    assert (stochastic >= LOW).all() and (stochastic <= HIGH).all()
    assert not np.array_equal(stochastic, expected)
    with pytest.raises(ValueError, match="expected shape"):
        policy.load_flat(flat[:-1])
