"""`envpool:<task id>` envs in processes: EnvPool's worker threads on the process's CPUs, the
launcher's refusal of an unknown task, collectors and the sync trainer on EnvPool tasks. Skipped
without EnvPool (CI installs the extra). The adapter's own checks: tests/unit/envs/test_envpool.py.
"""
import os
import re
import subprocess
import sys
import textwrap

import pytest
from support.e2e_helpers import job_segments, launch, newest_checkpoint, tiny_config

REASON = "EnvPool tasks need the optional extra: pip install 'fastsac[envpool]'"


@pytest.fixture(scope="module")
def ep():
    return pytest.importorskip("envpool", reason=REASON)


@pytest.mark.process
def test_worker_threads_stay_on_the_process_cpus(ep):
    """Bound to one CPU, the EnvPool workers run there: never on CPUs outside the binding, where
    EnvPool's absolute thread_affinity_offset would put them if chosen blindly."""
    cpu = max(os.sched_getaffinity(0))
    code = textwrap.dedent(f"""
        import glob, os
        os.sched_setaffinity(0, {{{cpu}}})  # first: threads made later (BLAS, EnvPool) inherit it
        import numpy as np
        from fastsac.envs.registry import make_env
        env = make_env("envpool:CheetahRun-v1", 2, seed=0, num_threads=1)
        env.reset(0)
        env.step(np.zeros((2, 6), np.float32))
        print(env.describe_stepping())
        for task in glob.glob(f"/proc/{{os.getpid()}}/task/*/status"):
            line = [x for x in open(task).read().splitlines() if x.startswith("Cpus_allowed_list")][0]
            print(line.split()[1])
        env.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    stepping, *threads = out.stdout.splitlines()
    assert stepping == "EnvPool on 1 thread, on the process's CPUs", out.stdout
    assert len(threads) >= 2 and set(threads) == {str(cpu)}, out.stdout   # main thread + worker(s)


@pytest.mark.process
def test_launcher_rejects_an_unknown_task_with_exit_2(ep, tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, env={"name": "envpool:HumanoidRn-v1"})
    proc = launch(cfg, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not an EnvPool task id; close ids: HumanoidRun-v1" in proc.stderr
    assert job_segments(job_name) == [] and not (tmp_path / "run").exists()


@pytest.mark.process
def test_two_collectors_collect_envpool_episodes(ep, tmp_path, job_name):
    """Collection only (num_updates 0): two collector processes step their EnvPool shards (random
    actions, then the initial policy) through several episode boundaries; the learner ingests it all."""
    cfg = tiny_config(tmp_path, job_name, env={"name": "envpool:CheetahRun-v1", "num_envs": 5, "max_episode_steps": 6},
                      algo={"num_updates": 0},
                      trainer={"num_iterations": 20, "async_options": {"num_collectors": 2}})
    proc = launch(cfg, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = tmp_path / "run"
    for i, (first, last) in enumerate([(0, 2), (3, 4)]):
        log = (run / "logs" / f"collector{i}.log").read_text()
        assert re.search(rf"envs {first}\.\.{last} of envpool:CheetahRun-v1 \(EnvPool on \d threads?, on the "
                         r"process's CPUs\)", log), log
    from fastsac.run_dir.checkpoint import load_checkpoint
    ckpt = load_checkpoint(newest_checkpoint(run))
    assert ckpt["env_steps"] >= 20 * 5 and ckpt["agent"]["num_updates_done"] == 0
    assert job_segments(job_name) == []


@pytest.mark.process
def test_sync_trainer_learns_on_an_envpool_task(ep, tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, env={"name": "envpool:BerkeleyHumanoidJoystickFlatTerrain-v1", "num_envs": 2},
                      trainer={"num_iterations": 8, "asynchronous": False})
    proc = launch(cfg, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from fastsac.run_dir.checkpoint import load_checkpoint
    ckpt = load_checkpoint(newest_checkpoint(tmp_path / "run"))
    assert ckpt["env_steps"] == 8 * 2 and ckpt["agent"]["num_updates_done"] > 0
    assert ckpt["agent"]["dims"] == {"obs_dim": 52, "critic_obs_dim": 114, "act_dim": 12}
