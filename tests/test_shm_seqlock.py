"""Seqlock double-buffered weight snapshot: semantics, and a cross-process stress test
with a negative control (the same detector with the post-copy re-check disabled must
catch torn copies, proving the test can see tearing at all)."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from fastsac import shm_layout as L
from fastsac.shm_layout import snapshot

INC = 0x0BAD_CAFE_F00D_0001
NUMEL_4MB = 1 << 20  # 1M float32 = 4 MiB: a copy takes long enough to be overtaken


def test_publish_and_load_versions(job_name):
    reader = L.WeightSnapshot.create(job_name, 0, 1000, INC)
    writer = L.WeightSnapshot.attach(job_name, 0, 1000, "writer", incarnation=INC)
    out = np.zeros(1000, np.float32)
    try:
        assert reader.version == 0 and reader.try_load(out, -1) is None  # nothing published yet
        for v in range(1, 6):
            assert writer.publish(np.full(1000, v, np.float32)) == v
        assert reader.version == 5
        assert reader.try_load(out, 4) == 5 and (out == 5).all()
        assert reader.try_load(out, 5) is None  # not newer
        # both buffers hold the two newest versions
        assert (reader._bufs[1] == 5).all() and (reader._bufs[0] == 4).all()
        # a 2-D out of the same size works (no silent copy into a temporary)
        out2 = np.zeros((10, 100), np.float32)
        assert reader.try_load(out2, 0) == 5 and (out2 == 5).all()
        with pytest.raises(L.ShmLayoutError, match="only the writer may publish"):
            reader.publish(out)
        with pytest.raises(L.ShmLayoutError, match="expected 1000 float32 values, got 1000 float64"):
            writer.publish(np.zeros(1000))
        with pytest.raises(L.ShmLayoutError, match="out has 999 elements"):
            reader.try_load(np.zeros(999, np.float32), 0)
    finally:
        reader.close(), writer.close()


def test_odd_seq_returns_none_at_once(job_name):
    reader = L.WeightSnapshot.create(job_name, 0, 64, INC)
    writer = L.WeightSnapshot.attach(job_name, 0, 64, "writer")
    try:
        writer.publish(np.ones(64, np.float32))
        writer._seq[0] = 3  # as if a publish of version 2 were in progress
        t = time.perf_counter()
        assert reader.try_load(np.zeros(64, np.float32), 0) is None
        # returns at once: a reader that waited or spun for an even seq would never return here
        # (the bound is loose on purpose: a shared CI machine can deschedule us for milliseconds)
        assert time.perf_counter() - t < 1.0
    finally:
        reader.close(), writer.close()


def test_a_corrupted_seq_is_repaired_by_the_next_publish(job_name):
    """Somebody else wrote the seq (a stray write, a flipped bit). The writer publishes from its
    own copy of seq, so the snapshot becomes consistent again and the reader loads again."""
    reader = L.WeightSnapshot.create(job_name, 0, 64, INC)
    writer = L.WeightSnapshot.attach(job_name, 0, 64, "writer")
    out = np.zeros(64, np.float32)
    try:
        writer.publish(np.full(64, 1, np.float32))
        assert reader.try_load(out, 0) == 1
        reader._seq[0] |= 1          # stuck odd: every reader backs off for good...
        assert reader.try_load(out, 1) is None
        assert writer.publish(np.full(64, 2, np.float32)) == 2   # ...until the next publish
        assert writer.repairs == 1
        assert reader.try_load(out, 1) == 2 and (out == 2).all()
        reader._seq[0] = 2 * 1000    # even but far ahead: the reader takes "version 1000" once...
        assert reader.try_load(out, 2) == 1000
        assert writer.publish(np.full(64, 3, np.float32)) == 3 and writer.repairs == 2
        assert reader.try_load(out, 1000) == 3 and (out == 3).all()   # ...and follows the repair down
    finally:
        reader.close(), writer.close()


def test_single_writer_and_crashed_writer_recovery(job_name):
    reader = L.WeightSnapshot.create(job_name, 0, 64, INC)
    writer = L.WeightSnapshot.attach(job_name, 0, 64, "writer")
    try:
        with pytest.raises(L.ShmLayoutError, match=r"already has a writer \(pid \d+\): only one learner"):
            L.WeightSnapshot.attach(job_name, 0, 64, "writer")
        with pytest.raises(L.ShmLayoutError, match=rf"already has a reader \(pid {os.getpid()}\): collector_id 0"):
            L.WeightSnapshot.attach(job_name, 0, 64, "reader")
        writer.publish(np.full(64, 1, np.float32))
        writer._seq[0] += 1  # the writer dies in the middle of publishing version 2
        writer._bufs[0][:10] = 99
        writer.close()
        writer = L.WeightSnapshot.attach(job_name, 0, 64, "writer")  # learner restart
        assert writer.version == 1  # rolled back to the last complete version
        out = np.zeros(64, np.float32)
        assert reader.try_load(out, 0) == 1 and (out == 1).all()
        assert writer.publish(np.full(64, 2, np.float32)) == 2
        assert reader.try_load(out, 1) == 2 and (out == 2).all()
    finally:
        reader.close(), writer.close()


# --------------------------------------------------------------------------- stress

def writer_main(job: str, numel: int, stop, ready) -> None:
    """Bursts of back-to-back publishes (where copies get overtaken), then short pauses
    (where most copies succeed, so the accepted ones are many and checked).

    Buffer contents = version % 4 + 1: versions v and v + 2 (the next user of the same
    buffer) always differ, so a copy mixing them is detectably torn.
    """
    snap = L.WeightSnapshot.attach(job, 0, numel, "writer")
    patterns = [np.full(numel, p + 1, np.float32) for p in range(4)]  # prebuilt: no fill cost
    ready.set()
    while not stop.is_set():
        for _ in range(20):
            snap.publish(patterns[(snap.version + 1) % 4])
        time.sleep(0.002)
    snap.close()


def _is_torn(out: np.ndarray, version: int) -> bool:
    return not (out == version % 4 + 1).all()


class _NumpyWithStalledCopies:
    """shm_layout.snapshot's `np`, except that every other `copyto` stalls 1 ms halfway through.

    A reader that starts a copy in one of the writer's bursts is then overtaken by two versions
    for certain, on any machine and under any load; without the stall, whether copies get
    overtaken at all depends on how the two processes happen to be scheduled (a loaded 2-core
    CI machine once produced no torn copy in 20 s, and the negative control failed)."""

    def __init__(self):
        self._calls = 0

    def __getattr__(self, name):
        return getattr(np, name)

    def copyto(self, dst, src, *args, **kwargs):
        self._calls += 1
        if self._calls % 2 or args or kwargs or dst.ndim != 1 or src.ndim != 1:
            return np.copyto(dst, src, *args, **kwargs)
        half = dst.size // 2
        np.copyto(dst[:half], src[:half])
        time.sleep(0.001)
        np.copyto(dst[half:], src[half:])


@pytest.mark.process
def test_cross_process_no_torn_snapshot_accepted_and_negative_control(job_name, procs, monkeypatch):
    ctx = mp.get_context("spawn")
    monkeypatch.setattr(snapshot, "np", _NumpyWithStalledCopies())
    reader = L.WeightSnapshot.create(job_name, 0, NUMEL_4MB, INC)
    stop, ready = ctx.Event(), ctx.Event()
    p = procs(writer_main, job_name, NUMEL_4MB, stop, ready)
    assert ready.wait(30)
    out = np.empty(NUMEL_4MB, np.float32)
    counts = {True: [0, 0, 0], False: [0, 0, 0]}  # recheck -> [attempts, accepted, torn accepted]
    t0 = time.monotonic()
    try:
        # At least 2 s; then up to 20 s more until the negative control has seen tearing.
        while time.monotonic() - t0 < 2.0 or (counts[False][2] == 0 and time.monotonic() - t0 < 20):
            for recheck in (True, False):  # alternate, so both see the same conditions
                reader._recheck = recheck
                c = counts[recheck]
                c[0] += 1
                v = reader.try_load(out, -1)
                if v is not None:
                    c[1] += 1
                    c[2] += _is_torn(out, v)
            if not p.is_alive():
                pytest.fail(f"writer died (exit code {p.exitcode})")
    finally:
        stop.set()
        p.join(10)
        reader._recheck = True
        reader.close()
    checked, unchecked = counts[True], counts[False]
    summary = (f"with re-check: {checked[1]}/{checked[0]} accepted, {checked[2]} torn; "
               f"without: {unchecked[1]}/{unchecked[0]} accepted, {unchecked[2]} torn")
    print(summary)
    assert checked[2] == 0, summary
    assert checked[1] > 0, "the reader never got a copy through: the test proves nothing; " + summary
    assert unchecked[2] > 0, "negative control saw no torn copy: the detector is blind; " + summary
