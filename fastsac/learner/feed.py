"""The learner's end of one collector: its ring (consumer) and snapshot (writer), the checks on
everything read from the ring, and dropping a collector that fails them.

Nothing a collector writes is trusted: a hand-started process, a bug or a stray write can put
anything into its segments. The learner checks the cursor distance, every slot's stamps and
the values before a single row reaches the replay buffer; a collector that fails a check is
dropped (its data is never trained on, the job goes on) until a new incarnation of it starts
with a fresh ring. Torch-free.
"""
from __future__ import annotations

import time

import numpy as np

from fastsac import shm_layout as shm


class FeedFault(Exception):
    """A collector's segments hold something no correct collector writes."""


class CollectorFeed:
    def __init__(self, job: str, cid: int, env_first: int, env_count: int, spec: "shm.RingSpec", numel: int):
        self.job, self.cid, self.spec, self.numel = job, cid, spec, numel
        self.rows = slice(env_first, env_first + env_count)
        self.ring: shm.TransitionRing | None = None
        self.snapshot: shm.WeightSnapshot | None = None
        self.attached_once = False
        self.dropped_incarnation: int | None = None   # set while dropped: the incarnation that faulted
        self.faults = 0
        self.rejected_slots = 0
        self.last_incarnation: int | None = None       # of the last ingested slot
        self.last_env_step = 0
        self.ingested_slots = 0
        self.last_ingest_ns = 0
        self.max_lag = 0

    @property
    def attached(self) -> bool:
        return self.ring is not None and self.snapshot is not None

    def try_attach(self, collector_incarnation: int) -> bool:
        """Attach ring and snapshot once the collector created them; True on a new attachment.

        A dropped collector is attached again only once a newer incarnation of it runs (it
        replaced its ring). Raises FeedFault for segments that do not fit this job.
        """
        if self.attached:
            return False
        if self.dropped_incarnation is not None and collector_incarnation <= self.dropped_incarnation:
            return False
        try:
            if self.ring is None:
                if not shm.segment_exists(shm.ring_name(self.job, self.cid)):
                    return False
                self.ring = shm.TransitionRing.attach(self.job, self.cid, self.spec, role="consumer")
            if self.snapshot is None:
                if not shm.segment_exists(shm.wts_name(self.job, self.cid)):
                    return False
                self.snapshot = shm.WeightSnapshot.attach(self.job, self.cid, self.numel, role="writer")
        except shm.ShmLayoutError as exc:
            raise FeedFault(str(exc)) from None
        self.attached_once = True
        self.dropped_incarnation = None
        self.last_incarnation = None
        return True

    def drop(self, collector_incarnation: int) -> None:
        """Stop consuming: detach from its segments until a newer incarnation replaces them."""
        self.close()
        self.dropped_incarnation = collector_incarnation
        self.faults += 1

    def available(self) -> int:
        """Ready slots; FeedFault when the cursors are impossible (more than the ring holds, or backwards)."""
        if self.ring is None:
            return 0
        n = self.ring.available()
        if not 0 <= n <= self.spec.capacity:
            raise FeedFault(f"cursor distance {n} is outside 0..{self.spec.capacity} (write cursor "
                            f"{self.ring.write_cursor}, read cursor {self.ring.read_cursor})")
        return n

    def fill(self) -> float:
        return self.ring.available() / self.spec.capacity if self.ring is not None else 0.0

    @property
    def snapshot_version(self) -> int:
        return self.snapshot.version if self.snapshot is not None else 0

    def validate(self, slots: "shm.StagedSlots", collector_incarnation: int) -> int:
        """Check the slots copied out of the ring (before release): stamps, then values.

        Returns the number of slots with non-finite values (0 when all is well); raises FeedFault
        for stamps no correct collector writes. Either way a non-zero result drops the collector.
        """
        n, first_seq = self.spec.num_envs, self.ring.read_cursor
        last_inc, last_step = self.last_incarnation, self.last_env_step
        for j in range(slots.k):
            s, where = slots.stamps(j), f"slot {first_seq + j}"
            if s.seq != first_seq + j:
                raise FeedFault(f"{where} is stamped seq {s.seq} (stale or duplicated data)")
            inc = s.incarnation
            if not 1 <= inc <= collector_incarnation or (last_inc is not None and inc < last_inc):
                raise FeedFault(f"{where} has incarnation {inc}; the collector is at {collector_incarnation}"
                                f"{'' if last_inc is None else f', the last slot had {last_inc}'}")
            if inc == last_inc and s.env_step != last_step + 1:
                raise FeedFault(f"{where} has env_step {s.env_step} after {last_step} (lost or repeated steps)")
            if not 0 <= s.num_final <= n:
                raise FeedFault(f"{where} has num_final {s.num_final}, outside 0..{n}")
            if not 0 <= s.weight_version <= self.snapshot_version:
                raise FeedFault(f"{where} was acted with weight version {s.weight_version}; only "
                                f"{self.snapshot_version} were published to it")
            done = slots.ended_envs(j)
            if s.num_final != done.size or (s.num_final and
                                            not np.array_equal(slots.final_rows(j)["final_idx"], done)):
                raise FeedFault(f"{where}: its final rows do not list exactly the envs whose episode ended")
            last_inc, last_step = inc, s.env_step
        if not slots.flags_are_binary():
            raise FeedFault("terminated/truncated flags other than 0/1")
        return int(slots.nonfinite().sum())

    def note_ingested(self, k: int, last_incarnation: int, last_env_step: int) -> None:
        self.ingested_slots += k
        self.last_incarnation, self.last_env_step = last_incarnation, last_env_step
        self.last_ingest_ns = time.monotonic_ns()

    def close(self) -> None:
        for seg in (self.ring, self.snapshot):
            if seg is not None:
                seg.close()
        self.ring = self.snapshot = None
