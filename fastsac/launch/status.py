"""`fastsac-launch --status JOB [--watch]`: a read-only, top-like view of a running job.

Everything shown comes from the job's control segment /dev/shm/fastsac.<job>.ctl, attached
as role "observer": the handle has no writable record, and this module only ever reads
(a test compares every byte of the segment before and after rendering). Torch-free.

Where the numbers come from (see fastsac.shm_layout, ControlBlock):
  header        job, incarnation, number of collectors
  ctl.launcher  launcher pid, start time (uptime), stop flag and reason
  ctl.learner   pid, state, heartbeat, env_steps, updates, weight_version (every learner
                iteration); updates/s and learn% (refreshed at the learner's log interval);
                the collectors it still waits for
  ctl.collector(i)   pid, state, heartbeat, env_steps, loaded weight version
  ctl.supervisor(i)  planned NUMA node, CPUs, restarts, the launcher's state of the slot
  ctl.ingest(i)      the learner's view: attached / dropped, policy lag, ring fill (slots used),
                     refreshed every 0.5 s
  /fastsac.<job>.eval  the EVALUATOR line (eval.interval > 0): the evaluator's own channel, read
                     as an observer too (fastsac.evaluation.evaluator_watch.status_line)

env-steps/s is estimated here, not copied: each collector's env_steps counter (written every
env step) is read twice, SAMPLE_S apart (in --watch: one redraw interval apart), and the
difference is divided by the time between the reads. A collector restarted between the two
reads (new pid or incarnation: its counter starts again at 0) shows '-'. The learner's line
shows its ingest rate the same way, from the learner's env_steps counter.

Exit codes of main(): 0 shown (watch: until Ctrl-C), 1 the job is not running (never
started, finished, crashed, or it ended while being watched), 2 invalid job name.
"""
from __future__ import annotations

import os
import pwd
import sys
import time
from dataclasses import dataclass

import posix_ipc

from fastsac import shm_layout as shm
from fastsac.common.procs import pid_alive
from fastsac.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from fastsac.evaluation.evaluator_watch import status_line as evaluator_status_line

EXIT_NOT_RUNNING = EXIT_FAILURE   # the job named is not running
SAMPLE_S = 0.5          # seconds between the two counter reads of a one-shot status
MIN_DT_S = 0.05         # two reads closer than this give no rate
_CLEAR = "\x1b[H\x1b[2J"
_sleep = time.sleep     # tests replace it to stop --watch


class JobNotRunning(shm.ShmLayoutError):
    """The job has no live control segment we can read."""


# --------------------------------------------------------------------------- reading

@dataclass(frozen=True)
class CollectorSnap:
    cid: int
    pid: int
    incarnation: int
    state: str
    alive: bool
    heartbeat_age_s: float | None
    env_steps: int
    loaded_weight_version: int
    planned_node: int
    cpus: str
    restarts: int
    sup_state: str
    ring_fill: int
    policy_lag: int
    ingested_slots: int
    feed: str                    # the learner's view: '-' not attached yet, 'attached', 'DROPPED(faults)'
    snapshot_stuck: bool         # the collector cannot load newer weights (its snapshot looks corrupted)


@dataclass(frozen=True)
class Snapshot:
    t_ns: int                    # time.monotonic_ns() of the read
    job: str
    incarnation: int
    num_collectors: int
    launcher_pid: int
    uptime_s: float | None
    stop: bool
    stop_reason: str
    learner: dict                # ctl.learner fields
    learner_state: str
    learner_alive: bool
    learner_heartbeat_age_s: float | None
    collectors: tuple[CollectorSnap, ...]
    evaluator: str | None = None         # the EVALUATOR line (eval.interval > 0), from its own channel
    learners: tuple[dict, ...] = ()      # every local learner's record (learners[0] is `learner`)
    collector_learners: tuple[int, ...] = ()   # the local learner of each collector (job settings)


def _enum_name(enum_cls, value: int) -> str:
    try:
        return enum_cls(value).name
    except ValueError:
        return f"?{value}"


def _age(now_ns: int, then_ns: int) -> float | None:
    return None if not then_ns else max(0.0, (now_ns - then_ns) / 1e9)


def _live_state(state: str, pid: int) -> bool:
    """False when the record says running but its pid is gone (a crash the launcher has not seen yet)."""
    return not (pid > 0 and state in ("STARTING", "RUNNING", "STOPPING") and not pid_alive(pid))


def attach(job: str) -> "shm.ControlBlock":
    """Attach as observer; JobNotRunning (with the reason) when the job cannot be read."""
    try:
        return shm.ControlBlock.attach(job, role="observer")
    except (posix_ipc.PermissionsError, PermissionError):
        path = os.path.join(shm.SHM_DIR, shm.ctl_name(job).lstrip("/"))
        owner = _owner(path)
        raise JobNotRunning(
            f"cannot read {path}: permission denied. A job's segments are private to the user that runs it "
            f"(mode 0600){f', here {owner!r}' if owner else ''}: run the status as that user"
            f"{f', e.g. sudo -u {owner} fastsac-launch --status {job}' if owner else ''}") from None
    except shm.ShmLayoutError as exc:
        if "cannot name a shared-memory segment" in str(exc):
            raise  # an invalid job name: a usage error, not "not running"
        raise JobNotRunning(str(exc)) from None
    except (posix_ipc.Error, OSError) as exc:
        raise JobNotRunning(f"cannot read the control segment of job {job!r}: {exc}") from None


def _owner(path: str) -> str:
    try:
        return pwd.getpwuid(os.stat(path).st_uid).pw_name
    except (OSError, KeyError, ImportError):
        return ""


def take_snapshot(ctl: "shm.ControlBlock") -> Snapshot:
    """One pass of plain reads over the control block (records are not read atomically:
    a field written during the pass shows its old or new value, which is fine for a view)."""
    now = time.monotonic_ns()
    launcher = ctl.launcher.as_dict()
    learner = ctl.learner.as_dict()
    hb = ctl.heartbeat_ages_s(now)
    cols = []
    for i in range(ctl.num_collectors):
        c, sup, ing = ctl.collector(i).as_dict(), ctl.supervisor(i).as_dict(), ctl.ingest(i).as_dict()
        state = _enum_name(shm.ProcState, c["state"])
        pid = c["pid"] or sup["launched_pid"]
        cols.append(CollectorSnap(
            cid=i, pid=pid, incarnation=c["incarnation"], state=state, alive=_live_state(state, c["pid"]),
            heartbeat_age_s=None if hb[i] is None else max(0.0, hb[i]), env_steps=c["env_steps"],
            loaded_weight_version=c["loaded_weight_version"], planned_node=sup["planned_node"], cpus=sup["cpus"],
            restarts=sup["restarts"], sup_state=_enum_name(shm.SupervisorState, sup["state"]),
            ring_fill=ing["ring_fill"], policy_lag=ing["policy_lag"], ingested_slots=ing["ingested_slots"],
            feed=(f"DROPPED({ing['faults']})" if ing["dropped"] else "attached" if ing["attached"] else "-"),
            snapshot_stuck=bool(c["snapshot_stuck_ns"])))
    lstate = _enum_name(shm.ProcState, learner["state"])
    learners = tuple(ctl.learner_record(k).as_dict() for k in range(ctl.num_learners))
    try:
        owners = tuple(ctl.job_settings().get("learner per collector", ()))
    except shm.ShmLayoutError:
        owners = ()
    return Snapshot(
        t_ns=now, job=ctl.job, incarnation=ctl.incarnation, num_collectors=ctl.num_collectors,
        launcher_pid=launcher["launcher_pid"], uptime_s=_age(now, launcher["started_ns"]),
        stop=bool(launcher["stop"]), stop_reason=_enum_name(shm.StopReason, launcher["stop_reason"]),
        learner=learner, learner_state=lstate, learner_alive=_live_state(lstate, learner["pid"]),
        learner_heartbeat_age_s=_age(now, learner["heartbeat_ns"]), collectors=tuple(cols),
        evaluator=evaluator_status_line(ctl.job, ctl.incarnation, now), learners=learners,
        collector_learners=owners)


# --------------------------------------------------------------------------- formatting

def _rate(cur: int, prev: int, dt_s: float | None) -> float | None:
    if dt_s is None or dt_s < MIN_DT_S or cur < prev:
        return None
    return (cur - prev) / dt_s


def collector_rates(cur: Snapshot, prev: Snapshot | None) -> list[float | None]:
    """env-steps/s per collector from two reads of its env_steps counter (None: unknown)."""
    if prev is None or prev.incarnation != cur.incarnation:
        return [None] * len(cur.collectors)
    dt = (cur.t_ns - prev.t_ns) / 1e9
    out = []
    for c, p in zip(cur.collectors, prev.collectors):
        same = c.pid == p.pid and c.incarnation == p.incarnation and c.pid > 0
        out.append(_rate(c.env_steps, p.env_steps, dt) if same else None)
    return out


def _fmt_age(age: float | None) -> str:
    if age is None:
        return "-"
    return f"{age:.1f}s" if age < 100 else f"{age:.0f}s"


def _fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d " if d else "") + f"{h}:{m:02d}:{s:02d}"


def _fmt_num(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def _state(state: str, alive: bool) -> str:
    return state if alive else f"{state}(gone)"


def format_status(cur: Snapshot, prev: Snapshot | None = None) -> str:
    """The status text of one snapshot; rates need the previous snapshot of the same job."""
    lr = cur.learner
    dt = None if prev is None else (cur.t_ns - prev.t_ns) / 1e9
    same_job = prev is not None and prev.incarnation == cur.incarnation
    rates = collector_rates(cur, prev)
    lrate = (_rate(lr["env_steps"], prev.learner["env_steps"], dt)
             if same_job and lr["pid"] == prev.learner["pid"] else None)
    lines = [
        f"fastsac job {cur.job} | incarnation {cur.incarnation:#018x} | launcher pid {cur.launcher_pid} | "
        f"up {_fmt_duration(cur.uptime_s)} | {cur.num_collectors} collector(s) | {time.strftime('%H:%M:%S')}",
        f"stop: {'REQUESTED (' + cur.stop_reason + ')' if cur.stop else 'no'}",
    ]
    if len(cur.learners) > 1:
        lines += _learner_lines(cur, prev, dt)
    elif lr["pid"]:
        lines.append(
            f"learner  pid {lr['pid']} | {_state(cur.learner_state, cur.learner_alive)} | "
            f"heartbeat {_fmt_age(cur.learner_heartbeat_age_s)} | env_steps {lr['env_steps']:,} | "
            f"updates {lr['num_updates']:,} | {_fmt_num(lr['updates_per_s'], ',.1f')} upd/s | "
            f"learn {_fmt_num(lr['learn_pct'], '.0f')}% | weights v{lr['weight_version']} | "
            f"ingest {_fmt_num(lrate)} env-steps/s{_update_path(lr)}")
    else:
        lines.append(f"learner  not started yet ({cur.learner_state})")
    waiting = [i for i in range(cur.num_collectors) if int(lr.get("waiting_mask", 0)) >> i & 1]
    if waiting:
        lines.append(f"learner  WAITING for collector(s) {', '.join(map(str, waiting))} to attach: no env step "
                     "counts until every planned collector has (fastsac-launch CONFIG --plan prints the commands)")
    if cur.evaluator:
        lines.append(cur.evaluator)
    rows = [("ID", "PID", "STATE", "NODE", "CPUS", "HEARTBEAT", "RESTARTS", "SUPERVISOR", "LEARNER", "ENV-STEPS/S",
             "LAG", "RING", "WEIGHTS")]
    for c, r in zip(cur.collectors, rates):
        started = c.pid > 0
        rows.append((str(c.cid), str(c.pid) if started else "-", _state(c.state, c.alive),
                     "-" if c.planned_node < 0 else str(c.planned_node), c.cpus or "-",
                     _fmt_age(c.heartbeat_age_s), str(c.restarts), c.sup_state, c.feed, _fmt_num(r),
                     str(c.policy_lag) if c.ingested_slots else "-", str(c.ring_fill) if c.ingested_slots else "-",
                     (f"v{c.loaded_weight_version}" if c.loaded_weight_version else "-")
                     + (" STUCK" if c.snapshot_stuck else "")))
    known = [r for r in rates if r is not None]
    rows.append(("all", "", "", "", "", "", str(sum(c.restarts for c in cur.collectors)), "", "",
                 _fmt_num(sum(known)) if known else "-", "", "", ""))
    right = {0, 1, 6, 9, 10, 11}
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines.append("")
    for row in rows:
        cells = [cell.rjust(w) if k in right else cell.ljust(w) for k, (cell, w) in enumerate(zip(row, widths))]
        lines.append(" " + "  ".join(cells).rstrip())
    lines.append("")
    how = (f"read twice {dt:.2f}s apart" if dt is not None and dt >= MIN_DT_S
           else "needs two reads >= 0.05s apart")
    lines.append(f"ENV-STEPS/S: each collector's env_steps counter {how} (learner ingest: its env_steps counter, "
                 "same reads).")
    lines.append("LEARNER, LAG (policy lag, weight versions), RING (slots used): refreshed by the learner every "
                 "0.5 s; upd/s and learn%: as of its last log line. DROPPED: the learner refused the collector's "
                 "data (see learner.log); STUCK: the collector cannot load newer weights.")
    return "\n".join(lines)


def _update_path(lr: dict) -> str:
    """' | update compiled' and the like; nothing for a plain eager update (torch.compile not asked for)."""
    path = int(lr.get("update_path", 0))
    if path == shm.UpdatePath.EAGER:
        return ""
    if path == shm.UpdatePath.FELL_BACK:
        return " | update EAGER: torch.compile failed (the learner's log says why)"
    return f" | update {_enum_name(shm.UpdatePath, path).lower()}"


def _learner_lines(cur: Snapshot, prev: Snapshot | None, dt: float | None) -> list[str]:
    """Several learners on this machine: one line each (rank, device, state, progress) with its collectors."""
    same_job = prev is not None and prev.incarnation == cur.incarnation and len(prev.learners) == len(cur.learners)
    lines = []
    for k, lr in enumerate(cur.learners):
        mine = [str(i) for i, owner in enumerate(cur.collector_learners) if owner == k]
        state = _enum_name(shm.ProcState, lr["state"])
        head = f"learner {k} rank {lr['global_rank']} {lr['device'] or '-'}"
        if not lr["pid"]:
            lines.append(f"{head} | not started yet ({state}) | collectors {', '.join(mine) or '-'}")
            continue
        p = prev.learners[k] if same_job else None
        rate = _rate(lr["env_steps"], p["env_steps"], dt) if p is not None and p["pid"] == lr["pid"] else None
        lines.append(
            f"{head} | pid {lr['pid']} | {_state(state, _live_state(state, lr['pid']))} | "
            f"heartbeat {_fmt_age(_age(cur.t_ns, lr['heartbeat_ns']))} | env_steps {lr['env_steps']:,} | "
            f"updates {lr['num_updates']:,} | {_fmt_num(lr['updates_per_s'], ',.1f')} upd/s | "
            f"learn {_fmt_num(lr['learn_pct'], '.0f')}% | weights v{lr['weight_version']} | "
            f"ingest {_fmt_num(rate)} env-steps/s | collectors {', '.join(mine) or '-'}{_update_path(lr)}")
    return lines


def render_status(job: str, sample_s: float = SAMPLE_S) -> str:
    """The status of a running job as text (attach, read, wait sample_s, read again, detach).

    Raises JobNotRunning when the job is not running, ShmLayoutError for an invalid name.
    """
    ctl = attach(job)
    try:
        if sample_s <= 0:
            return format_status(take_snapshot(ctl))
        first = take_snapshot(ctl)
        _sleep(sample_s)
        return format_status(take_snapshot(ctl), first)
    finally:
        ctl.close()


# --------------------------------------------------------------------------- CLI

def _error(message: str) -> None:
    print(f"fastsac-launch: {message}", file=sys.stderr, flush=True)


def main(job: str, watch: bool, interval_s: float = 2.0) -> int:
    """Print the status of `job` once, or with watch redraw it every interval_s until Ctrl-C."""
    try:
        shm.validate_job_name(job)
    except shm.ShmLayoutError as exc:
        _error(f"--status: {exc}")
        return EXIT_USAGE
    if not watch:
        try:
            print(render_status(job), flush=True)
            return EXIT_OK
        except JobNotRunning as exc:
            _error(str(exc))
            return EXIT_NOT_RUNNING
        except KeyboardInterrupt:
            return 130
    interval_s = max(0.1, float(interval_s))
    tty = sys.stdout.isatty()
    try:
        ctl = attach(job)
    except JobNotRunning as exc:
        _error(str(exc))
        return EXIT_NOT_RUNNING
    try:
        prev = take_snapshot(ctl)
        _sleep(min(SAMPLE_S, interval_s))
        while True:
            if not ctl.still_current():
                _error(f"job {job!r} is no longer running (its launcher exited or the job was relaunched)")
                return EXIT_NOT_RUNNING
            cur = take_snapshot(ctl)
            text = format_status(cur, prev)
            sys.stdout.write((_CLEAR if tty else "\n") + text + "\n"
                             + ("(Ctrl-C to quit)\n" if tty else ""))
            sys.stdout.flush()
            prev = cur
            _sleep(interval_s)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        ctl.close()
