"""The job's memory, checked before anything is spawned and watched while it runs: bytes per env
(the built-in tasks' table against a fresh measurement, a probe process for other tasks), the
memory the job may use (MemAvailable, cgroup v2 and v1 limits, each bound NUMA node), a job
whose envs do not fit refused naming the largest env.num_envs that does, and a collector that
the kernel's OOM killer ends reported as such and not restarted into the same death.

tests/support/fault_hooks/memory_envs.py has the envs of known size (FatPendulum: 8 MiB per env) and
of growing size (GrowingPendulum); the OOM test runs the job in a memory cgroup of its own and
skips where one cannot be made (not root, no writable memory controller).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.e2e_helpers import job_segments, tiny_config

from fastsac.envs import env_memory
from fastsac.machine import memory_available as memory

HOOKS_DIR = Path(__file__).resolve().parents[2] / "support" / "fault_hooks"
FAT = "memory_envs:FatPendulum"
FAT_BYTES_PER_ENV = 8 * 2**20     # memory_envs.FAT_BYTES_PER_ENV
MEASURED_ON = {"pendulum": 8192, "halfcheetah": 4096, "ant": 256, "humanoid": 256}


def hooks_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HOOKS_DIR), os.environ.get("PYTHONPATH")])))


@pytest.mark.process
@pytest.mark.parametrize("task", sorted(env_memory.KNOWN_BYTES_PER_ENV))
def test_the_table_of_bytes_per_env_holds_for_each_built_in_task(task):
    if task != "pendulum":
        pytest.importorskip("mujoco", reason=f"{task} needs the mujoco extra (pip install 'fastsac[mujoco]')")
    proc = subprocess.run([sys.executable, "-m", "fastsac.envs.env_memory", task, "0", str(MEASURED_ON[task])],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout.splitlines()[-1])["bytes_per_env"]
    table = env_memory.KNOWN_BYTES_PER_ENV[task]
    assert measured <= table <= 2 * measured + 4096, (task, measured, table)   # an upper bound, not a wild one


@pytest.mark.process
def test_a_task_outside_the_table_is_measured_in_a_probe_process(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", hooks_env()["PYTHONPATH"])
    per_env, source = env_memory.bytes_per_env(FAT)
    assert 0.95 * FAT_BYTES_PER_ENV <= per_env <= 1.15 * FAT_BYTES_PER_ENV, per_env
    assert source == f"measured on {env_memory.PROBE_ENVS} envs in a probe process"


@pytest.mark.process
def test_a_job_whose_envs_do_not_fit_is_refused_naming_the_largest_count(tmp_path, job_name):
    have = memory.available_memory()[0]
    too_many = 2 * have // FAT_BYTES_PER_ENV
    cfg = tiny_config(tmp_path, job_name, run_dir="run", env={"name": FAT, "num_envs": too_many})
    for args in ([], ["--plan"]):
        proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(cfg), *args], capture_output=True,
                              text=True, timeout=240, env=hooks_env(), cwd=tmp_path, check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        m = re.search(r"the largest env\.num_envs that fits is ([\d,]+)", proc.stderr)
        assert f"env.num_envs: {too_many} envs of '{FAT}' and the rest of the job need" in proc.stderr, proc.stderr
        assert m and 0 < int(m.group(1).replace(",", "")) < too_many // 2 + 1, proc.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"] and job_segments(job_name) == []


# --------------------------------------------------------------------------- a real OOM kill

def memory_cgroup(tmp_name: str, limit: int) -> Path | None:
    """A child memory cgroup of ours with that limit (v1 or v2), or None where none can be made."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base, limit_file = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes"
            break
    else:
        base, limit_file = Path("/sys/fs/cgroup") / next(l.split("::", 1)[1] for l in lines if l.startswith("0::")) \
            .lstrip("/"), "memory.max"
    group = base / tmp_name
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit))
        if limit_file == "memory.max" and (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
    except OSError:
        try:
            group.rmdir()
        except OSError:
            pass
        return None
    return group


@pytest.mark.process
def test_a_collector_killed_by_the_oom_killer_is_reported_and_not_restarted(tmp_path, job_name):
    # before: "collector 0 exited with code -9; restarting", the same death max_restarts times,
    # and the only message "collector 0 failed 2 time(s)"
    group = memory_cgroup(f"fastsac_test_{os.getpid()}", 2 * 2**30)
    if group is None:
        pytest.skip("no memory cgroup of our own can be made here (needs root and a writable memory controller)")
    cfg = tiny_config(tmp_path, job_name, env={"name": "memory_envs:GrowingPendulum", "num_envs": 16},
                      trainer={"num_iterations": 100_000,
                               "async_options": {"max_restarts": 2, "restart_backoff_s": 0.1}})
    procs_file = group / "cgroup.procs"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(cfg)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=hooks_env(), start_new_session=True,
                                preexec_fn=lambda: procs_file.write_text(str(os.getpid())))
        out, err = proc.communicate(timeout=180)
    finally:
        deadline = time.monotonic() + 30
        while procs_file.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        group.rmdir()
    assert proc.returncode == 1, out + err
    assert "collector 0 was killed by the kernel's OOM killer (" in out and "oom_kill" in out, out + err
    assert "GiB resident at the last sample" in out and "not restarting it into the same death" in out, out
    assert "restarting collector 0" not in out, out
    assert job_segments(job_name) == []
