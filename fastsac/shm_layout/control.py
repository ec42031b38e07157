"""The per-job control block: process states, heartbeats, counters, collector stats, the
launcher's supervision and the job's settings, one record per writer (each on its own lines)."""
from __future__ import annotations

import enum
import json
import os
import secrets
import time
import zlib
from typing import Iterable

import numpy as np

from fastsac.shm_layout.cleanup import _ctl_launcher_pid, _scan, unlink_job_segments
from fastsac.shm_layout.common import (
    CACHE_LINE, MAGIC, MAX_COLLECTORS, MAX_LEARNERS, PAGE, SegmentKind, ShmLayoutError, _align, _check_collector_id, _digest,
    check_memory_order, ctl_name, validate_job_name,
)
from fastsac.shm_layout.launch_guard import _hold_launch_guard
from fastsac.shm_layout.locks import CTL_LAUNCHER, CTL_LAUNCHER_LOCK, CTL_LAUNCHER_PID, job_is_alive, read_pid
from fastsac.shm_layout.segment import (
    SegmentInfo, _incarnation_of, _remove_hint, _Segment, _SegmentHandle, _unlink_quiet,
)

# The enums' values are stored in the control block and read by other processes (and --status):
# renumbering a member, or giving a new one an old member's value, changes the layout (bump
# LAYOUT_VERSION).


class ProcState(enum.IntEnum):
    """pid state of the learner / a collector (written by that process)."""
    EMPTY = 0
    STARTING = 1
    RUNNING = 2
    STOPPING = 3
    FINISHED = 4
    FAILED = 5
    EXITED = 6


class UpdatePath(enum.IntEnum):
    """Which update a learner runs (written by the learner; --status shows all but EAGER)."""
    EAGER = 0        # torch.compile not asked for (algo.compile), or not on CUDA
    COMPILING = 1    # the first updates run, compiling
    COMPILED = 2
    FELL_BACK = 3    # compiling failed: eager from then on (the learner's log says why)


class SupervisorState(enum.IntEnum):
    """The launcher's view of a collector slot (written by the launcher)."""
    NOT_STARTED = 0
    LAUNCHED = 1
    RUNNING = 2
    RESTARTING = 3
    MANUAL = 4      # left for a person to start (manual_collectors)
    GAVE_UP = 5     # max_restarts exhausted


class StopReason(enum.IntEnum):
    NONE = 0
    FINISHED = 1            # learner reached num_iterations
    INTERRUPTED = 2         # SIGINT / SIGTERM to the launcher
    LEARNER_FAILED = 3
    COLLECTOR_FAILED = 4


def _record(fields: list[tuple[str, str]], itemsize: int) -> np.dtype:
    """Packed record of 8-byte (or text) fields padded to itemsize (a multiple of 64)."""
    names, formats, offsets, off = [], [], [], 0
    for name, fmt in fields:
        dt = np.dtype(fmt)
        names.append(name), formats.append(dt), offsets.append(off)
        off += dt.itemsize
    assert off <= itemsize and itemsize % CACHE_LINE == 0, (fields, off, itemsize)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})


# writer: launcher
LAUNCHER_DTYPE = _record([
    ("stop", "<i8"),               # 1 = everyone stop now (collectors, learner poll it)
    ("stop_reason", "<i8"),        # StopReason
    ("launcher_pid", "<i8"),
    ("started_ns", "<i8"),         # time.monotonic_ns() at creation
], 64)

# writer: learner i (one record per local learner; 192 bytes = 3 lines, never shared)
LEARNER_DTYPE = _record([
    ("pid", "<i8"),
    ("state", "<i8"),              # ProcState
    ("heartbeat_ns", "<i8"),       # time.monotonic_ns(); CLOCK_MONOTONIC is system-wide
    ("env_steps", "<i8"),          # env-steps ingested into the replay buffer (all collectors)
    ("num_updates", "<i8"),
    ("weight_version", "<i8"),     # last version published to the snapshots
    ("updates_per_s", "<f8"),
    ("learn_pct", "<f8"),          # % of learner wall time spent in updates
    ("env_steps_per_s", "<f8"),    # env steps produced per second by all collectors (last log window)
    ("started_ns", "<i8"),
    ("ingest_env_steps_per_s", "<f8"),  # env steps ingested per second (last log window)
    ("waiting_mask", "<u8"),       # bit i: planned collector i has not attached yet (learner holds)
    ("start_env_steps", "<i8"),    # env steps at start (a resumed run: the checkpoint's); set before RUNNING
    ("global_rank", "<i8"),        # its rank in the job's learner group (0 with one learner)
    ("device", "S16"),             # its device, e.g. 'cuda:1' (text, for --status)
    ("update_path", "<i8"),        # UpdatePath
], 192)

# Collector stats: cumulative; published under the record's stats_seq (see write_collector_stats).
# The collector loop's stages, in loop order; each has a cumulative "<stage>_ns" stats field and
# a metric perf/collector_<stage>_ms. "sync" is the weight sync (poll the snapshot, load newer
# weights), nothing to do with the synchronous trainer (fastsac.sync); the name is kept because
# the stats field and the metric carry it.
STAGES = ("sample_actions", "env_step", "push", "sync", "wait")
STATS_FIELDS: tuple[tuple[str, str], ...] = (
    ("episodes", "<i8"),           # episodes finished
    ("return_sum", "<f8"),         # sum of their returns
    ("length_sum", "<i8"),         # sum of their lengths
    *((f"{stage}_ns", "<i8") for stage in STAGES),   # stage timing sums (ns)
    ("steps", "<i8"),              # env-step batches the timings cover
)
STATS_DTYPE = np.dtype(list(STATS_FIELDS))

# writer: collector i (one record per collector; 192 bytes = 3 lines, never shared)
COLLECTOR_DTYPE = _record([
    ("pid", "<i8"),
    ("incarnation", "<i8"),        # collector restart counter (also stamped into its slots)
    ("state", "<i8"),              # ProcState
    ("heartbeat_ns", "<i8"),       # time.monotonic_ns()
    ("env_steps", "<i8"),          # env-steps pushed (env-step batches x its num_envs)
    ("loaded_weight_version", "<i8"),
    ("started_ns", "<i8"),
    ("snapshot_stuck_ns", "<i8"),  # monotonic ns since its snapshot has been unreadable while newer
                                   # weights exist (0 = fine); see Collector._poll_weights
    ("stats_seq", "<i8"),          # tiny seqlock over the stats below (offset 64: own line)
    *STATS_FIELDS,
], 192)
_STATS_OFFSET = COLLECTOR_DTYPE.fields["episodes"][1]

# writer: the learner collector i belongs to (its view of collector i)
INGEST_DTYPE = _record([
    ("ring_fill", "<i8"),          # slots used in ring i at the last status refresh
    ("policy_lag", "<i8"),         # max over the window of (snapshot version - version of an ingested slot)
    ("ingested_slots", "<i8"),
    ("ingested_env_steps", "<i8"),
    ("last_ingest_ns", "<i8"),     # time.monotonic_ns() of the last ingested slot
    ("attached", "<i8"),           # 1 once the learner attached this collector's ring and snapshot
    ("dropped", "<i8"),            # 1 while the learner refuses this collector's data (see faults)
    ("dropped_incarnation", "<i8"),  # collector incarnation the learner dropped; a newer one is re-attached
    ("faults", "<i8"),             # times the learner dropped this collector
    ("rejected_slots", "<i8"),     # slots never ingested: failed validation (non-finite, bad stamps)
    ("snapshot_repairs", "<i8"),   # publishes that found the snapshot's seq not as this writer left it
    ("fault", "S40"),              # short reason of the last drop
], 128)

# writer: launcher, once, before the control block's magic (read-only afterwards)
JOB_DTYPE = _record([
    ("settings_digest", "<u8"),    # crc32 of `settings`
    ("settings", "S2040"),         # JSON of the settings every process of the job must agree on
], 2048)

# writer: launcher (its supervision of collector i)
SUPERVISOR_DTYPE = _record([
    ("planned_node", "<i8"),       # NUMA node planned for the collector (-1 = unbound)
    ("restarts", "<i8"),
    ("state", "<i8"),              # SupervisorState
    ("launched_pid", "<i8"),
    ("launched_ns", "<i8"),
    ("cpus", "S64"),               # cpu list as short text, e.g. '0-7,16-23'
], 128)

# CTL_LAUNCHER (right after the header) and the launcher's lock byte are in locks.py: the
# staleness scan reads the launcher's pid without this module.
assert CTL_LAUNCHER + LAUNCHER_DTYPE.fields["launcher_pid"][1] == CTL_LAUNCHER_PID
CTL_LEARNER = CTL_LAUNCHER + LAUNCHER_DTYPE.itemsize
CTL_COLLECTORS = CTL_LEARNER + MAX_LEARNERS * LEARNER_DTYPE.itemsize
CTL_INGEST = CTL_COLLECTORS + MAX_COLLECTORS * COLLECTOR_DTYPE.itemsize
CTL_SUPERVISOR = CTL_INGEST + MAX_COLLECTORS * INGEST_DTYPE.itemsize
CTL_JOB = CTL_SUPERVISOR + MAX_COLLECTORS * SUPERVISOR_DTYPE.itemsize
CTL_NBYTES = _align(CTL_JOB + JOB_DTYPE.itemsize, PAGE)

_CTL_ROLES = ("launcher", "learner", "collector", "observer")


def _ctl_info(job: str, num_collectors: int, num_learners: int) -> SegmentInfo:
    table = tuple((off, dt.descr) for off, dt in (
        (CTL_LAUNCHER, LAUNCHER_DTYPE), (CTL_LEARNER, LEARNER_DTYPE), (CTL_COLLECTORS, COLLECTOR_DTYPE),
        (CTL_INGEST, INGEST_DTYPE), (CTL_SUPERVISOR, SUPERVISOR_DTYPE), (CTL_JOB, JOB_DTYPE)))
    return SegmentInfo(SegmentKind.CTL, validate_job_name(job), -1,
                       {"num_collectors": num_collectors, "max_collectors": MAX_COLLECTORS,
                        "num_learners": num_learners}, "float32",
                       CTL_NBYTES, _digest(table))


class Record:
    """Typed access to one record: rec['heartbeat_ns'] -> int/float/str; writes checked by role.

    Field views are built once; a get/set is a dict lookup plus a scalar numpy access.
    """
    __slots__ = ("_views", "_writable", "_what")

    def __init__(self, arr0: np.ndarray, writable: bool, what: str, hidden: Iterable[str] = ()):
        skip = set(hidden)
        self._views = {n: arr0[n] for n in arr0.dtype.names if not n.startswith("_") and n not in skip}
        self._writable, self._what = writable, what

    def __getitem__(self, name: str):
        v = self._views[name][()]
        return v.decode(errors="replace") if isinstance(v, bytes) else v.item()

    def __setitem__(self, name: str, value) -> None:
        if not self._writable:
            raise ShmLayoutError(f"{self._what} is not written by this process (its single writer owns it)")
        if name not in self._views:
            raise KeyError(f"{self._what} has no field {name!r}; fields: {', '.join(self._views)}")
        self._views[name][()] = value.encode() if isinstance(value, str) else value

    def update(self, **values) -> None:
        for k, v in values.items():
            self[k] = v

    def keys(self) -> list[str]:
        return list(self._views)

    def as_dict(self) -> dict:
        return {k: self[k] for k in self._views}


class ControlBlock(_SegmentHandle):
    """Per-job control block. Created by the launcher, which holds its liveness lock.

    Roles decide what a handle may write (exactly one writer per field):
      launcher: ctl.launcher, ctl.supervisor(i)
      learner (learner_index=L, ingest_ids=its collectors): ctl.learner_record(L), ctl.ingest(i) of
                its collectors (all collectors when ingest_ids is None: the one-learner job)
      collector (collector_id=i): ctl.collector(i), write_collector_stats(i, ...)
      observer: nothing (monitoring tools, tests)
    `ctl.learner` is the record of the handle's learner_index (a collector: the learner it belongs
    to; launcher and observer: learner 0); `ctl.learner_record(L)` reads any learner's.
    """

    def __init__(self, seg: _Segment, role: str, collector_id: int | None, learner_index: int = 0,
                 ingest_ids: Iterable[int] | None = None):
        self._seg, self.role, self.collector_id = seg, role, collector_id
        self.learner_index = learner_index
        self._launch_guard: int | None = None   # the creating launcher's lock fd, see _hold_launch_guard
        self.job = seg.header_value("job")
        self.incarnation = int(seg.header["incarnation"])
        self.num_collectors = int(seg.header["params"][0])
        self.num_learners = int(seg.header["params"][2])
        if not 0 <= learner_index < self.num_learners:
            raise ShmLayoutError(f"learner {learner_index} does not exist in job {self.job!r} "
                                 f"(0..{self.num_learners - 1})")
        owned = set(range(self.num_collectors) if ingest_ids is None else ingest_ids)
        u8 = seg.u8

        def arr(off, dt, n=None):
            a = u8[off:off + dt.itemsize * (n or 1)].view(dt)
            return a if n else a.reshape(())

        def row(a, i):  # a 0-d array view (a[i] would be an np.void whose fields read as copies)
            return a[i:i + 1].reshape(())

        self._launcher = arr(CTL_LAUNCHER, LAUNCHER_DTYPE)
        self._learners = arr(CTL_LEARNER, LEARNER_DTYPE, MAX_LEARNERS)
        self._collectors = arr(CTL_COLLECTORS, COLLECTOR_DTYPE, MAX_COLLECTORS)
        self._ingest = arr(CTL_INGEST, INGEST_DTYPE, MAX_COLLECTORS)
        self._supervisor = arr(CTL_SUPERVISOR, SUPERVISOR_DTYPE, MAX_COLLECTORS)
        self.launcher = Record(self._launcher, role == "launcher", "ctl.launcher (writer: launcher)")
        self._lrn_rec = [Record(row(self._learners, i), role == "learner" and learner_index == i,
                                f"ctl.learner_record({i}) (writer: learner {i})") for i in range(self.num_learners)]
        self.learner = self._lrn_rec[learner_index]
        stat_names = [n for n, _ in STATS_FIELDS] + ["stats_seq"]
        self._col_rec = [Record(row(self._collectors, i), role == "collector" and collector_id == i,
                                f"ctl.collector({i}) (writer: collector {i})", hidden=stat_names)
                         for i in range(self.num_collectors)]
        self._ing_rec = [Record(row(self._ingest, i), role == "learner" and i in owned,
                                f"ctl.ingest({i}) (writer: its learner)")
                         for i in range(self.num_collectors)]
        self._sup_rec = [Record(row(self._supervisor, i), role == "launcher", f"ctl.supervisor({i}) (writer: launcher)")
                         for i in range(self.num_collectors)]
        # stats seqlock: int64 seq + a raw byte view of the stats for single-call copies
        self._stats_seq = [u8[CTL_COLLECTORS + i * COLLECTOR_DTYPE.itemsize + _STATS_OFFSET - 8:][:8].view(np.int64)
                           for i in range(self.num_collectors)]
        self._stats = [u8[CTL_COLLECTORS + i * COLLECTOR_DTYPE.itemsize + _STATS_OFFSET:][:STATS_DTYPE.itemsize]
                       .view(STATS_DTYPE).reshape(()) for i in range(self.num_collectors)]

    # ---- lifecycle

    @classmethod
    def create(cls, job: str, num_collectors: int, settings: dict | None = None,
               num_learners: int = 1) -> "ControlBlock":
        """Launcher only: new job incarnation; holds the liveness lock until close/exit.

        `settings` (JSON-able) are what every process attaching to the job must agree on
        (see fastsac.shm_layout.job_settings); they are written before the segment's magic, so no
        process can attach before they are in place. Refused while another launcher of this
        job is alive; stale segments of the job (a dead earlier launch) are removed first and
        listed in .removed_stale.
        """
        text = json.dumps(settings or {}, sort_keys=True).encode()
        if len(text) > JOB_DTYPE["settings"].itemsize:
            raise ShmLayoutError(f"job settings are {len(text)} bytes as JSON; the control block holds at most "
                                 f"{JOB_DTYPE['settings'].itemsize}")

        def write_settings(seg: _Segment) -> None:
            rec = seg.u8[CTL_JOB:CTL_JOB + JOB_DTYPE.itemsize].view(JOB_DTYPE).reshape(())
            rec["settings"] = text
            rec["settings_digest"] = np.uint64(zlib.crc32(text))

        check_memory_order()
        if isinstance(num_collectors, bool) or not isinstance(num_collectors, (int, np.integer)) \
                or not 1 <= num_collectors <= MAX_COLLECTORS:
            raise ShmLayoutError(f"num_collectors {num_collectors!r} is not valid; expected 1..{MAX_COLLECTORS}")
        if isinstance(num_learners, bool) or not isinstance(num_learners, (int, np.integer)) \
                or not 1 <= num_learners <= MAX_LEARNERS:
            raise ShmLayoutError(f"num_learners {num_learners!r} is not valid; expected 1..{MAX_LEARNERS}")
        info = _ctl_info(job, int(num_collectors), int(num_learners))
        guard = _hold_launch_guard(job)
        try:
            if job_is_alive(job):
                raise ShmLayoutError(f"job {job!r} is already running (launcher pid {_ctl_launcher_pid(job)} holds "
                                     f"{info.name}); pick another job_name or stop it first")
            removed = unlink_job_segments(job, force=True)
            seg = _Segment.create(info, secrets.randbits(64), lock_byte=CTL_LAUNCHER_LOCK, init=write_settings)
        except BaseException:
            os.close(guard)
            raise
        ctl = cls(seg, "launcher", None)
        ctl._launch_guard = guard
        ctl.removed_stale = removed
        ctl.launcher.update(launcher_pid=os.getpid(), started_ns=time.monotonic_ns())
        return ctl

    @classmethod
    def attach(cls, job: str, role: str = "observer", collector_id: int | None = None,
               num_collectors: int | None = None, learner_index: int = 0,
               ingest_ids: Iterable[int] | None = None, num_learners: int | None = None) -> "ControlBlock":
        """Attach to a running job; num_collectors / num_learners (from the config), when given, must match.

        learner_index: a learner's own index, a collector's learner (which `ctl.learner` reads);
        ingest_ids: the collectors whose ingest records a learner writes (None = all)."""
        check_memory_order()
        validate_job_name(job)
        if role not in _CTL_ROLES or role == "launcher":
            raise ShmLayoutError(f"control block role {role!r} is not valid for attach; expected one of "
                                 "'learner', 'collector', 'observer' (the launcher creates it)")
        name = ctl_name(job)
        seg = _Segment.open_existing(name, f"no job {job!r} is running: segment {name} does not exist")
        try:
            ready = int(seg.header["magic"]) == MAGIC
            n = int(seg.header["params"][0]) if ready else 0
            nl = int(seg.header["params"][2]) if ready else 0
            seg.validate(_ctl_info(job, n if num_collectors is None else num_collectors,
                                   nl if num_learners is None else num_learners))
            if not seg.locked_by_other(CTL_LAUNCHER_LOCK):
                raise ShmLayoutError(f"job {job!r} is not running: its launcher (pid "
                                     f"{read_pid(seg.u8, CTL_LAUNCHER_PID)}) is gone and "
                                     f"{name} is stale; {_remove_hint(job)}")
            if role == "collector":
                if collector_id is None or not 0 <= _check_collector_id(collector_id) < n:
                    raise ShmLayoutError(f"collector_id {collector_id!r} is not valid for job {job!r}: "
                                         f"it has {n} collectors (0..{n - 1})")
            return cls(seg, role, collector_id, learner_index, ingest_ids)
        except BaseException:
            seg.close()
            raise

    def close(self) -> None:
        if self._launch_guard is not None:
            os.close(self._launch_guard)
            self._launch_guard = None
        self._col_rec = self._ing_rec = self._sup_rec = self._lrn_rec = self._stats = self._stats_seq = []
        self.launcher = self.learner = None
        self._launcher = self._learners = self._collectors = self._ingest = self._supervisor = None
        self._seg.close()

    def unlink(self, include_collectors: bool = True) -> list[str]:
        """Launcher at shutdown: remove this job's rings/snapshots (this incarnation) and the ctl."""
        if self.role != "launcher":
            raise ShmLayoutError("only the launcher unlinks the control block")
        removed = []
        if include_collectors:
            for seg in _scan(self.job):
                if seg.kind != SegmentKind.CTL and _incarnation_of(seg.name) in (self.incarnation, None):
                    if _unlink_quiet(seg.name):
                        removed.append(seg.name)
        if self._seg.unlink():
            removed.append(self._seg.name)
        return removed

    def still_current(self) -> bool:
        """False once the launcher is gone or the name was re-created by a new launch."""
        return self._seg.still_named() and (self.role == "launcher" or self._seg.locked_by_other(CTL_LAUNCHER_LOCK))

    # ---- records

    def _cid(self, i: int) -> int:
        if not 0 <= i < self.num_collectors:
            raise ShmLayoutError(f"collector {i} does not exist in job {self.job!r} (0..{self.num_collectors - 1})")
        return i

    def collector(self, i: int) -> Record:
        """Fields written by collector i (stats excluded: use read/write_collector_stats)."""
        return self._col_rec[self._cid(i)]

    def learner_record(self, i: int) -> Record:
        """Fields written by local learner i (ctl.learner is this handle's own learner's)."""
        if not 0 <= i < self.num_learners:
            raise ShmLayoutError(f"learner {i} does not exist in job {self.job!r} (0..{self.num_learners - 1})")
        return self._lrn_rec[i]

    def ingest(self, i: int) -> Record:
        """Fields the learner of collector i writes about it."""
        return self._ing_rec[self._cid(i)]

    def supervisor(self, i: int) -> Record:
        """Fields the launcher writes about collector i."""
        return self._sup_rec[self._cid(i)]

    # ---- job settings (writer: launcher, before magic)

    def job_settings(self) -> dict:
        """The settings the launcher recorded for this job (see ControlBlock.create)."""
        rec = self._seg.u8[CTL_JOB:CTL_JOB + JOB_DTYPE.itemsize].view(JOB_DTYPE).reshape(())
        text = bytes(rec["settings"][()])
        if zlib.crc32(text) != int(rec["settings_digest"]):
            raise ShmLayoutError(f"the job settings in {self.name} are corrupt (digest mismatch)")
        return json.loads(text.decode()) if text else {}

    # ---- stop (writer: launcher)

    def request_stop(self, reason: StopReason) -> None:
        if self.role != "launcher":
            raise ShmLayoutError("only the launcher writes the stop flag; other processes report their state "
                                 "(FINISHED / FAILED) and the launcher decides")
        self.launcher["stop_reason"] = int(reason)
        self.launcher["stop"] = 1

    def stop_requested(self) -> bool:
        return bool(self.launcher["stop"])

    @property
    def stop_reason(self) -> StopReason:
        return StopReason(self.launcher["stop_reason"])

    # ---- collector stats (tiny seqlock; writer: collector i)

    def write_collector_stats(self, i: int, stats: dict) -> None:
        """Collector i publishes its cumulative stats; never blocks (seq odd, write, seq even)."""
        self._cid(i)
        if self.role != "collector" or self.collector_id != i:
            raise ShmLayoutError(f"collector stats of {i} are written by collector {i} only")
        seq, rec = self._stats_seq[i], self._stats[i]
        s = int(seq[0])
        seq[0] = s + 1
        for k, v in stats.items():
            rec[k] = v
        seq[0] = s + 2

    def read_collector_stats(self, i: int) -> dict | None:
        """A consistent copy of collector i's stats, or None if it was being written (retry later)."""
        self._cid(i)
        seq = self._stats_seq[i]
        s1 = int(seq[0])
        if s1 & 1:
            return None
        copy = self._stats[i].copy()
        if int(seq[0]) != s1:
            return None
        return {k: copy[k].item() for k in STATS_DTYPE.names}

    # ---- aggregation

    def heartbeat_ages_s(self, now_ns: int | None = None) -> list[float | None]:
        """Seconds since each collector's last heartbeat (None: never beat)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        return [None if hb == 0 else (now - int(hb)) / 1e9 for hb in self._collectors["heartbeat_ns"][:self.num_collectors]]

    def learner_heartbeat_age_s(self, now_ns: int | None = None, index: int | None = None) -> float | None:
        """Seconds since the last heartbeat of learner `index` (default: this handle's learner)."""
        hb = (self.learner if index is None else self.learner_record(index))["heartbeat_ns"]
        return None if hb == 0 else ((time.monotonic_ns() if now_ns is None else now_ns) - hb) / 1e9
