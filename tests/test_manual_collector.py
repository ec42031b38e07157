"""A collector left for a person to start (manual_collectors): the launcher prints its exact
command and waits; started by hand it joins the job; a second claim on its id is refused."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

from e2e_helpers import job_segments, tiny_config
from fastsac import shm_layout as shm

HAND_PREFIX = "collector 1 is left for you to start, by hand: "


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_hand_started_collector_joins_and_a_second_claim_is_refused(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, env={"num_envs": 8},
                      trainer={"num_iterations": 400,
                               "async_options": {"num_collectors": 2, "manual_collectors": [1]}})
    launcher = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(cfg)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    started = []
    try:
        command = None
        for line in launcher.stdout:  # the launcher prints the command before it supervises
            if HAND_PREFIX in line:
                command = line.split(HAND_PREFIX, 1)[1].strip()
                break
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

        _wait_for(collector1_running, 60, "the hand-started collector to attach")
        second = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "collector_id 1 is taken" in second.stderr, second.stderr
        rest, _ = launcher.communicate(timeout=240)
        assert launcher.returncode == 0, rest
        assert first.wait(timeout=30) == 0
        out = first.stdout.read()
        pushed = re.search(r"stopping: stop requested by the launcher; (\d+) env-step batches pushed", out)
        assert pushed and int(pushed.group(1)) > 0, out  # it fed the job, then stopped with it
        assert job_segments(job_name) == []
    finally:
        for proc in [launcher, *started]:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL) if proc is launcher else proc.kill()
                except ProcessLookupError:
                    pass
                proc.wait()
