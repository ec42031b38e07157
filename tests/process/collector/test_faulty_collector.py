"""A collector whose ring holds what no correct collector writes (here: its write cursor moved
1,000 slots ahead by another process, as a stray write or a bug would) never takes the job
down: the learner drops it without training on that data, the launcher restarts it, the new
incarnation replaces its ring, the learner attaches it again and the job finishes normally."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from support.e2e_helpers import job_segments, kill_all, observe, tiny_config, wait_for

from fastsac import shm_layout as shm


@pytest.mark.process
def test_a_corrupted_ring_drops_and_restarts_its_collector_not_the_job(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"num_iterations": 1_000_000, "async_options": {
        "restart_backoff_s": 0.2}})
    launcher = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(cfg)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = tmp_path / "run" / "logs" / "learner.log"
    try:
        ctl = wait_for(lambda: observe(job_name), 120, "the job's control block")
        try:
            wait_for(lambda: ctl.ingest(0)["ingested_slots"] > 5, 120, "the learner to ingest")
            # The collector stores its own cursor at every commit: one stray write can be overwritten
            # before the learner reads it. Repeat it until the learner drops the collector; the
            # mapping stays on this ring's file, so a replaced ring (the next incarnation's) is never hit.
            ring = np.memmap(f"/dev/shm/fastsac.{job_name}.c0.ring", np.int64, "r+")

            def corrupted_and_dropped() -> bool:
                if ctl.ingest(0)["faults"] >= 1:
                    return True
                ring[shm.RING_WRITE_CURSOR // 8] += 1000     # what the adversarial probe did
                time.sleep(0.2)
                return False

            wait_for(corrupted_and_dropped, 60, "the learner to drop collector 0")
            assert ctl.ingest(0)["faults"] == 1
            wait_for(lambda: "collector 0: re-attached" in log.read_text(), 120, "collector 0 to come back")
            after = ctl.ingest(0)["ingested_slots"]
            wait_for(lambda: ctl.ingest(0)["ingested_slots"] > after + 5, 60, "ingestion from the new incarnation")
            assert ctl.ingest(0)["dropped"] == 0 and ctl.supervisor(0)["restarts"] == 1
            assert ctl.learner["state"] == shm.ProcState.RUNNING
        finally:
            ctl.close()
        os.killpg(launcher.pid, signal.SIGTERM)
        out, _ = launcher.communicate(timeout=120)
        assert launcher.returncode == 0, out
        assert "collector 0 (pid" in out and "was dropped by the learner (cursor distance" in out, out
        text = log.read_text()
        assert "collector 0 dropped (fault 1): cursor distance" in text, text
        assert job_segments(job_name) == []
    finally:
        kill_all(launcher)
