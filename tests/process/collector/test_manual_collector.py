"""A collector left for a person to start (manual_collectors): the launcher prints its exact
command and waits; started by hand it joins the job; a second claim on its id is refused."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from support.e2e_helpers import job_segments, kill_all, observe, tiny_config, wait_for

from fastsac import shm_layout as shm

HAND_PREFIX = "collector 1 is left for you to start, by hand: "



def launch_with_collector_1_by_hand(tmp_path, job_name: str, iterations: int):
    """Start a 2-collector job whose collector 1 is manual; (launcher, the command it prints for it)."""
    cfg = tiny_config(tmp_path, job_name, env={"num_envs": 8},
                      trainer={"num_iterations": iterations,
                               "async_options": {"num_collectors": 2, "manual_collectors": [1]}})
    launcher = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(cfg)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    for line in launcher.stdout:  # the launcher prints the command before it supervises
        if HAND_PREFIX in line:
            return launcher, line.split(HAND_PREFIX, 1)[1].strip()
    kill_all(launcher)
    raise AssertionError("the launcher never printed the command for collector 1")


@pytest.mark.process
def test_hand_started_collector_joins_and_a_second_claim_is_refused(tmp_path, job_name):
    launcher, command = launch_with_collector_1_by_hand(tmp_path, job_name, 400)
    started = []
    try:
        assert command and "--collector-id 1" in command and "numactl" not in command, command
        first = subprocess.Popen(shlex.split(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(first)

        def collector1_running():
            try:
                ctl = shm.ControlBlock.attach(job_name, role="observer")
            except shm.ShmLayoutError:
                return False
            try:
                return ctl.collector(1)["state"] == shm.ProcState.RUNNING and ctl.collector(1)["pid"] == first.pid
            finally:
                ctl.close()

        wait_for(collector1_running, 60, "the hand-started collector to attach")
        second = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr   # a usage error, as every other mismatch
        assert "collector_id 1 is taken" in second.stderr, second.stderr
        rest, _ = launcher.communicate(timeout=240)
        assert launcher.returncode == 0, rest
        assert first.wait(timeout=30) == 0
        out = first.stdout.read()
        pushed = re.search(r"stopping: stop requested by the launcher; (\d+) env-step batches pushed", out)
        assert pushed and int(pushed.group(1)) > 0, out  # it fed the job, then stopped with it
        assert job_segments(job_name) == []
    finally:
        kill_all(launcher, *started)


@pytest.mark.process
def test_the_job_waits_for_a_manual_collector_and_refuses_one_with_another_config(tmp_path, job_name):
    """The learner holds the job (no env step counts) until the manual collector attached; one
    started with different settings is refused before it touches anything, and the job goes on."""
    launcher, command = launch_with_collector_1_by_hand(tmp_path, job_name, 60)
    started = []
    log = tmp_path / "run" / "logs" / "learner.log"
    try:
        wait_for(lambda: log.exists() and "waiting for collector 1 (start it by hand:" in log.read_text(), 120,
                  "the learner to say it waits for collector 1")
        ctl = wait_for(lambda: observe(job_name), 30, "the control block")
        try:
            wait_for(lambda: ctl.ingest(0)["attached"] == 1, 60, "collector 0 to attach")
            time.sleep(1.0)   # collector 0 runs and fills its ring meanwhile
            assert ctl.learner["waiting_mask"] == 0b10
            assert ctl.learner["env_steps"] == 0, "env steps counted before every planned collector attached"
            status = subprocess.run([sys.executable, "-m", "fastsac.launcher", "--status", job_name],
                                    capture_output=True, text=True, timeout=60)
            assert "WAITING for collector(s) 1 to attach" in status.stdout, status.stdout
            wrong = subprocess.run([*shlex.split(command), "env.num_envs=64", "seed=5"], capture_output=True,
                                   text=True, timeout=120)
            assert wrong.returncode == 2, wrong.stdout + wrong.stderr
            assert "does not match the running job" in wrong.stderr
            assert "env.num_envs: 8 in the running job, 64 here" in wrong.stderr, wrong.stderr
            assert "seed: 1 in the running job, 5 here" in wrong.stderr, wrong.stderr
            assert not os.path.exists(f"/dev/shm/fastsac.{job_name}.c1.ring"), "the refused collector created its ring"
            assert launcher.poll() is None, "the job died with the refused collector"
        finally:
            ctl.close()
        right = subprocess.Popen(shlex.split(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(right)
        rest, _ = launcher.communicate(timeout=240)
        assert launcher.returncode == 0, rest
        assert right.wait(timeout=30) == 0
        assert job_segments(job_name) == []
    finally:
        kill_all(launcher, *started)


@pytest.mark.process
def test_a_manual_collector_that_never_comes_fails_the_job_after_collector_wait_s(tmp_path, job_name):
    from support.e2e_helpers import launch
    cfg = tiny_config(tmp_path, job_name, trainer={"async_options": {
        "num_collectors": 2, "manual_collectors": [1], "collector_wait_s": 3.0}})
    result = launch(cfg, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    learner_log = (tmp_path / "run" / "logs" / "learner.log").read_text()
    assert "collector(s) 1 did not attach within trainer.async_options.collector_wait_s=3s" in learner_log
    assert job_segments(job_name) == []
