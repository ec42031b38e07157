"""`envpool:<task id>` envs through EnvPoolVecEnv, in this process.

The adapter is checked against EnvPool itself: per env, a one-env EnvPool pool seeded with
that env's seed and driven by the same actions, whose own next-step auto-reset (the step after
an episode ends returns the reset observation) gives the expected final and reset observations;
also names, seeds and thread placement. Tests that need EnvPool are skipped without it (CI
installs the extra: scripts/test.sh). Jobs on EnvPool tasks: tests/process/envs/test_envpool_process.py.
"""
import sys

import numpy as np
import pytest

from fastsac.common.seeds import envpool_env_seeds as env_seeds
from fastsac.config import ConfigError
from fastsac.envs.envpool_adapter import PRIVILEGED_KEY, thread_affinity_offset
from fastsac.envs.registry import check_env_name, make_env

REASON = "EnvPool tasks need the optional extra: pip install 'fastsac[envpool]'"


@pytest.fixture(scope="module")
def ep():
    return pytest.importorskip("envpool", reason=REASON)


def flat(o, keys):
    """A one-env EnvPool observation as the adapter documents it: (obs, critic_obs) float32."""
    if not isinstance(o, dict):
        return np.asarray(o, np.float32).reshape(-1), None
    obs = np.concatenate([np.ravel(o[k]) for k in keys if k != PRIVILEGED_KEY]).astype(np.float32)
    critic = np.ravel(o[PRIVILEGED_KEY]).astype(np.float32) if PRIVILEGED_KEY in keys else None
    return obs, critic


def reference(ep, task, seed, actions, max_episode_steps):
    """Same-step-reset trajectory of one env from a one-env EnvPool pool: after a step that ends
    an episode, one more step (its action ignored) yields EnvPool's own reset observation."""
    pool = ep.make_gymnasium(task, num_envs=1, seed=[int(seed)], num_threads=1, max_episode_steps=max_episode_steps)
    space = pool.observation_space
    keys = list(space.spaces) if hasattr(space, "spaces") else None
    o, _ = pool.reset()
    steps = [dict(zip(("obs", "critic"), flat(o, keys)))]
    for a in actions:
        o, r, term, trunc, _ = pool.step(a[None])
        rec = {"reward": np.float32(r[0]), "terminated": bool(term[0]), "truncated": bool(trunc[0])}
        rec["final_obs"], rec["final_critic"] = flat(o, keys)
        if term[0] or trunc[0]:
            o, r, term, trunc, info = pool.step(np.zeros_like(a)[None])
            assert info["elapsed_step"][0] == 0 and not (term[0] or trunc[0])
        rec["obs"], rec["critic"] = flat(o, keys)
        steps.append(rec)
    pool.close()
    return steps


def run_adapter(name, num_envs, seed, actions, first_env_id=0, max_episode_steps=0, num_threads=1):
    env = make_env(name, num_envs, seed=seed, first_env_id=first_env_id, max_episode_steps=max_episode_steps,
                   num_threads=num_threads)
    try:
        obs, critic = env.reset(seed)
        results = [env.step(a) for a in actions]
    finally:
        env.close()
    return obs, critic, results


def check_against_reference(ep, task, num_envs, steps, max_episode_steps, seed=3, first_env_id=0):
    """Every output of the adapter equals the per-env EnvPool reference; returns the done count."""
    env = make_env("envpool:" + task, 1, seed=0)
    low, high, act_dim = env.action_low, env.action_high, env.act_dim
    env.close()
    actions = np.random.default_rng(0).uniform(low, high, (steps, num_envs, act_dim)).astype(np.float32)
    obs0, critic0, results = run_adapter("envpool:" + task, num_envs, seed, actions, first_env_id,
                                         max_episode_steps, num_threads=2)
    seeds = env_seeds(seed, first_env_id, num_envs)
    dones = 0
    for i in range(num_envs):
        ref = reference(ep, task, seeds[i], actions[:, i], max_episode_steps)
        np.testing.assert_array_equal(obs0[i], ref[0]["obs"])
        if critic0 is not None:
            np.testing.assert_array_equal(critic0[i], ref[0]["critic"])
        for t, (res, exp) in enumerate(zip(results, ref[1:])):
            where = f"env {i} step {t}"
            assert res.reward[i] == exp["reward"], where
            assert (res.terminated[i], res.truncated[i]) == (exp["terminated"], exp["truncated"]), where
            np.testing.assert_array_equal(res.obs[i], exp["obs"], err_msg=where)
            if res.critic_obs is not None:
                np.testing.assert_array_equal(res.critic_obs[i], exp["critic"], err_msg=where)
            if exp["terminated"] or exp["truncated"]:
                dones += 1
                np.testing.assert_array_equal(res.final_obs[i], exp["final_obs"], err_msg=where)
                if res.final_critic_obs is not None:
                    np.testing.assert_array_equal(res.final_critic_obs[i], exp["final_critic"], err_msg=where)
    return dones, results


# ------------------------------------------------------------------ without EnvPool


def test_envpool_names_are_checked_without_importing_envpool(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)   # import envpool -> ImportError
    check_env_name("envpool:HumanoidRun-v1")            # config validation never needs the package
    with pytest.raises(ConfigError, match=r"'envpool:' names no EnvPool task; expected envpool:<task id>"):
        check_env_name("envpool:")
    with pytest.raises(ConfigError, match=r"envpool:HumanoidRun-v1' needs the optional dependency envpool: "
                                          r"pip install 'fastsac\[envpool\]'"):
        make_env("envpool:HumanoidRun-v1", 2, seed=0)


def test_env_seeds_are_keyed_by_seed_and_global_env_id():
    whole = env_seeds(5, 0, 100_000)
    assert whole.dtype == np.int32 and np.unique(whole).size == whole.size   # no two envs of a job share one
    np.testing.assert_array_equal(env_seeds(5, 37, 20), whole[37:57])        # a shard's seeds = its ids' seeds
    assert not np.array_equal(env_seeds(6, 0, 8), whole[:8])


def test_thread_affinity_offset_pins_only_inside_the_process_cpus():
    assert thread_affinity_offset(4, cpus=[4, 5, 6, 7], machine_cpus=8) == -1        # default: the process's CPUs
    assert thread_affinity_offset(4, "pin", cpus=[4, 5, 6, 7], machine_cpus=8) == 4   # a collector on node 1
    assert thread_affinity_offset(1, "pin", cpus=[1], machine_cpus=2) == 1
    for threads, cpus, machine in [(1, [0, 1], 4),     # fewer threads than CPUs
                                   (2, [0, 2], 4),     # a gap: worker 1 would land on CPU 1
                                   (2, [2, 3], 3)]:    # ids past the online count wrap around to CPU 0
        with pytest.raises(ValueError, match=f"cannot pin {threads} EnvPool threads"):
            thread_affinity_offset(threads, "pin", cpus=cpus, machine_cpus=machine)
    with pytest.raises(ValueError, match="affinity mode must be one of"):
        thread_affinity_offset(1, "auto")


# ------------------------------------------------------------------ with EnvPool


def test_dimensions_and_obs_split_per_task_family(ep):
    cases = {  # task: (obs_dim, critic_obs_dim, act_dim, episode)
        "BerkeleyHumanoidJoystickFlatTerrain-v1": (52, 114, 12, 1000),  # Playground: state / privileged_state
        "HumanoidRun-v1": (95, 0, 21, 1000),                            # DM Control: all named arrays
        "Hopper-v5": (11, 0, 3, 1000),                                  # Gymnasium-MuJoCo port: a Box
    }
    for task, dims in cases.items():
        env = make_env("envpool:" + task, 2, seed=0)
        try:
            assert (env.obs_dim, env.critic_obs_dim, env.act_dim, env.max_episode_steps) == dims, task
            assert env.action_low.dtype == env.action_high.dtype == np.float32
            np.testing.assert_array_equal(env.action_low, -np.ones(dims[2]))
            np.testing.assert_array_equal(env.action_high, np.ones(dims[2]))
            obs, critic = env.reset(0)
            assert obs.shape == (2, dims[0]) and obs.dtype == np.float32
            assert (critic is None) if dims[1] == 0 else (critic.shape == (2, dims[1]) and critic.dtype == np.float32)
            r = env.step(np.zeros((2, dims[2]), np.float32))
            assert r.reward.shape == (2,) and r.reward.dtype == np.float32 and r.terminated.dtype == bool
        finally:
            env.close()
    env = make_env("envpool:HumanoidRun-v1", 1, seed=0, max_episode_steps=7)
    assert env.max_episode_steps == 7
    env.close()


def test_truncation_final_obs_and_reset_match_envpool(ep):
    """DM Control (never terminates): every 7 steps all envs truncate; final_obs is the true last
    observation and obs already the next episode's first; the next step continues from it."""
    dones, results = check_against_reference(ep, "CheetahRun-v1", 3, 16, max_episode_steps=7)
    assert dones == 3 * 2
    assert results[6].truncated.all() and not results[6].terminated.any()
    assert not np.array_equal(results[6].obs, results[6].final_obs)


def test_termination_final_obs_and_critic_obs_match_envpool(ep):
    """Playground humanoid under random actions falls (terminated) at different steps per env; the
    privileged critic state follows the same rules as obs."""
    dones, results = check_against_reference(ep, "BerkeleyHumanoidJoystickFlatTerrain-v1", 2, 45,
                                             max_episode_steps=1000)
    assert dones >= 2 and any(r.terminated.any() for r in results)
    dones, results = check_against_reference(ep, "Hopper-v5", 3, 40, max_episode_steps=25, first_env_id=5)
    assert any(r.terminated.any() for r in results) and any(r.truncated.any() for r in results)


def test_split_into_shards_gives_the_same_per_env_streams(ep):
    actions = np.random.default_rng(1).uniform(-1, 1, (12, 4, 6)).astype(np.float32)
    obs, _, whole = run_adapter("envpool:CheetahRun-v1", 4, 9, actions, max_episode_steps=5, num_threads=2)
    parts = [run_adapter("envpool:CheetahRun-v1", 2, 9, actions[:, k:k + 2], first_env_id=k, max_episode_steps=5)
             for k in (0, 2)]
    np.testing.assert_array_equal(obs, np.concatenate([parts[0][0], parts[1][0]]))
    for t, res in enumerate(whole):
        for field in ("obs", "reward", "truncated"):
            joined = np.concatenate([getattr(p[2][t], field) for p in parts])
            np.testing.assert_array_equal(getattr(res, field), joined, err_msg=f"{field} step {t}")
    assert not np.array_equal(obs[0], obs[1])   # envs do not share a stream


def test_reset_restarts_the_streams_of_its_seed(ep):
    env = make_env("envpool:HumanoidRun-v1", 2, seed=4)
    try:
        first, _ = env.reset(4)
        env.step(np.zeros((2, env.act_dim), np.float32))
        np.testing.assert_array_equal(env.reset(4)[0], first)
        assert not np.array_equal(env.reset(5)[0], first)
    finally:
        env.close()
    with pytest.raises(RuntimeError, match="before reset"):
        make_env("envpool:HumanoidRun-v1", 1, seed=0).step(np.zeros((1, 21), np.float32))


def test_unknown_task_or_action_space_is_a_config_error(ep):
    with pytest.raises(ConfigError, match=r"'envpool:HumanoidRn-v1': not an EnvPool task id; close ids: HumanoidRun-v1"):
        make_env("envpool:HumanoidRn-v1", 1, seed=0)
    with pytest.raises(ConfigError, match=r"close ids: HumanoidRun-v1"):
        make_env("envpool:humanoidrun-v1", 1, seed=0)
    with pytest.raises(ConfigError, match=r"CartPole-v1' has action space Discrete\(2\).*continuous Box"):
        make_env("envpool:CartPole-v1", 1, seed=0)
