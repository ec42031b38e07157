"""Fault injection against real async jobs (CPU): kill -9 of each process, hung processes (SIGSTOP),
SIGTERM, double launch, stale segments, an env that produces NaN. docs/operations.md ("Faults") lists what
each fault costs and which test covers it. Test-only hooks live in tests/support/fault_hooks (put on the
job's PYTHONPATH): nan_env.py (an env name for the registry's module:Class form) and sitecustomize.py
(a learner whose first update blocks like torch.compile).

Every test starts `fastsac-launch` itself (Popen, own session) through the `fault_job` fixture, which
at teardown, pass or fail, SIGKILLs the launcher's process group and then every process of the job by
pid (the learner and collectors run in their own sessions): pids come from the job's logs, from the
control segment while it was readable, and from /proc (any process whose command line names this
test's own config file -- the path is unique per test, so nothing else is ever touched). The
`job_name` fixture (conftest.py) then unlinks whatever segments the job left. Each test also runs
under a SIGALRM deadline (TEST_TIMEOUT_S) so a hang fails the test instead of the session.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support.e2e_helpers import job_segments, newest_checkpoint, tiny_config

from fastsac import shm_layout as shm
from fastsac.run_dir.checkpoint import load_checkpoint

TEST_TIMEOUT_S = 60
HOOKS_DIR = Path(__file__).resolve().parents[2] / "support" / "fault_hooks"   # nan_env.py, sitecustomize.py (test-only)
PID_LINE = re.compile(r"^\[(learner|collector(?: \d+)?) pid (\d+)\]", re.M)  # "[collector pid N]" at start-up
# Fast fault handling for every job here; the tests override what they exercise.
FAST = {"trainer": {"async_options": {"restart_backoff_s": 0.1, "stop_timeout_s": 20.0}},
        "logging": {"tensorboard": False}}


# --------------------------------------------------------------------------- processes

def proc_state(pid: int) -> str | None:
    """The /proc state letter (R, S, T, Z ...), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def proc_alive(pid: int) -> bool:
    """Alive and not a zombie (an orphan whose launcher was killed may sit unreaped as a zombie)."""
    return proc_state(pid) not in (None, "Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def wait_until(pred, timeout: float, what: str, job: "Job | None" = None, interval: float = 0.05):
    """Poll pred() until truthy (returned); fail with the job's output on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}"
                                 + (f"\n{job.diagnostics()}" if job else ""))
        time.sleep(interval)


class Job:
    """One test's job: its config plus every launcher started for it (and their children)."""

    def __init__(self, tmp_path: Path, name: str, cfg: Path, env: dict | None = None):
        self.tmp, self.name, self.cfg, self.env = tmp_path, name, cfg, env
        self.run = tmp_path / "run"
        self.launchers: list[subprocess.Popen] = []
        self.known_pids: set[int] = set()
        self._ctl: shm.ControlBlock | None = None

    # ---- launching
    def start(self, *overrides: str) -> subprocess.Popen:
        n = len(self.launchers)
        out, err = self.tmp / f"launch{n}.out", self.tmp / f"launch{n}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(self.cfg), *overrides],
                                    stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=self.env,
                                    start_new_session=True)
        proc.out_path, proc.err_path = out, err
        self.launchers.append(proc)
        return proc

    def cli(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A short fastsac-launch invocation run to completion (a second launch, --cleanup ...)."""
        proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, start_new_session=True)
        return proc

    @staticmethod
    def stdout(proc) -> str:
        return proc.out_path.read_text(errors="replace")

    @staticmethod
    def stderr(proc) -> str:
        return proc.err_path.read_text(errors="replace")

    def wait(self, proc, timeout: float) -> int:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"fastsac-launch did not exit within {timeout:g}s\n{self.diagnostics()}") from None

    def log(self, name: str) -> str:
        try:
            return (self.run / "logs" / name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def diagnostics(self) -> str:
        parts = []
        for i, p in enumerate(self.launchers):
            parts.append(f"--- launcher {i} (pid {p.pid}, rc {p.poll()}) stdout:\n{self.stdout(p)[-3000:]}"
                         f"\n--- stderr:\n{self.stderr(p)[-3000:]}")
        for log in sorted((self.run / "logs").glob("*.log")) if (self.run / "logs").exists() else []:
            parts.append(f"--- {log.name}:\n{log.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    # ---- the control segment (observer: reads only)
    def ctl(self, timeout: float = 20) -> shm.ControlBlock:
        def attach():
            try:
                return shm.ControlBlock.attach(self.name, role="observer")
            except (shm.ShmLayoutError, ValueError, OSError):
                return None
        if self._ctl is None:
            self._ctl = wait_until(attach, timeout, f"job {self.name}'s control segment", self)
        return self._ctl

    def close_ctl(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None

    def wait_running(self, min_env_steps: int = 0, collectors: tuple[int, ...] = (0,), timeout: float = 30):
        """Until the learner and the given collectors are RUNNING and the learner ingested min_env_steps."""
        ctl = self.ctl()

        def ready():
            ok = ctl.learner["state"] == shm.ProcState.RUNNING and ctl.learner["env_steps"] >= min_env_steps \
                and all(ctl.collector(c)["state"] == shm.ProcState.RUNNING for c in collectors)
            if ok:
                self.known_pids.add(int(ctl.learner["pid"]))
                self.known_pids.update(int(ctl.collector(c)["pid"]) for c in collectors)
            return ok
        wait_until(ready, timeout, f"learner + collectors {collectors} running, {min_env_steps} env steps", self)
        return ctl

    # ---- pids
    def log_pids(self) -> dict[str, list[int]]:
        """role -> pids, in start order, from the '[role pid N]' lines of the job's logs."""
        out: dict[str, list[int]] = {}
        logs = self.run / "logs"
        for log in sorted(logs.glob("*.log")) if logs.exists() else []:
            for m in PID_LINE.finditer(log.read_text(errors="replace")):
                pids = out.setdefault(m.group(1), [])
                if int(m.group(2)) not in pids:
                    pids.append(int(m.group(2)))
        return out

    def _ours(self, pid: int) -> bool:
        return str(self.cfg) in cmdline(pid)

    def job_pids(self) -> set[int]:
        """Every live process of this job we can find (launchers excluded)."""
        pids = set(self.known_pids) | {p for ps in self.log_pids().values() for p in ps}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and self._ours(int(entry)):
                pids.add(int(entry))
        pids -= {p.pid for p in self.launchers}
        return {p for p in pids if proc_alive(p) and self._ours(p)}

    def kill_everything(self) -> list[int]:
        """SIGKILL every launcher's process group, then each child by pid; returns those still alive."""
        self.close_ctl()
        for p in self.launchers:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait(10)
        for pid in self.job_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while (left := [p for p in self.job_pids()]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left


@pytest.fixture
def fault_job(tmp_path, job_name):
    """make(**sections) -> Job for this test's job_name; everything it starts dies at teardown."""
    jobs: list[Job] = []

    def make(proc_env: dict | None = None, **sections) -> Job:
        merged = {k: dict(v) for k, v in FAST.items()}
        for key, value in sections.items():
            if key in merged and isinstance(value, dict):
                base = merged[key]
                for k, v in value.items():
                    base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
            else:
                merged[key] = value
        job = Job(tmp_path, job_name, tiny_config(tmp_path, job_name, **merged), proc_env)
        jobs.append(job)
        return job

    def on_alarm(signum, frame):
        raise TimeoutError(f"test exceeded {TEST_TIMEOUT_S}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_TIMEOUT_S)
    try:
        yield make
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        left = [pid for job in jobs for pid in job.kill_everything()]
    assert not left, f"processes of the job survived SIGKILL: {left}"


def assert_loads(path: Path) -> dict:
    payload = load_checkpoint(path)
    assert payload["env"]["obs_dim"] == 3
    return payload


def all_finite(state) -> bool:
    if isinstance(state, torch.Tensor):
        return not state.is_floating_point() or bool(torch.isfinite(state).all())
    if isinstance(state, dict):
        return all(all_finite(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(all_finite(v) for v in state)
    return True


# --------------------------------------------------------------------------- 1. collector killed

@pytest.mark.process
def test_collector_kill9_is_restarted_and_the_job_finishes(fault_job):
    # One collector, a ring of 4 slots: after the kill the learner can ingest at most 4 more
    # batches, so the 60-iteration run cannot finish without the restarted collector.
    job = fault_job(trainer={"num_iterations": 60})
    launcher = job.start()
    ctl = job.wait_running(min_env_steps=6 * 8)
    victim = int(ctl.collector(0)["pid"])
    os.kill(victim, signal.SIGKILL)
    assert job.wait(launcher, 45) == 0, job.diagnostics()
    out = job.stdout(launcher)
    assert "collector 0 exited with code -9" in out and "restarting collector 0 (restart 1/3)" in out, out
    pids = job.log_pids()["collector 0"]
    assert len(pids) == 2 and pids[0] == victim, pids          # a new process ...
    assert "incarnation 2" in job.log("collector0.log")         # ... with a new incarnation
    assert "collector 0: new incarnation 2" in job.log("learner.log")  # whose data the learner took
    assert assert_loads(newest_checkpoint(job.run))["env_steps"] == 60 * 8
    assert job_segments(job.name) == []


@pytest.mark.process
def test_restart_count_resets_after_a_healthy_stretch(fault_job):
    # max_restarts=1 would stop the job at the second crash, unless the collector ran
    # restart_reset_s (1 s here) since its restart: then the count starts afresh.
    job = fault_job(trainer={"num_iterations": 100_000,
                             "async_options": {"max_restarts": 1, "restart_backoff_s": 0.1, "restart_reset_s": 1.0}})
    launcher = job.start()
    ctl = job.wait_running(min_env_steps=8)
    for crash in (1, 2):
        victim = int(ctl.collector(0)["pid"])
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: ctl.collector(0)["pid"] not in (0, victim)
                   and ctl.collector(0)["state"] == shm.ProcState.RUNNING, 30, f"restart {crash}", job)
        time.sleep(1.5)  # a healthy stretch longer than restart_reset_s
    out = job.stdout(launcher)
    assert out.count("restarting collector 0 (restart 1/1)") == 2, out
    assert "restart count reset" in out, out
    os.kill(launcher.pid, signal.SIGTERM)
    assert job.wait(launcher, 30) == 0, job.diagnostics()
    assert job_segments(job.name) == []


@pytest.mark.process
def test_hung_collector_is_killed_and_restarted_while_the_other_keeps_feeding(fault_job):
    # SIGSTOP = a hang (deadlock, stuck env): no exit, only the heartbeat stops.
    job = fault_job(trainer={"num_iterations": 100_000,
                             "async_options": {"num_collectors": 2, "heartbeat_timeout_s": 3.0}})
    launcher = job.start()
    ctl = job.wait_running(min_env_steps=8 * 8, collectors=(0, 1))
    victim = int(ctl.collector(0)["pid"])
    os.kill(victim, signal.SIGSTOP)
    at_stop = int(ctl.learner["env_steps"])
    # Collector 0's ring holds at most 4 slots x 4 envs = 16 env steps; 64 more can only come from ring 1.
    wait_until(lambda: ctl.learner["env_steps"] >= at_stop + 64, 10, "the learner to keep ingesting", job)
    assert proc_state(victim) in ("T", "t"), "collector 0 was killed before the check; raise heartbeat_timeout_s"
    wait_until(lambda: not proc_alive(victim), 10, "the launcher to kill the hung collector", job)
    assert re.search(rf"collector 0 \(pid {victim}\) is hung: no heartbeat for [\d.]+s \(heartbeat_timeout_s=3\); "
                     r"killing it", job.stdout(launcher)), job.stdout(launcher)
    wait_until(lambda: "collector 0: new incarnation 2" in job.log("learner.log"), 30,
               "the restarted collector's data to reach the learner", job)
    assert "restarting collector 0 (restart 1/3)" in job.stdout(launcher)
    os.kill(launcher.pid, signal.SIGTERM)
    assert job.wait(launcher, 30) == 0, job.diagnostics()
    assert job_segments(job.name) == []


@pytest.mark.process
def test_collector_kill9_with_max_restarts_0_stops_the_job(fault_job):
    job = fault_job(trainer={"num_iterations": 100_000, "async_options": {"max_restarts": 0}})
    launcher = job.start()
    ctl = job.wait_running(min_env_steps=8)
    os.kill(int(ctl.collector(0)["pid"]), signal.SIGKILL)
    t0 = time.monotonic()
    assert job.wait(launcher, 30) == 1, job.diagnostics()
    assert time.monotonic() - t0 < 15
    err = job.stderr(launcher)
    log = job.run / "logs" / "collector0.log"
    assert f"error: collector 0 failed 1 time(s) (max_restarts=0); see {log}" in err, err
    assert "restarting" not in job.stdout(launcher)
    assert_loads(newest_checkpoint(job.run))   # the learner still wrote its final checkpoint
    assert job_segments(job.name) == []


# --------------------------------------------------------------------------- 2. learner killed

@pytest.mark.process
def test_learner_kill9_fails_the_job_and_keeps_the_last_checkpoint(fault_job):
    job = fault_job(trainer={"num_iterations": 100_000}, checkpoint={"interval": 2})
    launcher = job.start()
    ctl = job.wait_running(min_env_steps=8)
    learner, collector = int(ctl.learner["pid"]), int(ctl.collector(0)["pid"])
    wait_until(lambda: list((job.run / "checkpoints").glob("ckpt_*.pt")), 20, "a periodic checkpoint", job)
    os.kill(learner, signal.SIGKILL)
    t0 = time.monotonic()
    assert job.wait(launcher, 30) == 1, job.diagnostics()
    assert time.monotonic() - t0 < 15
    err = job.stderr(launcher)
    assert f"the learner failed (exit code -9); see {job.run / 'logs' / 'learner.log'}" in err, err
    assert not proc_alive(collector)
    assert re.search(r"stopping: stop requested by the launcher|the learner \(pid \d+\) is gone",
                     job.log("collector0.log")), job.log("collector0.log")
    payload = assert_loads(newest_checkpoint(job.run))   # atomic writes: the newest one is whole
    assert 0 < payload["env_steps"] < 100_000 * 8
    assert job_segments(job.name) == []


@pytest.mark.process
def test_hung_learner_is_killed_and_fails_the_job(fault_job):
    job = fault_job(trainer={"num_iterations": 100_000, "async_options": {"heartbeat_timeout_s": 3.0}},
                    checkpoint={"interval": 2})
    launcher = job.start()
    ctl = job.wait_running(min_env_steps=8)
    learner = int(ctl.learner["pid"])
    wait_until(lambda: list((job.run / "checkpoints").glob("ckpt_*.pt")), 20, "a periodic checkpoint", job)
    os.kill(learner, signal.SIGSTOP)
    t0 = time.monotonic()
    assert job.wait(launcher, 30) == 1, job.diagnostics()
    assert time.monotonic() - t0 < 3.0 + 10
    assert f"learner (pid {learner}) is hung" in job.stdout(launcher), job.stdout(launcher)
    err = job.stderr(launcher)
    assert ("the learner failed (exit code -9; killed as hung: no heartbeat for over heartbeat_timeout_s=3s); "
            f"see {job.run / 'logs' / 'learner.log'}") in err, err
    assert "restarting" not in job.stdout(launcher)   # no collector restart was spent on it
    assert_loads(newest_checkpoint(job.run))
    assert job_segments(job.name) == []


@pytest.mark.process
def test_learner_compiling_longer_than_the_heartbeat_timeout_is_not_taken_for_hung(fault_job):
    # tests/support/fault_hooks/sitecustomize.py: agent.compiled = True and the first update blocks 4 s,
    # like torch.compile on CUDA; the heartbeat timeout is 2.5 s.
    job = fault_job(proc_env=hooks_env(FASTSAC_TEST_SLOW_COMPILE_S="4"),
                    trainer={"num_iterations": 40, "async_options": {"heartbeat_timeout_s": 2.5}})
    launcher = job.start()
    assert job.wait(launcher, 45) == 0, job.diagnostics()
    learner_log = job.log("learner.log")
    assert "compiling the update (torch.compile)" in learner_log, learner_log
    compiled_s = float(re.search(r"update compiled in ([\d.]+)s", learner_log).group(1))
    assert compiled_s >= 4.0
    assert "hung" not in job.stdout(launcher) and "restarting" not in job.stdout(launcher)
    assert "heartbeat" not in job.log("collector0.log")
    assert assert_loads(newest_checkpoint(job.run))["env_steps"] == 40 * 8
    assert job_segments(job.name) == []


@pytest.mark.process
def test_checkpoint_save_longer_than_the_heartbeat_timeout_is_not_taken_for_hung(fault_job):
    # tests/support/fault_hooks/sitecustomize.py: every save blocks 4 s (a slow disk); the heartbeat
    # timeout is 2.5 s. The periodic save at iteration 20 runs while the job is RUNNING.
    job = fault_job(proc_env=hooks_env(FASTSAC_TEST_SLOW_SAVE_S="4"), checkpoint={"interval": 20},
                    trainer={"num_iterations": 40, "async_options": {"heartbeat_timeout_s": 2.5}})
    launcher = job.start()
    assert job.wait(launcher, 60) == 0, job.diagnostics()
    assert "hung" not in job.stdout(launcher) and "restarting" not in job.stdout(launcher)
    saved = sorted(int(p.stem.split("_")[-1]) for p in job.run.glob("checkpoints/*.pt"))
    assert 20 * 8 in saved and saved[-1] == 40 * 8, saved
    assert job_segments(job.name) == []


# --------------------------------------------------------------------------- 3. launcher killed

@pytest.mark.process
@pytest.mark.parametrize("recovery", ["cleanup", "relaunch"])
def test_launcher_kill9_orphans_exit_and_stale_segments_are_recovered(fault_job, recovery):
    job = fault_job(trainer={"num_iterations": 100_000}, checkpoint={"interval": 4})
    launcher = job.start()
    ctl = job.wait_running(min_env_steps=8)
    learner, collector = int(ctl.learner["pid"]), int(ctl.collector(0)["pid"])
    job.close_ctl()
    if recovery == "cleanup":
        os.kill(collector, signal.SIGSTOP)    # an orphan that cannot notice yet: it stays attached to its ring
    os.killpg(launcher.pid, signal.SIGKILL)   # its group only: the children are in their own sessions
    launcher.wait(10)
    t0 = time.monotonic()
    orphans = [learner] if recovery == "cleanup" else [learner, collector]
    wait_until(lambda: not any(proc_alive(p) for p in orphans), 10, f"the orphans {orphans} to exit", job)
    assert time.monotonic() - t0 < 5
    assert "the launcher is gone" in job.log("learner.log")
    left = job_segments(job.name)
    assert f"fastsac.{job.name}.ctl" in left and len(left) == 3, left   # ctl + ring + weights, stale
    assert {s.name.lstrip("/") for s in shm.find_stale_segments(job.name)} == set(left)
    newest = newest_checkpoint(job.run)   # the learner's final one, written on noticing the loss
    assert re.search(rf"the launcher is gone .*: final checkpoint {re.escape(str(newest))} ", job.log("learner.log"))
    ckpt = assert_loads(newest)
    if recovery == "cleanup":
        proc = job.cli("--cleanup", job.name)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "still attached" in proc.stderr and f"pid {collector}" in proc.stderr, proc.stderr
        assert job_segments(job.name) == left
        proc = job.cli("--cleanup", job.name, "--force")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert sorted(proc.stdout.split()) == sorted(["removed"] * 3 + [f"/{n}" for n in left]), proc.stdout
        assert job_segments(job.name) == []
        os.kill(collector, signal.SIGCONT)
        wait_until(lambda: not proc_alive(collector), 5, "the resumed orphan collector to exit", job)
        assert "the launcher of this job is gone" in job.log("collector0.log")
        assert job_segments(job.name) == []
        return
    assert "the launcher of this job is gone" in job.log("collector0.log")
    # The next launch of the same job removes them and works; it resumes the orphan's final checkpoint.
    iters = ckpt["env_steps"] // 8 + 3
    relaunch = job.start(f"trainer.num_iterations={iters}", "resume=auto")
    assert job.wait(relaunch, 45) == 0, job.diagnostics()
    err = job.stderr(relaunch)
    assert "removing stale segments of an earlier launch" in err and f"/fastsac.{job.name}.ctl" in err, err
    assert "resume: loaded" in job.stdout(relaunch)
    assert assert_loads(newest_checkpoint(job.run))["env_steps"] == iters * 8
    assert job_segments(job.name) == []


# --------------------------------------------------------------------------- 4. SIGTERM

@pytest.mark.process
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: signal.Signals(s).name)
def test_sigterm_to_the_launcher_stops_gracefully_with_a_final_checkpoint(fault_job, sig):
    """Every stop signal docs/operations.md names (SIGINT: a Ctrl-C; SIGHUP: an ssh session that
    drops) is the same graceful stop."""
    job = fault_job(trainer={"num_iterations": 100_000}, checkpoint={"interval": 0})
    launcher = job.start()
    ctl = job.wait_running(min_env_steps=10 * 8)
    children = [int(ctl.learner["pid"]), int(ctl.collector(0)["pid"])]
    os.kill(launcher.pid, sig)
    t0 = time.monotonic()
    assert job.wait(launcher, 30) == 0, job.diagnostics()
    assert time.monotonic() - t0 < 10          # well inside stop_timeout_s: nothing was escalated
    out = job.stdout(launcher)
    assert f"received {signal.Signals(sig).name}" in out and "stopped by signal after the final checkpoint" in out, out
    assert "SIGKILL" not in out and "sending SIGTERM" not in out
    ckpts = sorted((job.run / "checkpoints").glob("ckpt_*.pt"))
    assert len(ckpts) == 1                     # interval 0: the final checkpoint only
    payload = assert_loads(ckpts[0])
    assert 10 * 8 <= payload["env_steps"] < 100_000 * 8
    assert f"final checkpoint {ckpts[0]}" in job.log("learner.log")
    assert not any(proc_alive(p) for p in children)
    assert job_segments(job.name) == []


# --------------------------------------------------------------------------- 5. double launch

@pytest.mark.process
def test_second_launch_of_a_running_job_is_refused_and_harmless(fault_job):
    job = fault_job(trainer={"num_iterations": 100})
    first = job.start()
    job.ctl()  # the first launcher created and locked the control segment
    second = job.cli(str(job.cfg))
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"job {job.name!r} is already running" in second.stderr, second.stderr
    cleanup = job.cli("--cleanup", job.name)    # nothing unlinks a live job's segments either
    assert cleanup.returncode == 2 and "is alive" in cleanup.stderr, cleanup.stdout + cleanup.stderr
    assert first.poll() is None
    assert job.wait(first, 45) == 0, job.diagnostics()
    assert assert_loads(newest_checkpoint(job.run))["env_steps"] == 100 * 8
    assert job_segments(job.name) == []


# --------------------------------------------------------------------------- 7. NaN from the env

def hooks_env(**extra: str) -> dict:
    """The environment for a job whose processes can import tests/support/fault_hooks."""
    path = os.pathsep.join(filter(None, [str(HOOKS_DIR), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


@pytest.mark.process
def test_env_nan_never_reaches_the_ring_and_fails_the_job_after_restarts(fault_job):
    from fastsac.config import ConfigError
    from fastsac.envs.registry import check_env_name
    try:
        check_env_name("nan_env:NaNPendulum")
    except ConfigError:
        pytest.skip("fastsac.envs.registry has no 'module:Class' env names (needed to inject a NaN env)")
    spec = importlib.util.spec_from_file_location("nan_env", HOOKS_DIR / "nan_env.py")
    nan_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nan_env)
    job = fault_job(proc_env=hooks_env(), env={"name": "nan_env:NaNPendulum"},
                    trainer={"num_iterations": 100_000, "async_options": {"max_restarts": 1}})
    launcher = job.start()
    assert job.wait(launcher, 45) == 1, job.diagnostics()
    log = job.run / "logs" / "collector0.log"
    out, err = job.stdout(launcher), job.stderr(launcher)
    assert f"collector 0 exited with code 1 (see {log}); restarting" in out, out
    assert f"error: collector 0 failed 2 time(s) (max_restarts=1); see {log}" in err, err
    reports = re.findall(r"^\[collector 0 pid \d+\] error: env 'nan_env:NaNPendulum' produced NaN/inf .* global env "
                         r"ids \[3, 6\]; that transition was not pushed$", log.read_text(), re.M)
    assert len(reports) == 2, log.read_text()
    # Nothing non-finite got into the replay buffer: the learner trained on it and stayed finite.
    payload = assert_loads(newest_checkpoint(job.run))
    good_batches = nan_env.NAN_AT_STEP - 1
    assert good_batches * 8 <= payload["env_steps"] <= 2 * good_batches * 8
    assert payload["agent"]["num_updates_done"] > 0 and all_finite(payload["agent"])
    assert job_segments(job.name) == []


@pytest.mark.process
def test_a_stop_while_a_collector_builds_its_envs_ends_it_at_once(fault_job):
    # before: the launcher waited for the construction (12.8 s for 8,192 Humanoid envs; here a
    # 60 s build in one blocking call, tests/support/fault_hooks/slow_env.py), then stop_timeout_s
    job = fault_job(proc_env=hooks_env(), env={"name": "slow_env:SlowPendulum", "num_envs": 16},
                    trainer={"num_iterations": 100_000})
    launcher = job.start()
    log = job.run / "logs" / "collector0.log"
    wait_until(lambda: log.exists() and "slow_env: building 16 envs" in log.read_text(), 60,
               "the collector to start building its envs", job)
    t0 = time.monotonic()
    os.kill(launcher.pid, signal.SIGTERM)
    code = job.wait(launcher, 45)
    took = time.monotonic() - t0
    out = job.stdout(launcher)
    assert code == 0, job.diagnostics()
    assert "collector 0 (pid" in out and "is still starting: ending it now" in out, out
    assert took < 15, (took, out)
    assert job_segments(job.name) == []
