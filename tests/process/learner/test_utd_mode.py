"""trainer.async_options.utd_mode: what the learner does when every ring is empty.

`strict` runs num_updates per ingested env-step batch, like the synchronous trainer: no data,
no updates. `learner_bound` keeps updating on the replay buffer it already has, so a GPU
learner never idles behind slow collectors.

The real Learner runs its real loop here, against a real control block (held by a separate
"launcher" process, as the learner's liveness check requires) and a real ring and weight
snapshot that this test creates the way a collector does. The test pushes a few env-step
batches, waits until the learner has ingested all of them, then leaves the ring empty for a
second and counts the learner's updates in that second.
"""
from __future__ import annotations

import multiprocessing as mp
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from support.e2e_helpers import tiny_config

from fastsac import shm_layout as shm
from fastsac.common.stopping import StopSignal
from fastsac.common.transition import TransitionBatch
from fastsac.config import load_config
from fastsac.machine.plan import plan_job
from fastsac.process.setup import machine_topology
from fastsac.shm_layout.job_settings import job_settings
from fastsac.shm_layout.policy_layout import policy_flat_numel

NUM_ENVS, OBS_DIM, ACT_DIM = 8, 3, 1   # tiny_config's pendulum job
PUSHED = 6                             # env-step batches the "collector" pushes before going quiet
QUIET_S = 1.0                          # how long every ring stays empty while updates are counted


def hold_control_block(job: str, settings: dict, ready, done) -> None:
    """The launcher's part: create the job's control segment and hold its liveness lock."""
    ctl = shm.ControlBlock.create(job, 1, settings)
    ready.set()
    done.wait(120)
    ctl.unlink()
    ctl.close()


def push_batches(ring: shm.TransitionRing, n: int) -> None:
    rng = np.random.default_rng(0)
    none = np.zeros(NUM_ENVS, bool)
    for k in range(n):
        assert ring.try_push(TransitionBatch(rng.standard_normal((NUM_ENVS, OBS_DIM)).astype(np.float32), None,
                                             rng.uniform(-1, 1, (NUM_ENVS, ACT_DIM)).astype(np.float32),
                                             -rng.random(NUM_ENVS).astype(np.float32), none, none,
                                             np.empty(0, np.int64), np.empty((0, OBS_DIM), np.float32), None),
                             weight_version=0, env_step=k, incarnation=1)


def updates_while_rings_empty(tmp_path, job: str, utd_mode: str, procs) -> tuple[int, int]:
    """(updates after ingesting every pushed batch, updates made in the QUIET_S that followed)."""
    cfg_path = tiny_config(tmp_path, job, algo={"num_updates": 1, "learning_starts": 2, "batch_size": 16},
                           trainer={"num_iterations": 100_000,   # never reached: the test stops the learner
                                    "async_options": {"utd_mode": utd_mode, "ring_capacity": PUSHED,
                                                      "max_ingest_per_iter": 2}},
                           logging={"interval": 1_000_000, "interval_s": 600.0}, checkpoint={"interval": 0})
    cfg = load_config(cfg_path)
    plan = plan_job(cfg, machine_topology(), str(cfg_path))
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    launcher = procs(hold_control_block, job, job_settings(cfg, plan), ready, done)
    assert ready.wait(60), "the control-block holder did not start"
    observer = shm.ControlBlock.attach(job, role="observer")
    collector = shm.ControlBlock.attach(job, role="collector", collector_id=0)
    collector.collector(0).update(incarnation=1, state=int(shm.ProcState.RUNNING))   # as a collector registers
    # the collector's segments, created as a collector creates them
    spec = shm.RingSpec(num_envs=NUM_ENVS, obs_dim=OBS_DIM, critic_obs_dim=0, act_dim=ACT_DIM, capacity=PUSHED)
    ring = shm.TransitionRing.create(job, 0, spec, observer.incarnation)
    snapshot = shm.WeightSnapshot.create(job, 0, policy_flat_numel(OBS_DIM, ACT_DIM, cfg.algo), observer.incarnation)
    push_batches(ring, PUSHED)

    from fastsac.learner.loop import Learner
    learner = Learner(SimpleNamespace(cfg=cfg, plan=plan, me=plan.learner))
    stop = StopSignal()
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("exit", learner.run(stop)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while observer.learner["env_steps"] < PUSHED * NUM_ENVS:
            assert thread.is_alive() and time.monotonic() < deadline, \
                f"the learner did not ingest the {PUSHED} pushed batches: {observer.learner.as_dict()}"
            time.sleep(0.01)
        # env_steps and num_updates are published together after the updates of an iteration
        before = int(observer.learner["num_updates"])
        time.sleep(QUIET_S)
        after = int(observer.learner["num_updates"])
        assert ring.write_cursor == ring.read_cursor == PUSHED, "the ring was not empty while counting"
    finally:
        stop.request()
        thread.join(60)
        learner.close()
        ring.close()
        snapshot.close()
        collector.close()
        observer.close()
        done.set()
        launcher.join(30)
    assert result.get("exit") == 0, result
    return before, after - before


@pytest.mark.process
def test_strict_makes_no_update_without_new_data(tmp_path, job_name, procs, one_torch_thread):
    before, quiet = updates_while_rings_empty(tmp_path, job_name, "strict", procs)
    assert before > 0, "strict trained on nothing: the test did not reach the update phase"
    assert quiet == 0, f"strict made {quiet} updates while every ring was empty"


@pytest.mark.process
def test_learner_bound_keeps_updating_on_the_buffer_it_has(tmp_path, job_name, procs, one_torch_thread):
    before, quiet = updates_while_rings_empty(tmp_path, job_name, "learner_bound", procs)
    assert before > 0
    assert quiet > 0, "learner_bound stopped updating when the rings ran empty (it behaved like strict)"

