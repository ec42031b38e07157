"""The evaluator's channel `/fastsac.<job>.eval`: its liveness and its newest result.

One writer, the evaluator (holder of OFD lock byte 0, from the first instant of creation);
readers never write a byte: the learner (results, to log them), the launcher (liveness, to
restart a crashed or hung evaluator) and `--status`. The channel outlives an evaluator that
dies: a restarted evaluator re-attaches the segment of this launch and counts its own
incarnation up, like a collector its ring.

    offset  field                                   writer
       512  [pid, attached_ns]                      evaluator (locks.EVAL_EVALUATOR_PID)
       576  status: incarnation, state, heartbeat_ns, started_ns, busy_env_steps, evaluations
       640  result (seqlock, single buffer): seq, env_steps, weight_version, episodes,
            mean/min/max return, mean/min/max length, seconds, finished_ns

The result is a tiny seqlock: seq odd, field stores, seq even (the number of results written
is seq // 2). A reader copies the record in one numpy call and keeps it only when seq was even
and unchanged around the copy, so it never sees a half-written result and never blocks the
evaluator (x86-64 TSO, argued for the control block's collector stats in docs/shared-memory.md).
"""
from __future__ import annotations

import os
import time

import numpy as np

from fastsac.shm_layout.cleanup import _replace_if_stale
from fastsac.shm_layout.common import (
    CACHE_LINE,
    HEADER_NBYTES,
    PAGE,
    SegmentKind,
    ShmLayoutError,
    _digest,
    check_memory_order,
    eval_name,
    segment_exists,
    validate_job_name,
)
from fastsac.shm_layout.locks import EVAL_EVALUATOR_LOCK, EVAL_EVALUATOR_PID, read_pid
from fastsac.shm_layout.segment import SegmentInfo, _incarnation_of, _Segment, _SegmentHandle

EVAL_STATUS = HEADER_NBYTES + 1 * CACHE_LINE   # writer: evaluator
EVAL_RESULT = HEADER_NBYTES + 2 * CACHE_LINE   # writer: evaluator (seqlock)
EVAL_NBYTES = PAGE

STATUS_DTYPE = np.dtype([("incarnation", "<i8"), ("state", "<i8"), ("heartbeat_ns", "<i8"), ("started_ns", "<i8"),
                         ("busy_env_steps", "<i8"), ("evaluations", "<i8")])
RESULT_FIELDS = [("env_steps", "<i8"), ("weight_version", "<i8"), ("episodes", "<i8"), ("mean_return", "<f8"),
                 ("min_return", "<f8"), ("max_return", "<f8"), ("mean_ep_len", "<f8"), ("min_ep_len", "<i8"),
                 ("max_ep_len", "<i8"), ("seconds", "<f8"), ("finished_ns", "<i8")]
RESULT_DTYPE = np.dtype([("seq", "<i8"), *RESULT_FIELDS])
assert STATUS_DTYPE.itemsize <= CACHE_LINE and EVAL_RESULT + RESULT_DTYPE.itemsize <= EVAL_NBYTES


def _eval_info(job: str) -> SegmentInfo:
    table = (EVAL_EVALUATOR_PID, EVAL_STATUS, EVAL_RESULT, STATUS_DTYPE.descr, RESULT_DTYPE.descr)
    return SegmentInfo(SegmentKind.EVAL, validate_job_name(job), -1, {"record_nbytes": RESULT_DTYPE.itemsize},
                       "float64", EVAL_NBYTES, _digest(table))


class EvalChannel(_SegmentHandle):
    """role 'evaluator' (the one writer) or 'observer' (reads only; every write raises)."""

    def __init__(self, seg: _Segment, role: str):
        self._seg, self.role = seg, role
        self.incarnation = int(seg.header["incarnation"])
        u8 = seg.u8
        self._pid = u8[EVAL_EVALUATOR_PID:EVAL_EVALUATOR_PID + 16].view(np.int64)
        self._status = u8[EVAL_STATUS:EVAL_STATUS + STATUS_DTYPE.itemsize].view(STATUS_DTYPE).reshape(())
        self._result = u8[EVAL_RESULT:EVAL_RESULT + RESULT_DTYPE.itemsize].view(RESULT_DTYPE).reshape(())
        self._seq = u8[EVAL_RESULT:EVAL_RESULT + 8].view(np.int64)

    @classmethod
    def create_or_attach(cls, job: str, incarnation: int) -> "EvalChannel":
        """The evaluator at start: re-attach this launch's channel (a restart), else create it."""
        check_memory_order()
        info = _eval_info(job)
        if _incarnation_of(info.name) == incarnation & (2**64 - 1):
            seg = _Segment.open_validated(info, incarnation, f"{info.what}: segment {info.name} vanished")
        else:
            _replace_if_stale(info)
            seg = _Segment.create(info, incarnation, lock_byte=EVAL_EVALUATOR_LOCK)
        if not seg.try_lock(EVAL_EVALUATOR_LOCK):
            holder = read_pid(seg.u8, EVAL_EVALUATOR_PID)
            seg.close()
            raise ShmLayoutError(f"{info.what} already has an evaluator (pid {holder}): one evaluator per job")
        ch = cls(seg, "evaluator")
        ch._pid[:] = (os.getpid(), time.monotonic_ns())
        return ch

    @classmethod
    def attach(cls, job: str, incarnation: int | None = None) -> "EvalChannel":
        """A read-only handle (learner, launcher, --status); ShmLayoutError while there is none."""
        check_memory_order()
        info = _eval_info(job)
        seg = _Segment.open_validated(info, incarnation, f"{info.what}: segment {info.name} does not exist "
                                                         f"(the evaluator of job {job!r} has not created it)")
        return cls(seg, "observer")

    @staticmethod
    def exists(job: str) -> bool:
        return segment_exists(eval_name(job))

    def close(self) -> None:
        self._pid = self._status = self._result = self._seq = None
        self._seg.close()

    def _writer(self) -> None:
        if self.role != "evaluator":
            raise ShmLayoutError(f"evaluator channel: role {self.role!r} may not write it (one writer: the evaluator)")

    # ---- status (evaluator writes single aligned int64 fields; readers read them plainly)

    def update(self, **fields: int) -> None:
        self._writer()
        for name, value in fields.items():
            self._status[name] = int(value)

    def beat(self) -> None:
        self._writer()
        self._status["heartbeat_ns"] = time.monotonic_ns()

    def status(self) -> dict:
        s = self._status
        return {name: int(s[name]) for name in STATUS_DTYPE.names} | {"pid": int(self._pid[0])}

    def heartbeat_age_s(self, now_ns: int | None = None) -> float | None:
        hb = int(self._status["heartbeat_ns"])
        return None if not hb else ((now_ns or time.monotonic_ns()) - hb) / 1e9

    # ---- result (seqlock)

    def write_result(self, result: dict) -> int:
        """Publish one evaluation's result; returns its number (1, 2, ...)."""
        self._writer()
        s = int(self._seq[0]) & ~1
        self._seq[0] = s + 1                           # odd: readers back off
        for name, _ in RESULT_FIELDS:
            self._result[name] = result[name]
        self._seq[0] = s + 2                           # even: complete (after the field stores, TSO)
        return (s + 2) // 2

    def read_result(self, last: int = 0) -> tuple[int, dict] | None:
        """(number, fields) of the newest complete result if its number is not `last`; else None.
        Never waits: None also while the evaluator is writing it."""
        s1 = int(self._seq[0])
        if s1 & 1 or s1 // 2 in (0, last):
            return None
        copy = self._result.copy()                     # one numpy copy of the record
        if int(self._seq[0]) != s1:
            return None
        return s1 // 2, {name: copy[name].item() for name, _ in RESULT_FIELDS}


# The evaluator's weight snapshot holds the policy vector (FastSAC.policy_flat()'s layout) and, in
# the same seqlock-protected buffer, the env step and the learner's weight version of those weights
# as two int64 in 4 float32 slots: they always arrive together with the weights they describe.
TAG_SLOTS = 4


def snapshot_numel(policy_numel: int) -> int:
    return policy_numel + TAG_SLOTS


def pack_weights(out: np.ndarray, flat: np.ndarray, env_steps: int, weight_version: int) -> np.ndarray:
    """Fill out (float32 [snapshot_numel]) with the policy vector and its tag."""
    out[:-TAG_SLOTS] = flat
    out[-TAG_SLOTS:].view(np.int64)[:] = (env_steps, weight_version)
    return out


def unpack_tag(buf: np.ndarray) -> tuple[int, int]:
    """(env_steps, weight_version) of the weights in buf."""
    env_steps, version = buf[-TAG_SLOTS:].view(np.int64)
    return int(env_steps), int(version)
