"""Every shared-memory segment of a fastsac job: names, headers, offsets, dtypes.

This package is the single source of truth for the shared-memory layout. Nothing else
computes an offset into a segment. Torch-free on purpose (the launcher and the NUMA
check mode import it): numpy views over the mappings are enough; the learner wraps them
with torch.from_numpy.

Segments of job J (POSIX shared memory, /dev/shm/<name without the slash>):

  /fastsac.J.ctl       control block: created by the launcher (one per job)
  /fastsac.J.c<i>.ring SPSC transition ring of collector i: created by collector i
  /fastsac.J.c<i>.wts  seqlock double-buffered actor snapshot of collector i: created by
                       collector i (first touch under its NUMA binding), written by the learner
  /fastsac.J.eval      the evaluator's channel (liveness, newest result): created and written by
                       the evaluator (only with eval.interval > 0)
  /fastsac.J.eval.wts  the evaluator's weight snapshot: like a collector's (EVALUATOR_ID)

Rules that make the whole thing lock-free (argued in docs/shared-memory.md):
  * every shared field has exactly one writer process (stated next to each field);
  * cursors and sequence counters are aligned int64, each on its own 64-byte line;
  * data is written before the counter that publishes it, and read after the counter
    that announced it. On x86-64 (TSO) plain stores/loads give that order; see
    `check_memory_order`.

Modules, each importing only those above it:
  common        constants, segment names, ShmLayoutError, the x86-64 guard
  locks         liveness: OFD byte locks, which byte each role locks and where its pid lives
  segment       the common header and one mapped segment (create, validate, lock, unlink)
  cleanup       stale segments (find, report, remove); `fastsac-launch --cleanup JOB` uses it
  launch_guard  the user-private flock that keeps a second launcher of a job out
  ring          transition ring: slot layout (RingSpec, SlotView) and TransitionRing
  snapshot      weight snapshot (seqlock double buffer)
  eval_channel  the evaluator's channel: its liveness and its newest result (seqlock)
  control       control block: records, roles, stop flag, collector stats
  cli           `python -m fastsac.shm_layout list|clean` (low-level; see __main__)
Import the public names from the package (`from fastsac import shm_layout as shm`).
"""
from fastsac.common.procs import boot_id, pid_alive
from fastsac.shm_layout.cleanup import StaleSegment, find_stale_segments, format_stale_report, unlink_job_segments
from fastsac.shm_layout.cli import main
from fastsac.shm_layout.common import (
    CACHE_LINE,
    DATA_OFFSET,
    EVALUATOR_ID,
    HEADER_NBYTES,
    JOB_NAME_RE,
    LAYOUT_VERSION,
    MADV_POPULATE_WRITE,
    MAGIC,
    MAX_COLLECTORS,
    MAX_LEARNERS,
    PAGE,
    PREFIX,
    SHM_DIR,
    UNSAFE_ENV,
    SegmentKind,
    SegmentTaken,
    ShmLayoutError,
    check_memory_order,
    cleanup_command,
    ctl_name,
    eval_name,
    parse_segment_name,
    ring_name,
    segment_exists,
    segment_name,
    shm_free_bytes,
    validate_job_name,
    wts_name,
)
from fastsac.shm_layout.control import (
    COLLECTOR_DTYPE,
    CTL_COLLECTORS,
    CTL_INGEST,
    CTL_JOB,
    CTL_LEARNER,
    CTL_NBYTES,
    CTL_SUPERVISOR,
    INGEST_DTYPE,
    JOB_DTYPE,
    LAUNCHER_DTYPE,
    LEARNER_DTYPE,
    STAGES,
    STATS_DTYPE,
    STATS_FIELDS,
    SUPERVISOR_DTYPE,
    ControlBlock,
    ProcState,
    Record,
    StopReason,
    SupervisorState,
)
from fastsac.shm_layout.eval_channel import EvalChannel
from fastsac.shm_layout.launch_guard import LaunchLockError, launch_lock_dir
from fastsac.shm_layout.locks import (
    CTL_LAUNCHER,
    CTL_LAUNCHER_LOCK,
    RING_CONSUMER_LOCK,
    RING_CONSUMER_PID,
    RING_PRODUCER_LOCK,
    RING_PRODUCER_PID,
    WTS_READER_LOCK,
    WTS_READER_PID,
    WTS_WRITER_LOCK,
    WTS_WRITER_PID,
    job_is_alive,
)
from fastsac.shm_layout.ring import (
    HDR,
    RING_READ_CURSOR,
    RING_WRITE_CURSOR,
    SLOT_HEADER_FIELDS,
    SLOT_HEADER_NBYTES,
    RingSpec,
    SlotField,
    SlotView,
    TransitionRing,
    staged_headers,
)
from fastsac.shm_layout.segment import HEADER_DTYPE, PARAM_NAMES, SegmentInfo
from fastsac.shm_layout.snapshot import WTS_SEQ, WeightSnapshot, _wts_info  # noqa: F401 (preflight sizes snapshots)

__all__ = [
    "CACHE_LINE", "COLLECTOR_DTYPE", "CTL_COLLECTORS", "CTL_INGEST", "CTL_JOB", "CTL_LAUNCHER",
    "CTL_LAUNCHER_LOCK", "CTL_LEARNER", "CTL_NBYTES", "CTL_SUPERVISOR", "ControlBlock", "DATA_OFFSET", "EVALUATOR_ID", "EvalChannel", "HDR",
    "HEADER_DTYPE", "HEADER_NBYTES", "INGEST_DTYPE", "JOB_DTYPE", "JOB_NAME_RE", "LAUNCHER_DTYPE",
    "LAYOUT_VERSION", "LEARNER_DTYPE", "LaunchLockError", "MADV_POPULATE_WRITE", "MAGIC", "MAX_COLLECTORS", "MAX_LEARNERS",
    "PAGE", "PARAM_NAMES", "PREFIX", "ProcState", "RING_CONSUMER_LOCK", "RING_CONSUMER_PID",
    "RING_PRODUCER_LOCK", "RING_PRODUCER_PID", "RING_READ_CURSOR", "RING_WRITE_CURSOR", "Record", "RingSpec",
    "SHM_DIR", "SLOT_HEADER_FIELDS", "SLOT_HEADER_NBYTES", "STAGES", "STATS_DTYPE", "STATS_FIELDS",
    "SUPERVISOR_DTYPE", "SegmentInfo", "SegmentKind", "SegmentTaken", "ShmLayoutError", "SlotField", "SlotView",
    "StaleSegment", "StopReason", "SupervisorState", "TransitionRing", "UNSAFE_ENV", "WTS_READER_LOCK",
    "WTS_READER_PID", "WTS_SEQ", "WTS_WRITER_LOCK", "WTS_WRITER_PID", "WeightSnapshot", "boot_id",
    "check_memory_order", "cleanup_command", "ctl_name", "eval_name", "find_stale_segments", "format_stale_report",
    "job_is_alive", "launch_lock_dir", "main", "parse_segment_name", "pid_alive", "ring_name",
    "segment_exists", "segment_name", "shm_free_bytes", "staged_headers", "unlink_job_segments",
    "validate_job_name", "wts_name",
]
