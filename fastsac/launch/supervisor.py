"""The launcher's supervision of one async job (torch-free).

Owns the job's control segment for the job's whole life (its lock on that segment is the
job's liveness: children and later launches test it), starts the learner and collectors
as separate processes (each in its own session, so a terminal's Ctrl-C reaches only the
launcher, which then stops the job in order), restarts crashed collectors with backoff,
escalates a stop that takes too long (SIGTERM, then SIGKILL), and always unlinks the
job's segments at the end.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastsac import shm_layout as shm
from fastsac.common.pacing import restart_delay
from fastsac.common.stopping import StopSignal
from fastsac.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from fastsac.evaluation.evaluator_watch import EvaluatorWatch
from fastsac.machine import memory_available
from fastsac.machine.learner_plan import describe_learner
from fastsac.machine.topology import format_cpulist
from fastsac.process.setup import ALLOWED_CPUS_ENV
from fastsac.run_dir.contents import LOGS_DIR

POLL_S = 0.1
RSS_SAMPLE_S = 1.0   # how often a running collector's resident memory is read (for an OOM report)
KILL_GRACE_S = 5.0   # between the escalation's SIGTERM and SIGKILL


def say(message: str) -> None:
    print(f"fastsac-launch: {message}", flush=True)


@dataclass
class Child:
    name: str
    plan: object
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    restart_at: float | None = None
    started_at: float = 0.0     # time.monotonic() of the current incarnation's start
    manual: bool = False
    exit_code: int | None = None
    history: list = field(default_factory=list)
    hung_killed: bool = False   # we SIGKILLed this incarnation for a stale heartbeat
    killed_by_us: bool = False  # we SIGKILLed this incarnation (hung, or dropped by the learner)
    oom_counts: dict = field(default_factory=dict)   # the OOM-kill counters when it was started
    rss: int | None = None      # its resident memory at the last sample
    rss_at: float = 0.0         # time.monotonic() of that sample
    failure: str | None = None  # why it was not restarted, when not the usual "failed N time(s)"
    faults_seen: int = 0        # the learner's drop count of this collector, as last acted on


class Supervisor:
    def __init__(self, cfg, plan, ctl: "shm.ControlBlock"):
        self.cfg, self.plan, self.ctl = cfg, plan, ctl
        self.ao = cfg.trainer.async_options
        self.log_dir = cfg.run_path / LOGS_DIR
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # learner.log for the one-learner job; learner<i>.log when this machine runs several
        self.learners = [Child(p.name, p, self.log_dir / (f"learner{p.learner_index}.log" if p.several
                                                           else "learner.log")) for p in plan.learners]
        self.learner = self.learners[0]
        self.collectors = [Child(f"collector {c.collector_id}", c, self.log_dir / f"collector{c.collector_id}.log",
                                 manual=c.manual) for c in plan.collectors]
        # eval.interval > 0: the evaluator, watched by fastsac.evaluation.evaluator_watch (never stops the job)
        self.eval_children = [Child("evaluator", plan.evaluator, self.log_dir / "evaluator.log")] \
            if plan.evaluator else []
        self.evaluator = EvaluatorWatch(self, self.eval_children[0], say) if self.eval_children else None
        self.stop_signal = StopSignal()
        self.stop_deadline: float | None = None
        self.stop_requested_at: float | None = None
        self.escalated_at: float | None = None
        self._tail_pos: dict[Path, int] = {}

    # ------------------------------------------------------------------ processes
    def spawn(self, child: Child) -> None:
        env = dict(os.environ)
        env.update(child.plan.env_dict)
        env[ALLOWED_CPUS_ENV] = format_cpulist(self.plan.topology.allowed_cpus)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(child.log_path, "ab") as logf:
            logf.write(f"==== fastsac-launch: starting {child.name}: {child.plan.command}\n".encode())
            logf.flush()
            child.proc = subprocess.Popen(child.plan.argv, stdout=logf, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        child.exit_code = None
        child.hung_killed = child.killed_by_us = False
        child.started_at = time.monotonic()
        child.oom_counts, child.rss = memory_available.oom_kill_counts(), None   # the children share our cgroup
        if child.plan.role == "collector":
            self.ctl.supervisor(child.plan.collector_id).update(
                launched_pid=child.proc.pid, launched_ns=time.monotonic_ns(), restarts=child.restarts,
                state=int(shm.SupervisorState.LAUNCHED if child.restarts == 0 else shm.SupervisorState.RESTARTING))

    def running(self) -> list[Child]:
        return [c for c in [*self.learners, *self.collectors, *self.eval_children]
                if c.proc is not None and c.proc.poll() is None]

    def signal_all(self, sig: int) -> None:
        for c in self.running():
            try:
                os.kill(c.proc.pid, sig)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ stop handling
    def request_stop(self, reason: str, code: "shm.StopReason") -> None:
        if self.stop_deadline is None:
            say(f"stopping the job: {reason}")
            self.ctl.request_stop(code)
            self.stop_requested_at = time.monotonic()
            self.stop_deadline = self.stop_requested_at + self.ao.stop_timeout_s
            self.end_starting_collectors()

    def end_starting_collectors(self) -> None:
        """On a stop, a collector that has not started stepping holds nothing (its envs are still
        being built, or it waits for the learner; committed ring slots live in shared memory):
        SIGTERM ends it at once instead of after a construction that may take a minute."""
        for c in self.collectors:
            if c.manual or c.proc is None or c.proc.poll() is not None:
                continue
            rec = self.ctl.collector(c.plan.collector_id)
            if rec["pid"] != c.proc.pid or rec["state"] == shm.ProcState.STARTING:
                say(f"{c.name} (pid {c.proc.pid}) is still starting: ending it now (it holds no data yet)")
                os.kill(c.proc.pid, signal.SIGTERM)

    def escalate(self, why: str) -> None:
        if self.escalated_at is None:
            left = ", ".join(f"{c.name} (pid {c.proc.pid})" for c in self.running()) or "none"
            say(f"{why}: still running: {left}; sending SIGTERM to every process of the job")
            self.escalated_at = time.monotonic()
            self.signal_all(signal.SIGTERM)

    def tail_learner_log(self) -> None:
        """Echo the learners' progress lines on our stdout (a learner only writes its log file,
        so it never depends on the launcher's stdout staying open)."""
        for child in self.learners:
            path = child.log_path
            try:
                with open(path, "rb") as f:
                    f.seek(self._tail_pos.get(path, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            if end:
                sys.stdout.write(data[:end].decode(errors="replace"))
                sys.stdout.flush()
                self._tail_pos[path] = self._tail_pos.get(path, 0) + end

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        self.stop_signal.install()   # stopping.STOP_SIGNALS, the same as the synchronous trainer's
        for child in self.learners:
            with open(child.log_path, "ab") as f:
                self._tail_pos[child.log_path] = f.tell()
            self.spawn(child)
        for c in self.collectors:
            sup = self.ctl.supervisor(c.plan.collector_id)
            sup.update(planned_node=-1 if c.plan.node is None else c.plan.node, cpus=c.plan.cpulist[:63],
                       state=int(shm.SupervisorState.MANUAL if c.manual else shm.SupervisorState.NOT_STARTED))
            if c.manual:
                say(f"{c.name} is left for you to start, by hand: {c.plan.command}")
            else:
                self.spawn(c)
        if self.evaluator:
            self.evaluator.start()
        try:
            return self._supervise()
        finally:
            self.signal_all(signal.SIGTERM)
            deadline = time.monotonic() + KILL_GRACE_S
            while self.running() and time.monotonic() < deadline:
                time.sleep(POLL_S)
            self.signal_all(signal.SIGKILL)
            for c in [*self.learners, *self.collectors, *self.eval_children]:
                if c.proc is not None:
                    c.proc.wait()
            if self.evaluator:
                self.evaluator.close()
            self.tail_learner_log()

    def _supervise(self) -> int:
        result: tuple[int, str] | None = None
        while True:
            time.sleep(POLL_S)
            self.tail_learner_log()
            for sig in self.stop_signal.take():
                if self.stop_deadline is None:
                    self.request_stop(f"received {signal.Signals(sig).name}; waiting for the final checkpoint",
                                      shm.StopReason.INTERRUPTED)
                    result = result or (EXIT_OK, "stopped by signal after the final checkpoint")
                else:
                    self.escalate(f"second {signal.Signals(sig).name}")
            now = time.monotonic()
            for k, lc in enumerate(self.learners):
                rec = self.ctl.learner_record(k)
                if self.stop_deadline is None and rec["state"] == shm.ProcState.RUNNING \
                        and rec["pid"] == lc.proc.pid and lc.proc.poll() is None:
                    # Before the collectors are looked at: the ones that gave up on the hung learner
                    # themselves then exit into a stopping job instead of being restarted.
                    self._kill_if_hung(lc, self.ctl.learner_heartbeat_age_s(index=k))
                result = self._watch_learner(lc, result)
            for c in self.collectors:
                self._watch_collector(c, now)
                if c.exit_code is not None and c.restart_at is None and self.stop_deadline is None \
                        and c.history and c.history[-1] == "failed":
                    result = (EXIT_FAILURE, c.failure or f"{c.name} failed {c.restarts + 1} time(s) (max_restarts="
                                                         f"{self.ao.max_restarts}); see {c.log_path}")
                    self.ctl.supervisor(c.plan.collector_id)["state"] = int(shm.SupervisorState.GAVE_UP)
                    self.request_stop(result[1], shm.StopReason.COLLECTOR_FAILED)
            if self.evaluator:
                self.evaluator.watch(now, stopping=self.stop_deadline is not None)
                if self.stop_requested_at is not None:
                    self.evaluator.stop_overdue(now - self.stop_requested_at)
            if self.stop_deadline is not None:
                if not self.running():
                    code, message = result or (EXIT_OK, "stopped")
                    (say if code == 0 else lambda m: print(f"fastsac-launch: error: {m}", file=sys.stderr))(message)
                    return code
                if now > self.stop_deadline:
                    self.escalate(f"the job did not stop within stop_timeout_s={self.ao.stop_timeout_s:g}s")
                if self.escalated_at is not None and now > self.escalated_at + KILL_GRACE_S:
                    self.signal_all(signal.SIGKILL)

    def _watch_learner(self, lc: Child, result):
        """A learner that exits 0 finished the job (all learners stop together); any other exit
        stops the whole local job, exit 1 (2 for a usage error), naming the learner."""
        rc = lc.proc.poll()
        if rc is None or lc.exit_code is not None:
            return result
        lc.exit_code = rc
        if rc == 0:
            self.request_stop(f"the {lc.name} finished", shm.StopReason.FINISHED)
            return result or (EXIT_OK, "finished")
        code = EXIT_USAGE if rc == EXIT_USAGE else EXIT_FAILURE
        hung = f"; killed as hung: no heartbeat for over heartbeat_timeout_s=" \
               f"{self.ao.heartbeat_timeout_s:g}s" if lc.hung_killed else ""
        if self.plan.world_size > 1:
            who = describe_learner(lc.plan.global_rank, lc.plan.device, lc.plan.node_rank)
            message = f"{who} failed: exit code {rc}{hung}; see {lc.log_path}"
        else:
            message = f"the learner failed (exit code {rc}{hung}); see {lc.log_path}"
        if result is None or result[0] == EXIT_OK:
            result = (code, message)
        self.request_stop(message, shm.StopReason.LEARNER_FAILED)
        return result

    def _kill_if_hung(self, child: Child, age: float | None) -> None:
        """A running process whose heartbeat is older than heartbeat_timeout_s is hung (stopped, deadlocked):
        SIGKILL it, so it is handled like a crash (a collector is restarted, a failed learner stops the job)."""
        if child.hung_killed or age is None or age <= self.ao.heartbeat_timeout_s:
            return
        say(f"{child.name} (pid {child.proc.pid}) is hung: no heartbeat for {age:.1f}s (heartbeat_timeout_s="
            f"{self.ao.heartbeat_timeout_s:g}); killing it (see {child.log_path})")
        child.hung_killed = child.killed_by_us = True
        child.proc.kill()
        try:
            child.proc.wait(KILL_GRACE_S)  # SIGKILL works even on a stopped process; reap it now
        except subprocess.TimeoutExpired:
            pass

    def _kill_if_dropped(self, c: Child) -> None:
        """The learner dropped this collector (its ring held data no correct collector writes):
        kill it, so it is restarted like a crashed one and replaces its ring."""
        ing = self.ctl.ingest(c.plan.collector_id)
        if ing["faults"] <= c.faults_seen or not ing["dropped"]:
            return
        c.faults_seen = ing["faults"]
        if c.manual:
            say(f"{c.name} was dropped by the learner ({ing['fault']}); restart it by hand: {c.plan.command}")
            return
        if self.stop_deadline is None:
            say(f"{c.name} (pid {c.proc.pid}) was dropped by the learner ({ing['fault']}); killing it for a restart "
                f"(see {self.learners[c.plan.learner_index].log_path})")
            c.killed_by_us = True
            c.proc.kill()

    def _sample_rss(self, c: Child, now: float) -> None:
        if now - c.rss_at >= RSS_SAMPLE_S:
            # a process being killed reads as gone (a zombie has no VmRSS): keep the last reading
            c.rss, c.rss_at = memory_available.resident_bytes(c.proc.pid) or c.rss, now

    def _out_of_memory(self, c: Child, rc: int) -> bool:
        """A collector that died by a SIGKILL not ours while an OOM-kill counter rose was killed
        for memory: restarting it would repeat the death, so the job stops (exit 1) saying so."""
        if rc != -signal.SIGKILL or c.killed_by_us:
            return False
        evidence = memory_available.oom_evidence(c.oom_counts, memory_available.oom_kill_counts())
        if evidence is None:
            return False
        rss = f"; {c.rss / 2**30:.2f} GiB resident at the last sample" if c.rss else ""
        c.failure = (f"{c.name} was killed by the kernel's OOM killer ({evidence}{rss}; it stepped "
                     f"{c.plan.env_count} envs): not restarting it into the same death. Lower env.num_envs "
                     f"(now {self.cfg.env.num_envs}) or give the job more memory; see {c.log_path}")
        say(c.failure)
        c.history.append("failed")
        return True

    def restart_pending(self, c: Child, now: float, stopping: bool, what: str | None = None) -> bool:
        """A restart of c is scheduled: start it once its backoff is over (never while the job stops).
        True while one is pending or was just started (nothing else to watch this round)."""
        if c.restart_at is None:
            return False
        if not stopping and now >= c.restart_at:
            c.restart_at = None
            c.restarts += 1
            say(f"restarting {what or c.name} (restart {c.restarts}/{self.ao.max_restarts})")
            self.spawn(c)
        return True

    def _watch_collector(self, c: Child, now: float) -> None:
        if c.manual:
            self._kill_if_dropped(c)
            return
        if self.restart_pending(c, now, stopping=self.stop_deadline is not None):
            return
        if c.proc is None or c.exit_code is not None:
            return
        rc = c.proc.poll()
        if rc is None:
            self._sample_rss(c, now)
            sup = self.ctl.supervisor(c.plan.collector_id)
            rec = self.ctl.collector(c.plan.collector_id)
            if rec["pid"] == c.proc.pid:
                if sup["state"] != shm.SupervisorState.RUNNING:
                    sup["state"] = int(shm.SupervisorState.RUNNING)  # it attached and registered
                if self.stop_deadline is None and rec["state"] == shm.ProcState.RUNNING:
                    self._kill_if_hung(c, self.ctl.heartbeat_ages_s()[c.plan.collector_id])
            self._kill_if_dropped(c)
            return
        c.exit_code = rc
        if self.stop_deadline is not None:
            return
        if self._out_of_memory(c, rc):
            return
        if c.restarts and now - c.started_at >= self.ao.restart_reset_s:
            # It ran healthily for a while: an occasional crash in a days-long job must not use up
            # max_restarts (and the backoff) that were meant for a crash loop.
            say(f"{c.name} ran {now - c.started_at:.0f}s since its last restart: restart count reset")
            c.restarts = 0
        if rc == EXIT_USAGE or c.restarts >= self.ao.max_restarts:
            c.history.append("failed")
            return
        self.ctl.supervisor(c.plan.collector_id)["state"] = int(shm.SupervisorState.RESTARTING)
        backoff = restart_delay(self.ao.restart_backoff_s, c.restarts)
        say(f"{c.name} exited with code {rc} (see {c.log_path}); restarting in {backoff:.1f}s")
        c.history.append("restarting")
        c.restart_at = now + backoff
