"""The async trainer's evaluator process, end to end through fastsac-launch on tiny pendulum jobs:
its results reach TensorBoard (written by the learner), `--plan` and `--status` show it, it maps
no ring, and a killed or hung evaluator never stops training (restarted, or given up on) and
leaves no segment behind.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest
from support.e2e_helpers import job_segments, kill_all, tiny_config, wait_for
from support.eval_runs import EVAL_TAGS, PENDULUM_STEPS, eval_points, with_eval

from fastsac import shm_layout as shm

NUM_ENVS = 8   # tiny_config's


def start(config, *overrides) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(config), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def channel(job: str):
    try:
        return shm.EvalChannel.attach(job)
    except shm.ShmLayoutError:
        return None


def first_result(job: str, timeout: float = 120) -> tuple[shm.EvalChannel, dict]:
    ch = wait_for(lambda: channel(job), timeout, "the evaluator's channel")
    got = wait_for(lambda: ch.read_result(), timeout, "a first evaluation result")
    return ch, got[1]


def eval_job(tmp_path, job, iterations: int, **async_options):
    cfg = tiny_config(tmp_path, job, trainer={"num_iterations": iterations,
                                              "async_options": {"restart_backoff_s": 0.1, **async_options}})
    return with_eval(cfg, interval=25, episodes=3, num_envs=2)


@pytest.mark.process
def test_async_job_evaluates_off_the_learner_and_logs_eval_scalars(tmp_path, job_name):
    config = eval_job(tmp_path, job_name, 200)
    plan = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(config), "--plan"], capture_output=True,
                          text=True, timeout=60)
    assert plan.returncode == 0 and "-m fastsac.evaluator_main --config" in plan.stdout, plan.stdout + plan.stderr
    launcher = start(config)
    try:
        ch, result = first_result(job_name)
        pid = ch.status()["pid"]
        # the evaluator maps its own two segments and no ring: eval envs never write to one
        mapped = {line.split()[-1] for line in open(f"/proc/{pid}/maps") if "/dev/shm/fastsac." in line}
        assert mapped == {f"/dev/shm/fastsac.{job_name}.{s}" for s in ("ctl", "eval", "eval.wts")}, mapped
        ctl = shm.ControlBlock.attach(job_name, role="observer")
        assert ctl.collector(0)["pid"] not in (0, pid)
        ctl.close()
        status = subprocess.run([sys.executable, "-m", "fastsac.launcher", "--status", job_name],
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        line = [x for x in status.stdout.splitlines() if x.startswith("EVALUATOR")]
        assert line and f"pid {pid}" in line[0] and "last: env step" in line[0], status.stdout
        ch.close()
        out, err = launcher.communicate(timeout=240)
    finally:
        kill_all(launcher)
    assert launcher.returncode == 0, out + err
    assert "eval @ " in out                     # the learner's console line, echoed by the launcher
    points = eval_points(tmp_path / "run")
    assert sorted(points) == sorted(EVAL_TAGS), points
    steps = [s for s, _ in points["eval/mean_return"]]
    assert len(steps) >= 2 and steps == sorted(set(steps)), steps
    assert steps[0] >= 25 * NUM_ENVS and steps[-1] == 200 * NUM_ENVS, steps   # the final weights too
    for tag, series in points.items():
        assert all(math.isfinite(v) for _, v in series), (tag, series)
    assert {v for _, v in points["eval/mean_ep_len"]} == {PENDULUM_STEPS}
    assert not job_segments(job_name)


@pytest.mark.process
def test_a_killed_evaluator_is_restarted_and_training_finishes(tmp_path, job_name):
    launcher = start(eval_job(tmp_path, job_name, 300))
    try:
        ch, _ = first_result(job_name)
        pid = ch.status()["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: ch.status()["incarnation"] == 2 and ch.status()["pid"] != pid, 120,
                 "the restarted evaluator")
        ch.close()
        out, err = launcher.communicate(timeout=240)
    finally:
        kill_all(launcher)
    assert launcher.returncode == 0, out + err
    assert "the evaluator exited with code -9" in out and "restarting the evaluator (restart 1/3)" in out, out
    log = (tmp_path / "run" / "logs" / "evaluator.log").read_text()
    assert log.count("starting evaluator") == 2 and "incarnation 2" in log, log
    assert eval_points(tmp_path / "run")["eval/mean_return"], "no eval point at all"
    assert not job_segments(job_name)


@pytest.mark.process
def test_a_hung_evaluator_is_killed_and_given_up_on_while_training_goes_on(tmp_path, job_name):
    launcher = start(eval_job(tmp_path, job_name, 400, max_restarts=0, heartbeat_timeout_s=2.0))
    try:
        ch, _ = first_result(job_name)
        pid = ch.status()["pid"]
        os.kill(pid, signal.SIGSTOP)
        ch.close()
        out, err = launcher.communicate(timeout=240)
    finally:
        kill_all(launcher)
    assert launcher.returncode == 0, out + err
    assert f"evaluator (pid {pid}) is hung" in out, out
    assert "giving up on evaluation; training goes on" in out, out
    assert "final checkpoint" in out and not job_segments(job_name)


@pytest.mark.process
def test_a_hung_evaluator_delays_a_graceful_stop_by_seconds_not_stop_timeout_s(tmp_path, job_name):
    # before: the final checkpoint within a second, then two minutes (stop_timeout_s) of waiting
    launcher = start(eval_job(tmp_path, job_name, 100000, heartbeat_timeout_s=600.0, stop_timeout_s=60.0))
    try:
        ch, _ = first_result(job_name)
        pid = ch.status()["pid"]
        ch.close()
        os.kill(pid, signal.SIGSTOP)            # hung: it will never see the stop flag
        t0 = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        kill_all(launcher)
    assert launcher.returncode == 0, out + err
    assert f"the evaluator (pid {pid}) did not stop within 5s of the stop request; killing it" in out, out
    assert "final checkpoint" in out and took < 30, (took, out)
    assert not job_segments(job_name)
