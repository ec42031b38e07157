"""Every shared-memory segment of a fastsac job: names, headers, offsets, dtypes.

This package is the single source of truth for the shared-memory layout. Nothing else
computes an offset into a segment. Torch-free on purpose (the launcher and the NUMA
check mode import it): numpy views over the mappings are enough; the learner copies ring slots
into its own buffer (TransitionRing.copy_into) and reads them there, numpy or torch, through
StagedSlots.

The segments of a job, who creates, writes and reads each: the table in docs/shared-memory.md
("Segments"), the one place it is written.

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
  ring_layout   the transition ring's byte format: slot layout (RingSpec, job_ring_spec), typed
                views of a slot (SlotView) and of slots copied out (StagedSlots)
  ring          the SPSC transition ring (TransitionRing): producer and consumer protocol
  policy_layout the flat policy vector a weight snapshot carries (its order and length)
  snapshot      weight snapshot (seqlock double buffer)
  eval_channel  the evaluator's channel: its liveness and its newest result (seqlock)
  control       control block: records, roles, stop flag, collector stats
  job_settings  the settings every process of a job must agree on, checked at attach
  segments_cli  `python -m fastsac.shm_layout list|clean` (low-level; see __main__)
Import the public names from the package (`from fastsac import shm_layout as shm`).
"""
from fastsac.shm_layout.cleanup import find_stale_segments, format_stale_report, unlink_job_segments
from fastsac.shm_layout.segments_cli import main
from fastsac.shm_layout.common import (
    DATA_OFFSET,
    EVALUATOR_ID,
    HEADER_NBYTES,
    LAYOUT_VERSION,
    MAX_COLLECTORS,
    MAX_LEARNERS,
    PREFIX,
    SHM_DIR,
    UNSAFE_ENV,
    SegmentKind,
    SegmentTaken,
    ShmLayoutError,
    ctl_name,
    eval_name,
    parse_segment_name,
    ring_name,
    segment_exists,
    shm_free_bytes,
    validate_job_name,
    wts_name,
)
from fastsac.shm_layout.control import (
    COLLECTOR_DTYPE,
    CTL_COLLECTORS,
    CTL_INGEST,
    CTL_LEARNER,
    CTL_NBYTES,
    CTL_SUPERVISOR,
    INGEST_DTYPE,
    LAUNCHER_DTYPE,
    LEARNER_DTYPE,
    STAGES,
    STATS_FIELDS,
    SUPERVISOR_DTYPE,
    ControlBlock,
    ProcState,
    StopReason,
    SupervisorState,
    UpdatePath,
)
from fastsac.shm_layout.eval_channel import EvalChannel
from fastsac.shm_layout.launch_guard import LaunchLockError, launch_lock_dir
from fastsac.shm_layout.locks import CTL_LAUNCHER, RING_CONSUMER_PID, RING_PRODUCER_PID, job_is_alive
from fastsac.shm_layout.ring import TransitionRing
from fastsac.shm_layout.ring_layout import (
    RING_READ_CURSOR,
    RING_WRITE_CURSOR,
    SLOT_HEADER_NBYTES,
    RingSpec,
    SlotView,
    StagedSlots,
    job_ring_spec,
)
from fastsac.shm_layout.segment import HEADER_DTYPE
from fastsac.shm_layout.snapshot import WeightSnapshot, snapshot_nbytes

# What the rest of fastsac, its tests and benchmarks use; the other names stay in their modules.
__all__ = [
    "COLLECTOR_DTYPE", "CTL_COLLECTORS", "CTL_INGEST", "CTL_LAUNCHER", "CTL_LEARNER", "CTL_NBYTES",
    "CTL_SUPERVISOR", "ControlBlock", "DATA_OFFSET", "EVALUATOR_ID", "EvalChannel", "HEADER_DTYPE",
    "HEADER_NBYTES", "INGEST_DTYPE", "LAUNCHER_DTYPE", "LAYOUT_VERSION", "LEARNER_DTYPE", "LaunchLockError",
    "MAX_COLLECTORS", "MAX_LEARNERS", "PREFIX", "ProcState", "RING_CONSUMER_PID", "RING_PRODUCER_PID",
    "RING_READ_CURSOR", "RING_WRITE_CURSOR", "RingSpec", "SHM_DIR", "SLOT_HEADER_NBYTES", "STAGES",
    "STATS_FIELDS", "SUPERVISOR_DTYPE", "SegmentKind", "SegmentTaken", "ShmLayoutError", "SlotView",
    "StagedSlots", "StopReason", "SupervisorState", "TransitionRing", "UNSAFE_ENV", "UpdatePath", "WeightSnapshot",
    "ctl_name", "eval_name", "find_stale_segments", "format_stale_report", "job_is_alive", "job_ring_spec",
    "launch_lock_dir", "main", "parse_segment_name", "ring_name", "segment_exists", "shm_free_bytes",
    "snapshot_nbytes", "unlink_job_segments", "validate_job_name", "wts_name",
]
