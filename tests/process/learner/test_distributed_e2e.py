"""Learner groups end to end on this CPU box (gloo): several learners on one machine, two
"machines" simulated by two launchers, a learner killed with SIGKILL, resume across learner
counts. Plans, config checks and the status view: tests/unit/machine/test_learner_placement.py and
tests/process/machine/test_learner_placement_process.py."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.e2e_helpers import free_port, job_segments, launch, observe, scalar_tags, wait_for
from support.shm_jobs import _own_segments, _unlink_names, new_job_name

from fastsac.run_dir.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
DIGEST = re.compile(r"learner rank (\d+): final actor digest ([0-9a-f]{8})")


@pytest.fixture
def job_name2():
    """A second job name (the other simulated machine's), cleaned up like `job_name`."""
    job = new_job_name()
    yield job
    _unlink_names(_own_segments(job + "."))


def small(job: str, run_dir: Path, iterations: int = 16, **extra) -> list[str]:
    """The quick-start config made small: 8 envs, tiny nets, a few seconds per job."""
    o = {"job_name": job, "run_dir": run_dir, "device": "cpu", "env.num_envs": 8,
         "trainer.num_iterations": iterations, "algo.actor_hidden_dim": 32, "algo.critic_hidden_dim": 32,
         "algo.num_atoms": 21, "algo.batch_size": 64, "algo.buffer_size": 64, "algo.learning_starts": 2,
         "trainer.async_options.collector_inference_device": "cpu", "trainer.async_options.ring_capacity": 4,
         "logging.interval": 4, "logging.interval_s": 1.0, "distributed.timeout_s": 30,
         "distributed.master_addr": "127.0.0.1", **extra}
    return [f"{k}={v}" for k, v in o.items()]


def digests(run_dir: Path) -> dict[int, str]:
    out = {}
    for log in sorted((run_dir / "logs").glob("learner*.log")):
        for rank, digest in DIGEST.findall(log.read_text()):
            out[int(rank)] = digest
    return out


def start(*overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(QUICKSTART), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def two_machines(tmp_path, jobs: tuple[str, str], *extra: str, iterations: int = 100000,
                 per_machine=((), ())) -> tuple[list[subprocess.Popen], list[Path]]:
    """Two launchers on loopback as machines 0 and 1 of one job (node_rank 0 hosts the rendezvous)."""
    port, runs = free_port(), [tmp_path / "node0", tmp_path / "node1"]
    procs = [start(*small(job, run, iterations=iterations), "distributed.nnodes=2", f"distributed.node_rank={rank}",
                   f"distributed.master_port={port}", *extra, *per_machine[rank])
             for rank, (job, run) in enumerate(zip(jobs, runs))]
    return procs, runs


def wait_trained(job: str) -> None:
    """Until the learner of that machine's job has done an update."""
    def trained():
        ctl = observe(job)
        if ctl is None:
            return False
        try:
            return ctl.learner["num_updates"] > 0
        finally:
            ctl.close()
    wait_for(trained, 120, "the group to train")


def finish(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Every launcher's output once it exited; on a hang kill them all (the test fails)."""
    deadline, outs = time.monotonic() + timeout, []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return outs


@pytest.mark.process
def test_two_learners_train_one_model(tmp_path, job_name):
    run = tmp_path / "run"
    proc = launch(QUICKSTART, *small(job_name, run), "trainer.async_options.num_collectors=2",
                  "distributed.num_learners=2", f"distributed.master_port={free_port()}", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = digests(run)
    assert set(d) == {0, 1} and d[0] == d[1], d              # identical actors on both ranks
    assert sorted(p.name for p in (run / "logs").iterdir()) == \
        ["collector0.log", "collector1.log", "evaluator.log", "learner0.log", "learner1.log"]   # the quick start evaluates
    for name in ("learner0.log", "learner1.log"):             # torch's deprecation notices stay out of them
        assert "Warning" not in (run / "logs" / name).read_text(), name
    ckpt = load_checkpoint(sorted((run / "checkpoints").glob("ckpt_*.pt"))[-1])
    assert ckpt["env_steps"] == 16 * 8                        # the job's budget, not twice it
    tags = scalar_tags(run)
    assert {"perf/learn_pct_rank0", "perf/learn_pct_rank1", "perf/env_steps_per_s"} <= set(tags)
    assert job_segments(job_name) == []


@pytest.mark.process
def test_two_machines_simulated_by_two_launchers(tmp_path, job_name, job_name2):
    procs, runs = two_machines(tmp_path, (job_name, job_name2), iterations=16)
    outs = finish(procs, 180)
    assert [p.returncode for p in procs] == [0, 0], outs
    d0, d1 = digests(runs[0]), digests(runs[1])
    assert set(d0) == {0} and set(d1) == {1} and d0[0] == d1[1]
    ckpt = load_checkpoint(sorted((runs[0] / "checkpoints").glob("ckpt_*.pt"))[-1])
    assert ckpt["env_steps"] == 2 * 16 * 8                    # the sum over machines of num_iterations x num_envs
    assert not (runs[1] / "checkpoints").exists() or not list((runs[1] / "checkpoints").glob("*.pt"))
    assert not (runs[1] / "tb").exists()                       # rank 0 alone writes TensorBoard
    assert job_segments(job_name) == job_segments(job_name2) == []


@pytest.mark.process
def test_a_killed_learner_stops_both_machines_naming_its_rank(tmp_path, job_name, job_name2):
    procs, runs = two_machines(tmp_path, (job_name, job_name2), "distributed.timeout_s=15")
    try:
        def running():
            ctl = observe(job_name2)
            if ctl is None:
                return None
            try:
                rec = ctl.learner
                return rec["pid"] if rec["state"] == 2 and rec["num_updates"] > 0 else None
            finally:
                ctl.close()
        pid = wait_for(running, 120, "rank 1 to train")
        os.kill(pid, signal.SIGKILL)
    finally:
        outs = finish(procs, 90)
    assert [p.returncode for p in procs] == [1, 1], outs
    assert "learner rank 1 (cpu, node_rank 1) failed: exit code -9" in outs[1], outs[1]
    assert re.search(r"learner rank\(s\) 1 \(node_rank 1\) stopped answering|learner rank 1", outs[0]), outs[0]
    assert job_segments(job_name) == job_segments(job_name2) == []


@pytest.mark.process
def test_resume_with_another_learner_count(tmp_path, job_name):
    """Checkpoints carry no topology: 2 learners -> 1 learner -> 2 learners, one run."""
    run, port = tmp_path / "run", free_port()
    two = ["trainer.async_options.num_collectors=2", "distributed.num_learners=2", f"distributed.master_port={port}"]
    assert launch(QUICKSTART, *small(job_name, run, iterations=8), *two, timeout=180).returncode == 0
    first = load_checkpoint(sorted((run / "checkpoints").glob("ckpt_*.pt"))[-1])
    proc = launch(QUICKSTART, *small(job_name, run, iterations=16), "resume=auto", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resume: loaded" in proc.stdout
    second = load_checkpoint(sorted((run / "checkpoints").glob("ckpt_*.pt"))[-1])
    proc = launch(QUICKSTART, *small(job_name, run, iterations=24), *two, "resume=auto", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    third = load_checkpoint(sorted((run / "checkpoints").glob("ckpt_*.pt"))[-1])
    assert [c["env_steps"] for c in (first, second, third)] == [64, 128, 192]
    assert first["run_id"] == second["run_id"] == third["run_id"]
    assert third["agent"]["num_updates_done"] > second["agent"]["num_updates_done"] > first["agent"]["num_updates_done"] > 0
    d = digests(run)
    assert d[0] == d[1]


@pytest.mark.process
def test_a_rank_waiting_for_rank_0s_slow_checkpoint_is_not_taken_for_hung(tmp_path, job_name):
    # tests/support/fault_hooks: every save blocks 4 s; heartbeat_timeout_s is 2.5 s. Rank 1 waits in its
    # next collective while rank 0 writes the periodic checkpoint: its heartbeat must stay fresh.
    hooks = REPO / "tests" / "support" / "fault_hooks"
    env = dict(os.environ, FASTSAC_TEST_SLOW_SAVE_S="4",
               PYTHONPATH=os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])))
    run = tmp_path / "run"
    proc = launch(QUICKSTART, *small(job_name, run, iterations=16), "trainer.async_options.num_collectors=2",
                  "distributed.num_learners=2", f"distributed.master_port={free_port()}", "checkpoint.interval=8",
                  "trainer.async_options.heartbeat_timeout_s=2.5", timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hung" not in proc.stdout
    saved = sorted(int(p.stem.split("_")[-1]) for p in (run / "checkpoints").glob("ckpt_*.pt"))
    assert saved[0] < 16 * 8 and saved[-1] == 16 * 8, saved   # a periodic save ran while the job did
    assert job_segments(job_name) == []


@pytest.mark.process
def test_sigterm_on_one_machine_stops_every_machine_gracefully(tmp_path, job_name, job_name2):
    procs, runs = two_machines(tmp_path, (job_name, job_name2))
    try:
        wait_trained(job_name)
        os.kill(procs[1].pid, signal.SIGTERM)          # machine 1's launcher only
    finally:
        outs = finish(procs, 90)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "another learner of the group stopped" in outs[0] and "final checkpoint" in outs[0]
    assert list((runs[0] / "checkpoints").glob("ckpt_*.pt"))
    assert job_segments(job_name) == job_segments(job_name2) == []


@pytest.mark.process
def test_a_killed_launcher_of_machine_0_fails_machine_1_naming_rank_0(tmp_path, job_name, job_name2):
    # before: rank 1 printed "finished" and exited 0 at a fraction of the budget, so systemd's
    # Restart=on-failure never restarted it
    procs, runs = two_machines(tmp_path, (job_name, job_name2))
    try:
        wait_trained(job_name2)
        os.kill(procs[0].pid, signal.SIGKILL)          # machine 0's launcher only; its learner lives on
    finally:
        outs = finish(procs, 90)
    assert procs[1].returncode == 1, outs[1]
    assert "learner rank 0 (node_rank 0) stopped on a failure of its machine" in outs[1], outs[1]
    assert "finished" not in outs[1].splitlines()[-1], outs[1]
    log0 = (runs[0] / "logs" / "learner.log").read_text()
    assert "the launcher is gone" in log0 and "final checkpoint" in log0, log0
    assert job_segments(job_name2) == []


@pytest.mark.process
def test_machines_with_different_settings_all_exit_2_naming_the_keys(tmp_path, job_name, job_name2):
    # before: both trained to the end and exited 0, averaging gradients of different objectives
    differ = [["algo.gamma=0.99", "algo.batch_size=64"], ["algo.gamma=0.9", "algo.batch_size=32"]]
    procs, runs = two_machines(tmp_path, (job_name, job_name2), iterations=16, per_machine=differ)
    outs = finish(procs, 120)
    assert [p.returncode for p in procs] == [2, 2], outs
    for rank, other in ((0, 1), (1, 0)):
        text = outs[rank] + (runs[rank] / "logs" / "learner.log").read_text()
        mine, theirs = differ[rank], differ[other]
        for key in ("algo.gamma", "algo.batch_size"):
            here = next(v for v in mine if v.startswith(key)).split("=")[1]
            there = next(v for v in theirs if v.startswith(key)).split("=")[1]
            assert f"{key}: {here} here, {there} on learner rank {other} (node_rank {other})" in text, text
        assert "stopped answering" not in text, text
    assert job_segments(job_name) == job_segments(job_name2) == []
