"""Seqlock double-buffered weight snapshot: semantics, and a cross-process stress test
with a negative control (the same detector with the post-copy re-check disabled must
catch torn copies, proving the test can see tearing at all)."""
from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from fastsac import shm_layout as L
from fastsac.shm_layout import snapshot

INC = 0x0BAD_CAFE_F00D_0001
NUMEL_4MB = 1 << 20  # 1M float32 = 4 MiB: a copy takes long enough to be overtaken


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
