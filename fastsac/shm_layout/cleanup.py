"""Stale segments and their removal: which segments belong to a dead job (or to an earlier
launch of a live one), why, and unlinking them; never a live job's current segments.

The command people are told to run is `fastsac-launch --cleanup JOB` (common.cleanup_command),
which calls unlink_job_segments.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from fastsac.common.procs import boot_id, pid_alive
from fastsac.shm_layout.common import (
    MAGIC, SHM_DIR, SegmentKind, ShmLayoutError, _mb, _path, cleanup_command, ctl_name, parse_segment_name,
    validate_job_name,
)
from fastsac.shm_layout.locks import (
    CTL_LAUNCHER_PID, RING_PRODUCER_LOCK, RING_PRODUCER_PID, ROLE_LOCKS, job_is_alive, read_pid,
)
from fastsac.shm_layout.segment import SegmentInfo, _open_quiet, _unlink_quiet


def _ctl_launcher_pid(job: str) -> int:
    """pid of the launcher that created the job's control block; -1 if there is none."""
    seg = _open_quiet(ctl_name(job))
    if seg is None:
        return -1
    try:
        return read_pid(seg.u8, CTL_LAUNCHER_PID)
    finally:
        seg.close()


@dataclass(frozen=True)
class StaleSegment:
    name: str                 # '/fastsac.J.c0.ring'
    job: str
    kind: SegmentKind
    collector_id: int
    nbytes: int
    reason: str
    attached_pids: tuple[int, ...] = ()   # processes still attached (orphans), if known


@dataclass(frozen=True)
class _Found:
    name: str
    job: str
    kind: SegmentKind
    collector_id: int


def _scan(job: str | None = None) -> list[_Found]:
    try:
        entries = sorted(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return []
    out = []
    for fname in entries:
        parsed = parse_segment_name(fname)
        if parsed and (job is None or parsed[0] == job):
            out.append(_Found("/" + fname, *parsed))
    return out


def _ctl_status(job: str) -> tuple[bool, str, int | None]:
    """(alive, why-dead, incarnation) of a job's control block."""
    name = ctl_name(job)
    if not os.path.exists(_path(name)):
        return False, f"its job's control block {name} is gone", None
    alive = job_is_alive(job)
    seg = _open_quiet(name)
    if seg is None:
        if alive:  # being created: too small to read yet
            return True, "", None
        return False, f"job {job!r} is dead ({name} is unreadable and no launcher holds it)", None
    try:
        if alive:
            inc = int(seg.header["incarnation"]) if int(seg.header["magic"]) == MAGIC else None
            return True, "", inc
        pid = read_pid(seg.u8, CTL_LAUNCHER_PID) or int(seg.header["creator_pid"])
        why = [f"launcher pid {pid} no longer holds it"]
        if int(seg.header["magic"]) != MAGIC:
            why.append("creation never finished")
        elif seg.header_value("boot_id") != boot_id():
            why.append("created before the last reboot")
        elif not pid_alive(pid):
            why.append("that process is gone")
        return False, f"job {job!r} is dead ({'; '.join(why)})", int(seg.header["incarnation"])
    finally:
        seg.close()


def _segment_stale_reason(found: _Found, ctl: tuple[bool, str, int | None]) -> tuple[str | None, tuple[int, ...]]:
    alive, why, ctl_inc = ctl
    if found.kind == SegmentKind.CTL:
        return (None if alive else why), ()
    seg = _open_quiet(found.name)
    if seg is None:
        return ("unreadable or too small (creation crashed)" if not alive else None), ()
    try:
        creating = int(seg.header["magic"]) != MAGIC
        pids = tuple(read_pid(seg.u8, r.pid_line) for r in ROLE_LOCKS[found.kind] if seg.locked_by_other(r.byte))
        if not alive:
            return why, pids
        if creating:
            # Live job, header not written yet: being created (the creator holds its lock) or crashed.
            return (None if pids else "creation never finished and nobody holds it"), pids
        inc = int(seg.header["incarnation"])
        if ctl_inc is not None and inc != ctl_inc:
            return (f"left over from an earlier launch of job {found.job!r} "
                    f"(incarnation {inc:#x}, running {ctl_inc:#x})"), pids
        if seg.header_value("boot_id") != boot_id():
            return "created before the last reboot", pids
        return None, pids
    finally:
        seg.close()


def find_stale_segments(job: str | None = None) -> list[StaleSegment]:
    """Segments of dead jobs (or of earlier launches of a live job), with the reason.

    Never reports a segment of a live job's current incarnation.
    """
    if job is not None:
        validate_job_name(job)
    found = _scan(job)
    ctl_cache: dict[str, tuple[bool, str, int | None]] = {}
    out = []
    for f in found:
        if f.job not in ctl_cache:
            ctl_cache[f.job] = _ctl_status(f.job)
        reason, pids = _segment_stale_reason(f, ctl_cache[f.job])
        if reason is not None:
            try:
                nbytes = os.stat(_path(f.name)).st_size
            except FileNotFoundError:
                continue
            out.append(StaleSegment(f.name, f.job, f.kind, f.collector_id, nbytes, reason, pids))
    return out


def format_stale_report(stale: list[StaleSegment]) -> str:
    if not stale:
        return "no stale fastsac segments"
    lines = [f"{len(stale)} stale fastsac segment(s) in {SHM_DIR} ({_mb(sum(s.nbytes for s in stale))}):"]
    for s in stale:
        extra = f"; still mapped by pid {', '.join(map(str, s.attached_pids))}" if s.attached_pids else ""
        lines.append(f"  {s.name} ({_mb(s.nbytes)}): {s.reason}{extra}")
    for job in sorted({s.job for s in stale}):
        lines.append(f"remove with: {cleanup_command(job)}")
    return "\n".join(lines)


def _replace_if_stale(info: SegmentInfo) -> None:
    """create(): refuse an existing name unless it is stale, then remove it."""
    path = _path(info.name)
    if not os.path.exists(path):
        return
    found = _Found(info.name, info.job, info.kind, info.collector_id)
    reason, pids = _segment_stale_reason(found, _ctl_status(info.job))
    if info.kind == SegmentKind.RING and pids:
        seg = _open_quiet(info.name)
        holder = -1
        if seg is not None:
            try:
                if seg.locked_by_other(RING_PRODUCER_LOCK):
                    holder = read_pid(seg.u8, RING_PRODUCER_PID)
            finally:
                seg.close()
        if holder != -1:
            raise ShmLayoutError(f"{info.what}: {info.name} is attached by producer pid {holder}: collector_id "
                                 f"{info.collector_id} is taken")
    if reason is None:
        raise ShmLayoutError(f"{info.what}: segment {info.name} already exists and belongs to the running job "
                             f"{info.job!r}; attach to it (a restarted collector attaches as producer)")
    _unlink_quiet(info.name)


def unlink_job_segments(job: str, force: bool = False) -> list[str]:
    """Remove every segment of a dead job; returns the names removed.

    Refused while the job's launcher is alive (never overridable). Without force, also
    refused while an orphaned collector/learner is still attached to one of its rings;
    force unlinks anyway (the orphan keeps its private mapping until it exits).
    """
    validate_job_name(job)
    if job_is_alive(job):
        raise ShmLayoutError(f"job {job!r} is alive (launcher pid {_ctl_launcher_pid(job)} holds "
                             f"{ctl_name(job)}); stop it first: nothing unlinks a live job's segments")
    found = _scan(job)
    if not force:
        ctl = _ctl_status(job)
        attached = {f.name: pids for f in found for _, pids in [_segment_stale_reason(f, ctl)] if pids}
        if attached:
            desc = "; ".join(f"{n} by pid {', '.join(map(str, p))}" for n, p in attached.items())
            raise ShmLayoutError(f"job {job!r} is dead but processes are still attached ({desc}); "
                                 "stop them, or pass force=True (--force)")
    removed = []
    # ctl last: while it exists, a concurrent create() of this job cannot mistake us for live.
    for f in sorted(found, key=lambda f: f.kind == SegmentKind.CTL):
        if _unlink_quiet(f.name):
            removed.append(f.name)
    return removed
