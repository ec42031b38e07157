"""fastsac.launch.status: the read-only `--status` view of a running job's control segment.

Every job name comes from the conftest `job_name` fixture (prefix t<pytest pid>_), whose
teardown unlinks the job's segments whatever the test did.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time

import pytest

from fastsac import shm_layout as L
from fastsac.launch import status


def shm_bytes(job: str) -> bytes:
    with open(os.path.join(L.SHM_DIR, L.ctl_name(job).lstrip("/")), "rb") as f:
        return f.read()


@pytest.fixture
def job(job_name):
    """A live job with 3 collectors, every record filled by its own writer role.

    collector 0: running (this process's pid), collector 1: manual, not started,
    collector 2: launched then restarted once, pid gone (crashed, launcher not yet aware).
    """
    ctl = L.ControlBlock.create(job_name, 3)          # role launcher: ctl.launcher, ctl.supervisor(i)
    lrn = L.ControlBlock.attach(job_name, "learner")  # ctl.learner, ctl.ingest(i)
    c0 = L.ControlBlock.attach(job_name, "collector", 0)
    c2 = L.ControlBlock.attach(job_name, "collector", 2)
    now = time.monotonic_ns()
    ctl.supervisor(0).update(planned_node=0, cpus="0-7,16-23", restarts=0, launched_pid=os.getpid(),
                             state=int(L.SupervisorState.LAUNCHED))
    ctl.supervisor(1).update(planned_node=1, cpus="8-15", state=int(L.SupervisorState.MANUAL))
    ctl.supervisor(2).update(planned_node=1, cpus="24-31", restarts=1, launched_pid=2**22 + 7,
                             state=int(L.SupervisorState.RESTARTING))
    lrn.learner.update(pid=os.getpid(), state=int(L.ProcState.RUNNING), heartbeat_ns=now - 1_500_000_000,
                       env_steps=1_234_567, num_updates=8_910, weight_version=118, updates_per_s=9.5,
                       learn_pct=71.6, started_ns=now, waiting_mask=0b010)  # still waiting for collector 1
    lrn.ingest(0).update(ring_fill=3, policy_lag=2, ingested_slots=40, ingested_env_steps=40 * 16, attached=1)
    lrn.ingest(2).update(attached=1, dropped=1, faults=1, fault="slot 7 is stamped seq 3")
    c0.collector(0).update(pid=os.getpid(), incarnation=1, state=int(L.ProcState.RUNNING),
                           heartbeat_ns=now - 300_000_000, env_steps=50_000, loaded_weight_version=117)
    c2.collector(2).update(pid=2**22 + 7, incarnation=2, state=int(L.ProcState.RUNNING),
                           heartbeat_ns=now - 42_000_000_000, env_steps=777, loaded_weight_version=90,
                           snapshot_stuck_ns=now - 9_000_000_000)
    handles = {"launcher": ctl, "learner": lrn, "c0": c0, "c2": c2}
    yield job_name, handles
    for name in ("learner", "c0", "c2"):
        handles[name].close()
    if handles["launcher"] is not None:
        handles["launcher"].unlink()
        handles["launcher"].close()


def test_status_shows_every_record(job, capsys):
    job_name, h = job
    text = status.render_status(job_name, sample_s=0)
    print(text)
    ctl = h["launcher"]
    assert f"fastsac job {job_name} |" in text
    assert f"incarnation {ctl.incarnation:#018x}" in text and f"launcher pid {os.getpid()}" in text
    assert "3 collector(s)" in text and "stop: no" in text
    learner = next(line for line in text.splitlines() if line.startswith("learner"))
    for want in (f"pid {os.getpid()}", "RUNNING", "env_steps 1,234,567", "updates 8,910", "9.5 upd/s",
                 "learn 72%", "weights v118"):
        assert want in learner, (want, learner)
    assert 1.5 <= float(re.search(r"heartbeat ([\d.]+)s", learner).group(1)) < 10, learner
    rows = {line.split()[0]: line.split() for line in text.splitlines() if re.match(r"^\s+(\d+|all)\s", line)}
    assert set(rows) == {"0", "1", "2", "all"}
    # ID PID STATE NODE CPUS HEARTBEAT RESTARTS SUPERVISOR ENV-STEPS/S LAG RING WEIGHTS
    r0 = rows["0"]
    assert r0[1:5] == [str(os.getpid()), "RUNNING", "0", "0-7,16-23"]
    assert 0.3 <= float(r0[5].rstrip("s")) < 10, r0
    assert r0[6:] == ["0", "LAUNCHED", "attached", "-", "2", "3", "v117"]      # one read: no rate yet
    assert rows["1"][1:] == ["-", "EMPTY", "1", "8-15", "-", "0", "MANUAL", "-", "-", "-", "-", "-"]
    assert "learner  WAITING for collector(s) 1 to attach" in text
    r2 = rows["2"]
    assert r2[1:5] == [str(2**22 + 7), "RUNNING(gone)", "1", "24-31"]  # pid not alive: flagged
    assert 42 <= float(r2[5].rstrip("s")) < 60, r2
    assert r2[6:] == ["1", "RESTARTING", "DROPPED(1)", "-", "-", "-", "v90", "STUCK"]  # nothing ingested yet
    assert rows["all"][1:] == ["1", "-"]                              # total restarts, total rate


def test_env_steps_rate_from_two_reads(job, monkeypatch):
    job_name, h = job
    obs = status.attach(job_name)
    try:
        first = status.take_snapshot(obs)
        h["c0"].collector(0)["env_steps"] = 55_000          # +5,000 env steps
        h["learner"].learner["env_steps"] = 1_244_567       # +10,000 ingested
        h["c2"].collector(2).update(pid=2**22 + 8, env_steps=100)  # restarted between the reads
        second = dataclasses.replace(status.take_snapshot(obs), t_ns=first.t_ns + 500_000_000)  # exactly 0.5 s
    finally:
        obs.close()
    text = status.format_status(second, first)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if re.match(r"^\s+(\d+|all)\s", line)}
    assert rows["0"][9] == "10,000"         # 5,000 steps / 0.5 s
    assert rows["2"][9] == "-"              # other pid: its counter restarted, no rate
    assert rows["1"][9] == "-"              # never started
    assert rows["all"][-1] == "10,000"
    assert "ingest 20,000 env-steps/s" in text
    assert "read twice 0.50s apart" in text
    # live path: render_status reads twice SAMPLE_S apart; a counter moving meanwhile shows a rate
    def moving_sleep(s):
        h["c0"].collector(0)["env_steps"] = h["c0"].collector(0)["env_steps"] + 3_000
        time.sleep(0.1)
    monkeypatch.setattr(status, "_sleep", moving_sleep)
    live = status.render_status(job_name)
    rate = next(line.split()[9] for line in live.splitlines() if re.match(r"^\s+0\s", line))
    assert 0 < int(rate.replace(",", "")) <= 30_000, live


def test_rendering_never_writes_the_segment(job, monkeypatch, capsys):
    job_name, h = job
    h["launcher"].request_stop(L.StopReason.INTERRUPTED)
    before = shm_bytes(job_name)
    text = status.render_status(job_name, sample_s=0.06)
    assert "stop: REQUESTED (INTERRUPTED)" in text
    assert status.main(job_name, watch=False) == 0
    calls = []

    def two_frames(s):
        calls.append(s)
        if len(calls) == 3:
            raise KeyboardInterrupt
    monkeypatch.setattr(status, "_sleep", two_frames)
    assert status.main(job_name, watch=True, interval_s=0.2) == 0   # Ctrl-C: exit 0
    assert calls == [0.2, 0.2, 0.2]                                  # sample, frame 1, frame 2
    out = capsys.readouterr().out
    assert out.count(f"fastsac job {job_name} |") == 1 + 2             # main once + two watch frames
    assert shm_bytes(job_name) == before                                # not a single byte changed


def test_observer_handle_cannot_write(job):
    job_name, _ = job
    obs = status.attach(job_name)
    try:
        assert obs.role == "observer"
        with pytest.raises(L.ShmLayoutError, match="not written by this process"):
            obs.learner["env_steps"] = 1
        with pytest.raises(L.ShmLayoutError):
            obs.request_stop(L.StopReason.FINISHED)
    finally:
        obs.close()


def test_not_running_job(job_name, capsys):
    assert status.main(job_name, watch=False) == 1
    err = capsys.readouterr().err
    assert f"no job {job_name!r} is running" in err
    assert status.main(job_name, watch=True) == 1
    with pytest.raises(status.JobNotRunning):
        status.render_status(job_name)
    # a dead launcher's leftover control segment: not running either (and left untouched)
    ctl = L.ControlBlock.create(job_name, 1)
    ctl.close()                                    # lock released, segment not unlinked
    before = shm_bytes(job_name)
    assert status.main(job_name, watch=False) == 1
    err = capsys.readouterr().err
    assert "is not running" in err and "stale" in err
    assert shm_bytes(job_name) == before


def test_invalid_job_name_is_a_usage_error(capsys):
    assert status.main("no.dots", watch=False) == 2
    assert "cannot name a shared-memory segment" in capsys.readouterr().err


def test_watch_ends_when_the_job_ends(job, monkeypatch, capsys):
    job_name, h = job
    calls = []

    def end_job(s):
        calls.append(s)
        if len(calls) == 2:                        # after the first frame: the launcher exits
            h["launcher"].unlink()
            h["launcher"].close()
            h["launcher"] = None
        if len(calls) > 5:
            raise KeyboardInterrupt                # safety net: never loop forever
    monkeypatch.setattr(status, "_sleep", end_job)
    assert status.main(job_name, watch=True, interval_s=0.1) == 1
    captured = capsys.readouterr()
    assert captured.out.count(f"fastsac job {job_name} |") == 1
    assert "is no longer running" in captured.err


def test_permission_denied_is_explained(job_name, monkeypatch):
    import posix_ipc

    def denied(*a, **k):
        raise posix_ipc.PermissionsError("Permission denied")
    monkeypatch.setattr(L.ControlBlock, "attach", denied)
    with pytest.raises(status.JobNotRunning, match="permission denied.*private to the user that runs it"):
        status.render_status(job_name)


def test_the_update_path_is_shown_when_torch_compile_was_asked_for(job):
    """algo.compile on CUDA: compiling, compiled, or EAGER after a failed compile (issue: a
    fallback must be loud in --status too); a plain eager update adds nothing to the line."""
    job_name, h = job

    def learner_line() -> str:
        return next(line for line in status.render_status(job_name, sample_s=0).splitlines()
                    if line.startswith("learner"))

    assert "update" not in learner_line().replace("updates ", "")
    for path, want in ((L.UpdatePath.COMPILING, "| update compiling"), (L.UpdatePath.COMPILED, "| update compiled"),
                       (L.UpdatePath.FELL_BACK, "| update EAGER: torch.compile failed")):
        h["learner"].learner["update_path"] = int(path)
        assert want in learner_line()
