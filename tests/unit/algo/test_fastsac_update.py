"""FastSAC agent: one update, the policy_frequency counter, checkpoints, normalizers."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from fastsac.common.transition import TransitionBatch
from fastsac.algo.fastsac import FastSAC
from fastsac.algo.replay_buffer import ReplayBuffer
from fastsac.config import AlgoConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # deterministic, and fast on 2 cores


LOW, HIGH = np.array([-2.0, -1.0], np.float32), np.array([2.0, 3.0], np.float32)
OBS_DIM, ACT_DIM = 5, 2


def make_agent(critic_obs_dim=0, seed=0, **kw) -> FastSAC:
    base = dict(actor_hidden_dim=32, critic_hidden_dim=32, actor_num_layers=2, critic_num_layers=2,
                num_atoms=21, v_min=-10.0, v_max=10.0, batch_size=64, policy_frequency=3, critic_lr=1e-3)
    base.update(kw)
    torch.manual_seed(seed)
    return FastSAC(OBS_DIM, critic_obs_dim, ACT_DIM, LOW, HIGH, AlgoConfig(**base), torch.device("cpu"))


def make_batch(n=64, critic_obs_dim=0, seed=0, bootstrap=1.0) -> dict:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, ACT_DIM, generator=g)
    batch = {
        "obs": torch.randn(n, OBS_DIM, generator=g) * 3 + 1,
        "actions": torch.tensor(LOW) + u * torch.tensor(HIGH - LOW),
        "rewards": torch.randn(n, generator=g),
        "next_obs": torch.randn(n, OBS_DIM, generator=g) * 3 + 1,
        "bootstrap": torch.full((n,), bootstrap),
        "discount": torch.full((n,), 0.9),
        "critic_obs": None, "next_critic_obs": None,
    }
    if critic_obs_dim:
        batch["critic_obs"] = torch.randn(n, critic_obs_dim, generator=g)
        batch["next_critic_obs"] = torch.randn(n, critic_obs_dim, generator=g)
    return batch


def actor_steps(agent: FastSAC) -> int:
    p = next(agent.actor.parameters())
    state = agent.actor_optimizer.state.get(p)
    return int(state["step"]) if state else 0


def filled_buffer(critic_obs_dim=0, steps=12) -> ReplayBuffer:
    g = torch.Generator().manual_seed(1)
    buf = ReplayBuffer(4, 16, OBS_DIM, critic_obs_dim, ACT_DIM, 2, 0.9, "cpu")
    no = torch.zeros(4, dtype=torch.bool)
    for _ in range(steps):
        co = torch.randn(4, critic_obs_dim, generator=g) if critic_obs_dim else None
        buf.extend(slice(0, 4), TransitionBatch(
            torch.randn(4, OBS_DIM, generator=g), co, torch.rand(4, ACT_DIM, generator=g), torch.randn(4, generator=g),
            no, no, torch.zeros(0, dtype=torch.long), torch.zeros(0, OBS_DIM),
            torch.zeros(0, critic_obs_dim) if critic_obs_dim else None))
    return buf


def test_update_reduces_critic_loss_and_learns_terminal_targets():
    # bootstrap = 0: the target distribution is (the projection of) a point mass at r, a fixed
    # target, so the loss must fall well below its initial value (about 2 log(num_atoms))
    # and the expected Q must approach r
    agent = make_agent(policy_frequency=1000, critic_lr=3e-3, critic_hidden_dim=64)   # 64 -> 32: room to fit 64 targets
    batch = make_batch(bootstrap=0.0)
    batch["rewards"] = torch.randint(-4, 5, (64,)).float() * 2.0 + (torch.arange(64) % 2) * 0.5
    agent.update_normalizers(batch["obs"], None)
    first = agent.update(batch)
    assert {"qf_loss", "actor_loss", "alpha", "policy_entropy"} <= set(first)
    for v in first.values():
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
    for _ in range(200):
        last = agent.update(batch)
    assert last["qf_loss"] < 0.5 * first["qf_loss"]
    with torch.no_grad():
        logits = agent.critic(agent.critic_obs_normalizer(batch["obs"]), agent.actor.to_unit(batch["actions"]))
        q = agent.critic.q_values(logits)
    torch.testing.assert_close(q, batch["rewards"].expand(2, -1), atol=0.3, rtol=0)


def test_target_networks_follow_by_polyak_averaging():
    agent = make_agent(tau=0.25)
    before = [p.clone() for p in agent.critic_target.parameters()]
    agent.update(make_batch())
    for old, target, online in zip(before, agent.critic_target.parameters(), agent.critic.parameters()):
        torch.testing.assert_close(target, old + 0.25 * (online - old))


def test_policy_frequency_counter_is_exact_across_calls_and_checkpoints():
    agent = make_agent(policy_frequency=3)
    batch = make_batch()
    steps = []
    for _ in range(4):
        agent.update(batch)
        steps.append(actor_steps(agent))
    assert steps == [0, 0, 1, 1]                         # the actor on every 3rd critic update
    buf = filled_buffer()
    agent.train(buf, 4)                                  # crosses a call boundary: updates 5..8
    assert agent.num_updates_done == 8 and actor_steps(agent) == 2

    f = io.BytesIO()
    torch.save(agent.state_dict(), f)
    f.seek(0)
    resumed = make_agent(policy_frequency=3, seed=1)
    resumed.load_state_dict(torch.load(f, weights_only=True))
    assert resumed.num_updates_done == 8 and actor_steps(resumed) == 2
    resumed.update(batch)                                # update 9 -> actor step 3
    assert actor_steps(resumed) == 3
    assert agent.train(buf, 0) == {}


def test_state_dict_round_trip_gives_identical_behaviour():
    agent = make_agent(critic_obs_dim=3)
    buf = filled_buffer(critic_obs_dim=3)
    agent.update_normalizers(buf.obs.reshape(-1, OBS_DIM), buf.critic_obs.reshape(-1, 3))
    torch.manual_seed(5)
    agent.train(buf, 7)

    f = io.BytesIO()
    torch.save(agent.state_dict(), f)
    f.seek(0)
    clone = make_agent(critic_obs_dim=3, seed=123)       # different init: everything must come from the file
    clone.load_state_dict(torch.load(f, weights_only=True))

    obs = torch.randn(16, OBS_DIM)
    torch.testing.assert_close(clone.act(obs, deterministic=True), agent.act(obs, deterministic=True), rtol=0, atol=0)
    assert torch.equal(clone.policy_flat(), agent.policy_flat())
    batch = make_batch(critic_obs_dim=3, seed=7)
    metrics = []
    for a in (agent, clone):                             # optimizer moments, targets, alpha: next steps identical
        torch.manual_seed(11)
        a.update(batch); a.update(batch)
        metrics.append(a.update(batch))
    m_agent, m_clone = metrics
    for k in m_agent:
        assert torch.equal(m_agent[k], m_clone[k]), k
    for p, q in zip(agent.critic_target.parameters(), clone.critic_target.parameters()):
        assert torch.equal(p, q)
    assert clone.log_alpha.item() == agent.log_alpha.item()

    with pytest.raises(ValueError, match="dims"):
        make_agent(critic_obs_dim=0).load_state_dict(agent.state_dict())


def test_normalizers_critic_tracks_obs_without_critic_obs():
    agent = make_agent()
    obs = torch.randn(100, OBS_DIM) * 4 + 3
    agent.update_normalizers(obs, None)
    torch.testing.assert_close(agent.critic_obs_normalizer.mean, agent.obs_normalizer.mean)
    torch.testing.assert_close(agent.obs_normalizer.mean, obs.mean(0))
    flat = agent.policy_flat()
    torch.testing.assert_close(flat[-2 * OBS_DIM:], torch.cat([obs.mean(0), obs.var(0, unbiased=False)]))

    with_critic = make_agent(critic_obs_dim=3)
    cobs = torch.randn(100, 3) - 7
    with_critic.update_normalizers(obs, cobs)
    torch.testing.assert_close(with_critic.critic_obs_normalizer.mean, cobs.mean(0))

    off = make_agent(obs_normalization=False)
    off.update_normalizers(obs, None)
    assert torch.equal(off.obs_normalizer.mean, torch.zeros(OBS_DIM))
    off.update(make_batch())                             # runs without normalization


def test_alpha_fixed_without_autotune_and_moves_with_it():
    fixed = make_agent(autotune_alpha=False, policy_frequency=1)
    tuned = make_agent(autotune_alpha=True, policy_frequency=1, alpha_lr=1e-2, target_entropy_ratio=-5.0)
    batch = make_batch()
    for _ in range(5):
        mf, mt = fixed.update(batch), tuned.update(batch)
    assert float(mf["alpha"]) == pytest.approx(0.001)
    assert float(mt["alpha"]) > 0.001                    # entropy below a (high) target: alpha grows


def test_alpha_steps_with_every_critic_update_from_the_next_actions():
    # policy_frequency 3: updates 1 and 2 have no actor step, yet alpha moves in each (as the
    # reference's, from log pi(a'|s') of the critic target's next actions)
    agent = make_agent(policy_frequency=3, alpha_lr=1e-2, target_entropy_ratio=-5.0)
    batch = make_batch()
    alphas = [float(agent.alpha)]
    for _ in range(2):
        agent.update(batch)
        alphas.append(float(agent.alpha))
    assert actor_steps(agent) == 0
    assert alphas[0] < alphas[1] < alphas[2]
    assert int(agent.alpha_optimizer.state[agent.log_alpha]["step"]) == 2
