"""The launcher's watch over the evaluator (eval.interval > 0), and its `--status` line (torch-free).

Evaluation is never worth a training run: a crashed evaluator (any exit before the stop) is
logged and restarted with the collectors' backoff (restart_backoff_s, doubling) up to
trainer.async_options.max_restarts (counted afresh after restart_reset_s of health); a hung one
(its heartbeat in the evaluator channel older than heartbeat_timeout_s while it reports RUNNING)
is killed and handled the same way. After the last restart the launcher gives up on evaluation
and says so; the job goes on and its exit code does not change. At the end of the job the
evaluator stops on the stop flag like everything else, but it holds no data, so it gets only
STOP_GRACE_S for that (not stop_timeout_s): one that has not exited by then is killed, and
the launcher says so. Its two segments go with the job's (ControlBlock.unlink).
"""
from __future__ import annotations

from fastsac import shm_layout as shm
from fastsac.common.pacing import restart_delay
from fastsac.common.procs import pid_alive
from fastsac.errors import EXIT_USAGE

STOP_GRACE_S = 5.0   # after the stop request: an evaluator still running then is killed


class EvaluatorWatch:
    def __init__(self, sup, child, say):
        self.sup, self.child, self.say = sup, child, say   # the Supervisor, its Child record of the evaluator
        self.ao = sup.ao
        self.channel = None
        self.gave_up = False
        self.killed_on_stop = False

    def start(self) -> None:
        self.sup.spawn(self.child)

    def _heartbeat_age(self) -> float | None:
        """The evaluator's heartbeat age once it runs (None before: starting up is not a hang)."""
        if self.channel is None:
            try:
                self.channel = shm.EvalChannel.attach(self.sup.cfg.job_name, self.sup.ctl.incarnation)
            except shm.ShmLayoutError:
                return None
        st = self.channel.status()
        if st["pid"] != self.child.proc.pid or st["state"] != shm.ProcState.RUNNING:
            return None
        return self.channel.heartbeat_age_s()

    def watch(self, now: float, stopping: bool) -> None:
        c, say = self.child, self.say
        if self.gave_up:
            return
        if self.sup.restart_pending(c, now, stopping, "the evaluator"):
            return
        if c.proc is None or c.exit_code is not None:
            return
        rc = c.proc.poll()
        if rc is None:
            if not stopping:
                self.sup._kill_if_hung(c, self._heartbeat_age())
            return
        c.exit_code = rc
        if stopping:
            return
        if c.restarts and now - c.started_at >= self.ao.restart_reset_s:
            say(f"the evaluator ran {now - c.started_at:.0f}s since its last restart: restart count reset")
            c.restarts = 0
        if rc == EXIT_USAGE or c.restarts >= self.ao.max_restarts:
            self.gave_up = True
            say(f"the evaluator failed {c.restarts + 1} time(s) (max_restarts={self.ao.max_restarts}; see "
                f"{c.log_path}): giving up on evaluation; training goes on")
            return
        backoff = restart_delay(self.ao.restart_backoff_s, c.restarts)
        say(f"the evaluator exited with code {rc} (see {c.log_path}); restarting in {backoff:.1f}s; "
            "training goes on")
        c.restart_at = now + backoff

    def stop_overdue(self, since_stop_s: float) -> None:
        """During a stop: kill an evaluator that is still running STOP_GRACE_S after the request
        (hung, or busy in a long episode); evaluation holds nothing that a stop must keep."""
        c = self.child
        if self.killed_on_stop or since_stop_s < STOP_GRACE_S or c.proc is None or c.proc.poll() is not None:
            return
        self.say(f"the evaluator (pid {c.proc.pid}) did not stop within {STOP_GRACE_S:g}s of the stop request; "
                 "killing it (it holds no training data)")
        self.killed_on_stop = True
        c.proc.kill()

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


def status_line(job: str, incarnation: int, now_ns: int) -> str | None:
    """`--status`'s EVALUATOR line, read from the evaluator's channel (read-only); None without one."""
    try:
        ch = shm.EvalChannel.attach(job, incarnation)
    except shm.ShmLayoutError:
        return None
    try:
        st, got = ch.status(), ch.read_result()
        age = ch.heartbeat_age_s(now_ns)
    finally:
        ch.close()
    try:
        state = shm.ProcState(st["state"]).name
    except ValueError:
        state = f"?{st['state']}"
    if state in ("STARTING", "RUNNING") and not pid_alive(st["pid"]):
        state += "(gone)"
    doing = f"evaluating env step {st['busy_env_steps']:,}" if st["busy_env_steps"] else "idle"
    last = "no result yet"
    if got is not None:
        r = got[1]
        last = (f"last: env step {r['env_steps']:,} (weights v{r['weight_version']}) return mean "
                f"{r['mean_return']:.1f} [{r['min_return']:.1f}, {r['max_return']:.1f}] length mean "
                f"{r['mean_ep_len']:.1f} ({r['episodes']} episodes, {r['seconds']:.1f}s)")
    hb = "-" if age is None else f"{max(0.0, age):.1f}s"
    return (f"EVALUATOR pid {st['pid']} | {state} | heartbeat {hb} | incarnation {st['incarnation']} | {doing} | "
            f"evaluations {st['evaluations']} | {last}")
