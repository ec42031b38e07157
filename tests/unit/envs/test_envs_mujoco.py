"""Batched MuJoCo tasks (humanoid, ant, halfcheetah) against Gymnasium's v5 envs.

The batched env makes exactly Gymnasium's MuJoCo calls on one MjData per env, so states
are bit-identical and observations/rewards agree to float32 rounding.
"""
import sys

import numpy as np
import pytest

from fastsac.config import ConfigError
from fastsac.envs.registry import make_env

TASKS = {"humanoid": "Humanoid-v5", "ant": "Ant-v5", "halfcheetah": "HalfCheetah-v5"}


@pytest.fixture(scope="module")
def mujoco():
    return pytest.importorskip("mujoco", reason="MuJoCo tasks need the optional extra: pip install 'fastsac[mujoco]'")


@pytest.fixture(scope="module")
def gym(mujoco):
    gym = pytest.importorskip("gymnasium", reason="needs gymnasium: pip install 'fastsac[mujoco]'")
    pytest.importorskip("imageio", reason="Gymnasium's MuJoCo envs import imageio: pip install 'gymnasium[mujoco]'")
    return gym


def gym_env(gym, mujoco, gid, **kwargs):
    from fastsac.envs.mujoco_base import quiet_mujoco_compile
    with quiet_mujoco_compile(mujoco):
        return gym.make(gid, **kwargs)


def assert_obs_close(ours, ref):
    # ours is float32, Gymnasium's float64: compare at float32 resolution
    np.testing.assert_allclose(ours, ref.astype(np.float32), rtol=2e-6, atol=2e-6 * (1 + np.abs(ref).max()))


def test_missing_mujoco_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco", None)  # import mujoco now raises ImportError
    with pytest.raises(ConfigError, match=r"^env\.name 'humanoid' needs the optional dependency mujoco: "
                                          r"pip install 'fastsac\[mujoco\]'"):
        make_env("humanoid", 2, seed=0)


@pytest.mark.parametrize("task", list(TASKS))
def test_dims_and_bounds_match_gymnasium(task, gym, mujoco):
    env, ref = make_env(task, 2, seed=0), gym_env(gym, mujoco, TASKS[task])
    try:
        assert env.obs_dim == ref.observation_space.shape[0]
        assert env.act_dim == ref.action_space.shape[0]
        np.testing.assert_array_equal(env.action_low, ref.action_space.low)
        np.testing.assert_array_equal(env.action_high, ref.action_space.high)
        assert env.max_episode_steps == ref.spec.max_episode_steps == 1000
        assert env.critic_obs_dim == 0
        assert env.dt == pytest.approx(ref.unwrapped.dt)
    finally:
        env.close()
        ref.close()
    assert {"humanoid": 348, "ant": 105, "halfcheetah": 17}[task] == env.obs_dim


@pytest.mark.parametrize("task", list(TASKS))
def test_trajectory_matches_gymnasium(task, gym, mujoco):
    """Reset from the same noise stream, then the same actions: same states, obs, rewards, terminations."""
    seed, first, k = 7, 5, 1  # compare env k of the shard = global env id 6
    env = make_env(task, 3, seed=seed, first_env_id=first, num_threads=2)
    ref = gym_env(gym, mujoco, TASKS[task])
    try:
        ref.unwrapped.np_random = np.random.default_rng(np.random.SeedSequence([seed, first + k]))
        ref_obs, _ = ref.reset()
        obs, _ = env.reset(seed)
        assert_obs_close(obs[k], ref_obs)
        rng = np.random.default_rng(1)
        for t in range(40):
            a = rng.uniform(env.action_low, env.action_high, (3, env.act_dim)).astype(np.float32)
            r = env.step(a)
            ref_obs, ref_rew, ref_term, ref_trunc, _ = ref.step(a[k])
            assert bool(r.terminated[k]) == ref_term and bool(r.truncated[k]) == ref_trunc
            ended = ref_term or ref_trunc
            assert_obs_close(r.final_obs[k] if ended else r.obs[k], ref_obs)
            assert r.reward[k] == pytest.approx(ref_rew, rel=1e-6, abs=1e-5)
            if ended:
                break
            qpos, qvel = env.get_state(k)
            np.testing.assert_array_equal(qpos, ref.unwrapped.data.qpos)  # same calls: bit-identical
            np.testing.assert_array_equal(qvel, ref.unwrapped.data.qvel)
        if task == "humanoid":
            assert ended and ref_term, "random actions should topple the humanoid within 40 steps"
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("task", list(TASKS))
def test_step_from_given_state_matches_gymnasium(task, gym, mujoco):
    """Same qpos/qvel in (after MujocoEnv.set_state) -> same obs/reward/terminated out."""
    env = make_env(task, 2, seed=0)
    ref = gym_env(gym, mujoco, TASKS[task])
    try:
        rng = np.random.default_rng(2)
        for _ in range(12):  # reach a non-trivial state with contacts
            env.step(rng.uniform(env.action_low, env.action_high, (2, env.act_dim)).astype(np.float32))
        qpos, qvel = env.get_state(1)
        qvel = qvel + rng.normal(0, 0.3, qvel.shape)
        obs1 = env.set_state(1, qpos, qvel)
        ref.reset(seed=0)
        mujoco.mj_resetData(ref.unwrapped.model, ref.unwrapped.data)
        ref.unwrapped.set_state(qpos, qvel)
        assert_obs_close(obs1, ref.unwrapped._get_obs())
        for _ in range(3):
            a = rng.uniform(env.action_low, env.action_high, (2, env.act_dim)).astype(np.float32)
            r = env.step(a)
            ref_obs, ref_rew, ref_term, _, _ = ref.step(a[1])
            assert bool(r.terminated[1]) == ref_term
            assert_obs_close(r.final_obs[1], ref_obs)  # final_obs is valid every step (equal to obs when not done)
            assert r.reward[1] == pytest.approx(ref_rew, rel=1e-6, abs=1e-5)
            if ref_term:
                break
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("task", list(TASKS))
def test_reset_seeding_keyed_by_global_env_id(task, mujoco):
    big = make_env(task, 8, seed=3, first_env_id=0)
    small = make_env(task, 3, seed=3, first_env_id=4)
    again = make_env(task, 3, seed=3, first_env_id=4)
    other = make_env(task, 3, seed=4, first_env_id=4)
    try:
        obs_big, _ = big.reset(3)
        obs_small, _ = small.reset(3)
        np.testing.assert_array_equal(obs_small, obs_big[4:7])
        np.testing.assert_array_equal(again.reset(3)[0], obs_small)
        assert not np.allclose(other.reset(4)[0], obs_small)
        assert len({row.tobytes() for row in obs_big}) == 8  # no two envs share a stream
        # re-seeding the same env reproduces its initial states
        np.testing.assert_array_equal(small.reset(3)[0], obs_small)
    finally:
        for e in (big, small, again, other):
            e.close()


def test_thread_count_does_not_change_results(mujoco):
    a1, a2 = make_env("humanoid", 6, seed=1, num_threads=1), make_env("humanoid", 6, seed=1, num_threads=2)
    try:
        np.testing.assert_array_equal(a1.reset(1)[0], a2.reset(1)[0])
        rng = np.random.default_rng(0)
        for _ in range(30):
            act = rng.uniform(a1.action_low, a1.action_high, (6, a1.act_dim)).astype(np.float32)
            r1, r2 = a1.step(act), a2.step(act)
            for f in ("obs", "reward", "terminated", "truncated", "final_obs"):
                np.testing.assert_array_equal(getattr(r1, f), getattr(r2, f))
    finally:
        a1.close()
        a2.close()


def test_truncation_returns_true_final_obs(mujoco):
    """HalfCheetah never terminates: at max_episode_steps every env truncates, final_obs is the
    true last observation (that of an env without a time limit) and obs the reset one."""
    short = make_env("halfcheetah", 4, seed=2, max_episode_steps=5)
    long = make_env("halfcheetah", 4, seed=2)
    try:
        obs0, _ = short.reset(2)
        np.testing.assert_array_equal(obs0, long.reset(2)[0])
        rng = np.random.default_rng(0)
        for t in range(1, 7):
            act = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
            rs, rl = short.step(act), long.step(act)
            assert not rs.terminated.any()
            if t < 5:
                assert not rs.truncated.any()
                np.testing.assert_array_equal(rs.obs, rl.obs)
            elif t == 5:
                assert rs.truncated.all()
                np.testing.assert_array_equal(rs.final_obs, rl.obs)
                np.testing.assert_array_equal(rs.reward, rl.reward)
                assert not np.allclose(rs.obs, rs.final_obs)
                # the reset observation: qpos[1:] near the initial pose (noise 0.1), not the moved cheetah
                assert np.abs(rs.obs[:, :8] - short.init_qpos[1:]).max() <= 0.1 + 1e-6
            else:
                assert not rs.truncated.any()  # the step counter restarted
    finally:
        short.close()
        long.close()


def test_termination_returns_fallen_final_obs(mujoco):
    env = make_env("humanoid", 16, seed=0)
    try:
        rng = np.random.default_rng(0)
        seen = 0
        for _ in range(60):
            r = env.step(rng.uniform(env.action_low, env.action_high, (16, env.act_dim)).astype(np.float32))
            for i in np.flatnonzero(r.terminated):
                seen += 1
                assert not 1.0 < r.final_obs[i, 0] < 2.0  # obs[0] is the torso height qpos[2]: unhealthy
                assert abs(r.obs[i, 0] - env.init_qpos[2]) <= 1e-2 + 1e-6  # reset height
        assert seen > 0
    finally:
        env.close()


def test_no_compile_warning_spam(mujoco, tmp_path, monkeypatch, capfd):
    """Gymnasium's half_cheetah.xml makes MuJoCo 4 warn about settotalmass per load; it is dropped
    (and no MUJOCO_LOG.TXT appears in the cwd)."""
    monkeypatch.chdir(tmp_path)
    env = make_env("halfcheetah", 3, seed=0)
    env.close()
    out, err = capfd.readouterr()
    assert "settotalmass" not in out + err
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_halfcheetah_mujoco_batch_is_bit_identical_to_the_loop(mujoco):
    """HalfCheetah reads only qpos/qvel, so it is stepped by mujoco.batch (in C, no GIL): same
    states, observations, rewards and resets as the per-env MjData loop, at any thread count."""
    from fastsac.envs.mujoco_tasks import HalfCheetah
    pytest.importorskip("mujoco.batch", reason="mujoco.batch needs mujoco>=4.0")
    loop = HalfCheetah(5, seed=3, max_episode_steps=7, physics="loop")
    batched = [HalfCheetah(5, seed=3, max_episode_steps=7, num_threads=t) for t in (1, 3)]
    try:
        assert loop.describe_stepping() == "per-env MjData loop on 1 thread"
        assert [b.describe_stepping() for b in batched] == ["mujoco.batch on 1 thread", "mujoco.batch on 3 threads"]
        obs0 = loop.reset(3)[0]
        for b in batched:
            np.testing.assert_array_equal(b.reset(3)[0], obs0)
        rng = np.random.default_rng(0)
        for _ in range(16):  # two truncations: resets go through both backends
            act = rng.uniform(-1.5, 1.5, (5, 6)).astype(np.float32)  # out of range too: clipped
            ref = loop.step(act)
            for b in batched:
                r = b.step(act)
                for f in ("obs", "reward", "terminated", "truncated", "final_obs"):
                    np.testing.assert_array_equal(getattr(r, f), getattr(ref, f))
                for i in range(5):
                    for ours, theirs in zip(b.get_state(i), loop.get_state(i)):
                        np.testing.assert_array_equal(ours, theirs)
        qpos, qvel = loop.get_state(2)
        np.testing.assert_array_equal(batched[0].set_state(4, qpos, qvel + 0.5), loop.set_state(4, qpos, qvel + 0.5))
    finally:
        for e in (loop, *batched):
            e.close()


def test_mujoco_batch_is_refused_for_tasks_that_read_derived_fields(mujoco):
    from fastsac.envs.mujoco_tasks import Humanoid
    with pytest.raises(ValueError, match="physics='batch' needs a state-only task"):
        Humanoid(2, seed=0, physics="batch")
    env = Humanoid(2, seed=0)
    try:
        assert env.describe_stepping() == "per-env MjData loop on 1 thread"
    finally:
        env.close()
