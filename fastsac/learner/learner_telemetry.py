"""What the async learner reports on top of fastsac.training.telemetry: per-collector rates, lags and
faults, and the status records in the control block (fastsac-launch --status).

perf/env_steps_per_s here is the sum over collectors of the increase of their env_steps
counters in the control block (written every env step) over the log window, so it is right at
any logging rate and any env speed; perf/ingest_env_steps_per_s is the learner's own rate.
"""
from __future__ import annotations

import time

import numpy as np

from fastsac import shm_layout as shm
from fastsac.training.telemetry import Telemetry

SNAPSHOT_STUCK_REPORT_S = 5.0   # a collector's snapshot unreadable this long is reported


class LearnerTelemetry(Telemetry):
    def __init__(self, cfg, ctl: "shm.ControlBlock", feeds, env_steps: int, num_updates: int, total_env_steps: int,
                 lineage=None):
        self.ctl, self.feeds = ctl, feeds
        self._produced = {f.cid: (0, 0) for f in feeds}   # (incarnation, env_steps) at the window start
        self._last_stats: dict[int, dict] = {}   # per collector: last consistent stats record
        self._stats_prev: dict[int, dict] = {}   # per collector: the record stage times are measured from
        self._stage_ms: dict[int, dict] = {}     # per collector: last computed stage times (ms/step)
        self._stuck_reported: set[int] = set()
        self._batches = 0.0
        super().__init__(cfg, env_steps, num_updates, total_env_steps, lineage=lineage)

    def start(self, env_steps: int) -> None:
        super().start(env_steps)
        self._batches = 0.0
        for f in self.feeds:
            self._produced[f.cid] = self._producer_count(f.cid)

    def add_batches(self, batches: float) -> None:
        self._batches += batches

    def _producer_count(self, cid: int) -> tuple[int, int]:
        rec = self.ctl.collector(cid)
        return rec["incarnation"], rec["env_steps"]

    def log(self, env_steps: int, num_updates: int, weight_version: int) -> None:
        dt = max(time.perf_counter() - self.window_start, 1e-9)
        scalars, rows, totals = self._collector_scalars(dt)
        fills = [f.fill() for f in self.feeds]
        max_lag = max((f.max_lag for f in self.feeds), default=0)
        scalars.update({
            "perf/env_steps_per_s": self.produced_per_s(scalars, dt),
            "perf/ingest_env_steps_per_s": (env_steps - self._env_steps) / dt,
            "async/policy_lag": max_lag, "async/ring_fill": float(np.mean(fills)) if fills else 0.0,
            "async/weight_version": weight_version,
            "async/utd": (num_updates - self._updates) / self._batches if self._batches else 0.0,
            "async/dropped_collectors": sum(f.dropped_incarnation is not None for f in self.feeds)})
        show_rows = len(self.feeds) > 1 or any(f.faults for f in self.feeds)
        out = super().log(env_steps, num_updates, totals, scalars,
                          line_extra=f"lag {max_lag} | ring {scalars['async/ring_fill']:.0%} | ",
                          rows=rows if show_rows else ())
        self.ctl.learner.update(updates_per_s=out["perf/updates_per_s"], learn_pct=out["perf/learn_pct"],
                                env_steps_per_s=out["perf/env_steps_per_s"],
                                ingest_env_steps_per_s=out["perf/ingest_env_steps_per_s"])
        self._batches = 0.0
        for f in self.feeds:
            f.max_lag = 0

    def produced_per_s(self, scalars: dict, dt: float) -> float:
        """perf/env_steps_per_s: the sum of this learner's collectors' rates (a group: the job's)."""
        return sum(scalars[f"collector{f.cid}/env_steps_per_s"] for f in self.feeds)

    def _collector_scalars(self, dt: float) -> tuple[dict, list[str], tuple[int, float, int]]:
        scalars: dict[str, float] = {}
        rows, totals = [], [0, 0.0, 0]
        stage_sums, stage_n = dict.fromkeys(shm.STAGES, 0.0), 0
        for feed in self.feeds:
            i, prefix = feed.cid, f"collector{feed.cid}/"
            inc, steps = self._producer_count(i)
            prev_inc, prev_steps = self._produced[i]
            # a restarted collector counts again from 0 in its new incarnation
            produced = steps - prev_steps if inc == prev_inc else steps
            self._produced[i] = (inc, steps)
            rate = max(produced, 0) / dt
            # None = being written right now: use the last good copy (totals must never go back)
            stats = self.ctl.read_collector_stats(i) or self._last_stats.get(i)
            self._last_stats[i] = stats
            if stats:
                totals[0] += stats["episodes"]
                totals[1] += stats["return_sum"]
                totals[2] += stats["length_sum"]
                self._stage_times(i, stats)
            for st, ms in self._stage_ms.get(i, {}).items():
                scalars[f"{prefix}{st}_ms"] = ms
                stage_sums[st] += ms
            stage_n += i in self._stage_ms
            stuck_s = self._snapshot_stuck_s(i)
            scalars.update({prefix + "env_steps_per_s": rate, prefix + "ring_fill": feed.fill(),
                            prefix + "policy_lag": feed.max_lag, prefix + "faults": feed.faults,
                            prefix + "rejected_slots": feed.rejected_slots, prefix + "snapshot_stuck_s": stuck_s})
            state = " | DROPPED" if feed.dropped_incarnation is not None else ""
            rows.append(f"   c{i}: {rate:,.0f} env-steps/s | lag {feed.max_lag} | ring {feed.fill():.0%}{state}")
        if stage_n:
            for st in shm.STAGES:
                scalars[f"perf/collector_{st}_ms"] = stage_sums[st] / stage_n
            scalars["perf/collect_ms_per_batch"] = sum(stage_sums[s] for s in shm.STAGES if s != "wait") / stage_n
        return scalars, rows, tuple(totals)

    def _stage_times(self, i: int, stats: dict) -> None:
        """Stage times per step over the steps since the last record that moved (the collector
        refreshes its record every STATS_INTERVAL_S; we may log more often)."""
        prev = self._stats_prev.get(i)
        if prev is None or stats["steps"] < prev["steps"]:   # first record, or a restarted collector
            self._stats_prev[i] = stats
        elif stats["steps"] > prev["steps"]:
            d = stats["steps"] - prev["steps"]
            self._stage_ms[i] = {st: (stats[f"{st}_ns"] - prev[f"{st}_ns"]) / d / 1e6 for st in shm.STAGES}
            self._stats_prev[i] = stats

    def _snapshot_stuck_s(self, i: int) -> float:
        since = self.ctl.collector(i)["snapshot_stuck_ns"]
        stuck_s = (time.monotonic_ns() - since) / 1e9 if since else 0.0
        if stuck_s >= SNAPSHOT_STUCK_REPORT_S and i not in self._stuck_reported:
            self._stuck_reported.add(i)
            self.metrics.line(f"   warning: collector {i} has not been able to load new weights for {stuck_s:.0f}s "
                              "(its snapshot looks corrupted; the next publish restores it)")
        elif not since:
            self._stuck_reported.discard(i)
        return stuck_s

    def refresh_status(self) -> None:
        """The learner's view of every collector for fastsac-launch --status (cadence set by the loop)."""
        for f in self.feeds:
            self.ctl.ingest(f.cid).update(
                ring_fill=f.ring.available() if f.ring is not None else 0, policy_lag=f.max_lag,
                ingested_slots=f.ingested_slots, ingested_env_steps=f.ingested_slots * f.spec.num_envs,
                last_ingest_ns=f.last_ingest_ns, attached=int(f.attached_once),
                dropped=int(f.dropped_incarnation is not None), rejected_slots=f.rejected_slots)

