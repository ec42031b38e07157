"""The learner's loop: ingest from every ring, update, publish, log, checkpoint.

Each collector owns a fixed block of env rows in the replay buffer and its ring is drained
on its own: a slow or stalled collector never holds back the others (no lockstep merge).
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time

import numpy as np
import torch

from fastsac import learner_core
from fastsac import shm_layout as shm
from fastsac.algo.policy_layout import policy_flat_numel
from fastsac.envs.registry import EnvSpec, make_env
from fastsac.episodes import EpisodeWindow
from fastsac.metrics import MetricsLogger, RateMeter, fmt, format_duration
from fastsac.process_setup import log, resolve_device

ROLE = "learner"
ATTACH_RETRY_S = 0.2   # how often missing rings/snapshots are looked for (collectors create them)
# Nothing to ingest and nothing to update: back off 50 us doubling to 2 ms. Spinning (or a fixed
# short sleep) costs a Python loop iteration each time: measured ~50% of a core, taken from the
# collectors when they share CPUs with the learner. 2 ms is far below a slot's production time.
IDLE_SLEEP_MIN_S, IDLE_SLEEP_MAX_S = 50e-6, 2e-3
_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.uint8): torch.uint8,
                 np.dtype(np.int64): torch.int64}


@contextlib.contextmanager
def heartbeat_while(record, timeout_s: float):
    """Keep record["heartbeat_ns"] fresh from a helper thread while the body runs.

    For work that is slow but not hung: a periodic checkpoint of large networks on a slow disk
    can take longer than heartbeat_timeout_s, and the supervisor would otherwise kill the learner
    mid-save. The field keeps its one writer (this process); the main thread does not beat
    while the body runs.
    """
    done = threading.Event()

    def beat() -> None:
        while True:
            record["heartbeat_ns"] = time.monotonic_ns()
            if done.wait(max(timeout_s / 4, 0.05)):
                return

    beater = threading.Thread(target=beat, name="heartbeat", daemon=True)
    beater.start()
    try:
        yield
    finally:
        done.set()
        beater.join()


class CollectorFeed:
    """The learner's end of one collector: its ring (consumer), its snapshot (writer) and a
    reusable packed staging buffer with the ring's slot layout, so k slots go to the device
    in ONE host->device copy (pinned memory on CUDA)."""

    def __init__(self, job: str, cid: int, env_first: int, env_count: int, spec: "shm.RingSpec",
                 numel: int, device: torch.device, max_slots: int):
        self.job, self.cid, self.spec, self.numel = job, cid, spec, numel
        self.rows = slice(env_first, env_first + env_count)
        self.device = device
        self.ring: shm.TransitionRing | None = None
        self.snapshot: shm.WeightSnapshot | None = None
        self.max_slots = max_slots
        cuda = device.type == "cuda"
        nbytes = spec.slot_nbytes
        self.host = torch.empty((max_slots, nbytes), dtype=torch.uint8, pin_memory=cuda)
        self.dev = torch.empty((max_slots, nbytes), dtype=torch.uint8, device=device) if cuda else self.host
        self.copy_done = torch.cuda.Event() if cuda else None
        self.host_np = self.host.numpy()  # the staging buffer TransitionRing.copy_out fills
        self.dev_views = {}    # field: device tensor [max_slots, *shape]
        for f in spec.slot_fields():
            if f.name != "header":  # header values travel as python ints
                self.dev_views[f.name] = (self.dev[:, f.offset:f.offset + f.nbytes].view(_TORCH_DTYPES[f.dtype])
                                          .unflatten(1, f.shape))
        self.last_incarnation = None
        self.last_slot_version = 0
        self.ingested_slots = 0
        self.max_lag = 0

    def try_attach(self) -> bool:
        """Attach ring and snapshot once the collector created them; True on a new attachment."""
        if self.ring is not None and self.snapshot is not None:
            return False
        if self.ring is None:
            if not shm.segment_exists(shm.ring_name(self.job, self.cid)):
                return False
            self.ring = shm.TransitionRing.attach(self.job, self.cid, self.spec, role="consumer")
        if self.snapshot is None:
            if not shm.segment_exists(shm.wts_name(self.job, self.cid)):
                return False
            self.snapshot = shm.WeightSnapshot.attach(self.job, self.cid, self.numel, role="writer")
        return True

    def fill(self) -> float:
        return self.ring.available() / self.spec.capacity if self.ring is not None else 0.0

    def stage(self, max_slots: int) -> list[tuple[int, int, int]]:
        """Copy up to max_slots ready slots into staging and send them to the device.

        Returns per slot (num_final, weight_version, incarnation). The ring's read cursor is
        released only after the data is out of shared memory.
        """
        if self.ring is None or self.ring.available() == 0:
            return []
        if self.copy_done is not None:
            self.copy_done.synchronize()  # the previous host->device copy must be done before we overwrite
        # the dense part of all k slots in <= 2 strided copies, of the sparse part only num_final rows
        k = self.ring.copy_out(self.host_np, min(max_slots, self.max_slots))
        hdr = shm.staged_headers(self.host_np, k)
        meta = [(int(h[shm.HDR["num_final"]]), int(h[shm.HDR["weight_version"]]), int(h[shm.HDR["incarnation"]]))
                for h in hdr]
        self.ring.release(k)
        if self.copy_done is not None:
            self.dev[:k].copy_(self.host[:k], non_blocking=True)
            self.copy_done.record()
        return meta

    def slot(self, j: int, nf: int) -> dict:
        d = self.dev_views
        return {"obs": d["obs"][j], "critic_obs": d["critic_obs"][j] if "critic_obs" in d else None,
                "actions": d["actions"][j], "rewards": d["rewards"][j],
                "terminated": d["terminated"][j].bool(), "truncated": d["truncated"][j].bool(),
                "final_idx": d["final_idx"][j, :nf], "final_obs": d["final_obs"][j, :nf],
                "final_critic_obs": d["final_critic_obs"][j, :nf] if "final_critic_obs" in d else None}

    def close(self) -> None:
        for seg in (self.ring, self.snapshot):
            if seg is not None:
                seg.close()


class Learner:
    def __init__(self, ctx):
        cfg = self.cfg = ctx.cfg
        self.ao = cfg.trainer.async_options
        self.ctl = shm.ControlBlock.attach(cfg.job_name, role="learner", num_collectors=self.ao.num_collectors)
        probe = make_env(cfg.env.name, 1, seed=cfg.seed, max_episode_steps=cfg.env.max_episode_steps)
        self.spec = EnvSpec(probe.obs_dim, probe.critic_obs_dim, probe.act_dim, probe.max_episode_steps)
        low, high = probe.action_low, probe.action_high
        probe.close()
        self.device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        self.agent, self.buffer = learner_core.build_agent(cfg, self.spec, low, high, self.device)
        self.env_steps = learner_core.restore(cfg, self.spec, self.agent, lambda m: log(ROLE, m))
        self.start_env_steps = self.env_steps
        self.total_env_steps = cfg.trainer.num_iterations * cfg.env.num_envs
        numel = policy_flat_numel(self.spec.obs_dim, self.spec.act_dim, cfg.algo)
        self.feeds = [CollectorFeed(cfg.job_name, c.collector_id, c.env_first, c.env_count,
                                    shm.RingSpec(num_envs=c.env_count, obs_dim=self.spec.obs_dim,
                                                 critic_obs_dim=self.spec.critic_obs_dim,
                                                 act_dim=self.spec.act_dim, capacity=self.ao.ring_capacity),
                                    numel, self.device, self.ao.max_ingest_per_iter)
                      for c in ctx.plan.collectors]
        cfg.run_path.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsLogger(cfg.run_path, cfg.logging.tensorboard, cfg.logging.console)
        # RUNNING (and the first heartbeat) only once set up: from here on the heartbeat is checked.
        self.ctl.learner.update(pid=os.getpid(), env_steps=self.env_steps, num_updates=self.agent.num_updates_done,
                                started_ns=time.monotonic_ns(), heartbeat_ns=time.monotonic_ns(),
                                state=int(shm.ProcState.RUNNING))
        # torch.compile runs inside the first critic and first actor update (CUDA, algo.compile) and can
        # take longer than heartbeat_timeout_s: the learner reports STARTING until they are done, so
        # neither the collectors nor the launcher mistake the compilation for a hang.
        self.compile_updates_left = cfg.algo.policy_frequency if getattr(self.agent, "compiled", False) else 0
        self.weight_version = 0
        self.updates_owed = 0.0
        self.updates_since_publish = 0
        self.last_train: dict = {}
        self._last_stats: dict[int, dict] = {}   # per collector: last consistent stats record
        self._stage_ms: dict[int, dict] = {}     # per collector: last computed stage times (ms/step)
        log(ROLE, f"{cfg.env.name}: {cfg.env.num_envs} envs in {len(self.feeds)} collector(s), device {self.device}, "
                  f"utd_mode {self.ao.utd_mode}, env steps {self.env_steps:,}/{self.total_env_steps:,}")

    # ------------------------------------------------------------------ weights
    def publish(self, feeds=None) -> None:
        """Broadcast: flatten + device->host ONCE, then a non-blocking seqlock write per collector."""
        flat = self.agent.policy_flat().detach().to("cpu", torch.float32).numpy()
        for feed in feeds if feeds is not None else self.feeds:
            if feed.snapshot is not None:
                feed.snapshot.publish(flat)
        self.weight_version += 1
        self.updates_since_publish = 0
        self.ctl.learner["weight_version"] = self.weight_version

    # ------------------------------------------------------------------ ingestion
    def ingest(self) -> tuple[int, int]:
        """Drain ready slots from every ring (fair share of max_ingest_per_iter); returns (slots, env steps)."""
        budget = self.ao.max_ingest_per_iter
        remaining = self.total_env_steps - self.env_steps  # never ingest past the run length
        ready = [f for f in self.feeds if f.ring is not None and f.ring.available() > 0]
        slots = transitions = 0
        for i, feed in enumerate(ready):
            share = max(1, budget // (len(ready) - i))
            share = min(share, max(1, math.ceil((remaining - transitions) / feed.spec.num_envs)))
            metas = feed.stage(share)
            budget -= len(metas)
            for j, (nf, version, incarnation) in enumerate(metas):
                if feed.last_incarnation is not None and incarnation != feed.last_incarnation:
                    # A restarted collector: the previous incarnation's newest transition has no
                    # successor and never will; forget it instead of bootstrapping from garbage.
                    self.buffer.drop_newest(feed.rows)
                    log(ROLE, f"collector {feed.cid}: new incarnation {incarnation}")
                feed.last_incarnation = incarnation
                feed.max_lag = max(feed.max_lag, self._snapshot_version(feed) - version)
                s = feed.slot(j, nf)
                learner_core.ingest(self.agent, self.buffer, feed.rows, s["obs"], s["critic_obs"], s["actions"],
                                    s["rewards"], s["terminated"], s["truncated"], s["final_idx"],
                                    s["final_obs"], s["final_critic_obs"])
            feed.ingested_slots += len(metas)
            slots += len(metas)
            transitions += len(metas) * feed.spec.num_envs
            if budget <= 0 or transitions >= remaining:
                break
        return slots, transitions

    @staticmethod
    def _snapshot_version(feed: CollectorFeed) -> int:
        return feed.snapshot.version if feed.snapshot is not None else 0

    # ------------------------------------------------------------------ updates
    def updates_to_run(self, transitions: int) -> int:
        cfg = self.cfg
        if cfg.algo.num_updates == 0 or not self.buffer.ready():
            return 0
        if self.env_steps < cfg.algo.learning_starts * cfg.env.num_envs:
            return 0
        # strict: num_updates per env-step batch of num_envs transitions, exactly as the sync trainer.
        self.updates_owed += cfg.algo.num_updates * transitions / cfg.env.num_envs
        k = int(self.updates_owed)
        self.updates_owed -= k
        if self.ao.utd_mode == "learner_bound" and k == 0 and transitions == 0:
            k = cfg.algo.num_updates  # no new data: keep the GPU busy on the buffer we have
        return k

    # ------------------------------------------------------------------ main loop
    def run(self, stop: dict) -> int:
        cfg = self.cfg
        num_envs = cfg.env.num_envs
        window = EpisodeWindow()
        collector_rates = {f.cid: RateMeter(0) for f in self.feeds}
        collector_prev = {f.cid: None for f in self.feeds}
        ingest_rate, updates_rate = RateMeter(self.env_steps), RateMeter(self.agent.num_updates_done)
        learn_time = 0.0
        window_start = last_log = last_attach = last_liveness = time.perf_counter()
        run_start, window_updates, window_batches = time.perf_counter(), 0, 0.0
        next_ckpt_it = self._next_multiple(cfg.checkpoint.interval)
        next_log_it = self._next_multiple(cfg.logging.interval)
        exit_code, reason = 0, "finished"
        idle_sleep = 0.0
        while self.env_steps < self.total_env_steps:
            if stop["signal"] is not None or self.ctl.stop_requested():
                reason = f"stop requested ({'signal ' + str(stop['signal']) if stop['signal'] else 'launcher'})"
                break
            now = time.perf_counter()
            self.ctl.learner["heartbeat_ns"] = time.monotonic_ns()
            if now - last_liveness >= 0.5:
                last_liveness = now
                if not shm.job_is_alive(cfg.job_name):
                    reason, exit_code = "the launcher is gone (its lock on the control segment was released)", 1
                    break
            if now - last_attach >= ATTACH_RETRY_S:
                last_attach = now
                fresh = [f for f in self.feeds if f.try_attach()]
                if fresh:
                    self.publish(fresh)  # initial weights for a collector that just appeared
            slots, transitions = self.ingest()
            self.env_steps += transitions
            k = self.updates_to_run(transitions)
            updated = k > 0
            if cfg.algo.num_updates == 0 and slots:
                # Collect-only runs still exercise the broadcast: one "update" per ingested slot.
                self.updates_since_publish += slots
                if self.updates_since_publish >= self.ao.weight_publish_interval:
                    self.publish()
            while k > 0:
                # Chunks of at most weight_publish_interval updates: weights go out on time and
                # the heartbeat keeps beating through a long backlog of owed updates.
                chunk = min(k, self.ao.weight_publish_interval - self.updates_since_publish)
                if self.compile_updates_left > 0 and self.ctl.learner["state"] == shm.ProcState.RUNNING:
                    log(ROLE, "compiling the update (torch.compile): state STARTING, no heartbeat until done")
                    self.ctl.learner["state"] = int(shm.ProcState.STARTING)
                    self.compile_t0 = time.perf_counter()
                t0 = time.perf_counter()
                self.last_train = self.agent.train(self.buffer, chunk)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                learn_time += time.perf_counter() - t0
                if self.compile_updates_left > 0:
                    self.compile_updates_left -= chunk
                    if self.compile_updates_left <= 0:
                        log(ROLE, f"update compiled in {time.perf_counter() - self.compile_t0:.1f}s")
                        self.ctl.learner["heartbeat_ns"] = time.monotonic_ns()  # fresh beat before RUNNING
                        self.ctl.learner["state"] = int(shm.ProcState.RUNNING)
                k -= chunk
                self.updates_since_publish += chunk
                window_updates += chunk
                if self.updates_since_publish >= self.ao.weight_publish_interval:
                    self.publish()
                self.ctl.learner["heartbeat_ns"] = time.monotonic_ns()
            window_batches += transitions / num_envs
            if not slots and not updated:
                idle_sleep = min(max(idle_sleep * 2, IDLE_SLEEP_MIN_S), IDLE_SLEEP_MAX_S)
                time.sleep(idle_sleep)
            else:
                idle_sleep = 0.0
            self.ctl.learner.update(env_steps=self.env_steps, num_updates=self.agent.num_updates_done)
            it = self.env_steps // num_envs
            now = time.perf_counter()
            if it >= next_log_it or now - last_log >= cfg.logging.interval_s:
                next_log_it = self._next_multiple(cfg.logging.interval)
                dt = max(now - window_start, 1e-9)
                self._log(window, collector_rates, collector_prev, ingest_rate, updates_rate,
                          100.0 * learn_time / dt, window_updates / max(window_batches, 1e-9), run_start)
                learn_time, window_start, last_log, window_updates, window_batches = 0.0, now, now, 0, 0.0
            if cfg.checkpoint.interval and it >= next_ckpt_it and self.env_steps < self.total_env_steps:
                next_ckpt_it = self._next_multiple(cfg.checkpoint.interval)
                with heartbeat_while(self.ctl.learner, self.ao.heartbeat_timeout_s):
                    learner_core.save(cfg, self.spec, self.agent, self.env_steps)
        self.ctl.learner["state"] = int(shm.ProcState.STOPPING)  # no heartbeat while the final checkpoint is written
        path = learner_core.save(cfg, self.spec, self.agent, self.env_steps)
        log(ROLE, f"{reason}: final checkpoint {path} at env step {self.env_steps:,}")
        self.ctl.learner["state"] = int(shm.ProcState.FINISHED if exit_code == 0 else shm.ProcState.FAILED)
        return exit_code

    def _next_multiple(self, interval: int) -> int:
        it = self.env_steps // self.cfg.env.num_envs
        return (it // interval + 1) * interval if interval else math.inf

    def _log(self, window, collector_rates, collector_prev, ingest_rate, updates_rate,
             learn_pct, utd, run_start) -> None:
        cfg = self.cfg
        scalars: dict[str, float] = {}
        totals = [0, 0.0, 0]
        sum_rate, stage_sums, stage_n, rows = 0.0, dict.fromkeys(shm.STAGES, 0.0), 0, []
        max_lag, fills = 0, []
        for feed in self.feeds:
            i = feed.cid
            # None = being written right now: use the last good copy (totals must never go back)
            stats = self.ctl.read_collector_stats(i) or self._last_stats.get(i)
            self._last_stats[i] = stats
            fill = feed.fill()
            fills.append(fill)
            max_lag = max(max_lag, feed.max_lag)
            prefix = f"collector{i}/"
            scalars[prefix + "ring_fill"] = fill
            scalars[prefix + "policy_lag"] = feed.max_lag
            self.ctl.ingest(i).update(ring_fill=feed.ring.available() if feed.ring else 0, policy_lag=feed.max_lag,
                                      ingested_slots=feed.ingested_slots,
                                      ingested_env_steps=feed.ingested_slots * feed.spec.num_envs)
            rate = float("nan")
            if stats:
                totals[0] += stats["episodes"]
                totals[1] += stats["return_sum"]
                totals[2] += stats["length_sum"]
                rate = collector_rates[i].rate(stats["steps"] * feed.spec.num_envs)
                prev = collector_prev[i]
                if prev is None or stats["steps"] > prev["steps"]:
                    # stage times per step over the steps since the last record that moved (the
                    # collector refreshes its record every STATS_INTERVAL_S, we may log more often)
                    if prev is not None:
                        d = stats["steps"] - prev["steps"]
                        self._stage_ms[i] = {st: (stats[f"{st}_ns"] - prev[f"{st}_ns"]) / d / 1e6 for st in shm.STAGES}
                    collector_prev[i] = stats
                if i in self._stage_ms:
                    for st, ms in self._stage_ms[i].items():
                        scalars[f"{prefix}{st}_ms"] = ms
                        stage_sums[st] += ms
                    stage_n += 1
                if prev is not None:
                    scalars[prefix + "env_steps_per_s"] = rate
                    sum_rate += rate
            rows.append(f"   c{i}: {fmt(rate, ',.0f')} env-steps/s | lag {feed.max_lag} | ring {fill:.0%}")
            feed.max_lag = 0
        window.take(*totals)
        ups = updates_rate.rate(self.agent.num_updates_done)
        ingest = ingest_rate.rate(self.env_steps)
        scalars.update({"rollout/mean_return": window.mean_return, "rollout/mean_ep_len": window.mean_length,
                        "perf/env_steps_per_s": sum_rate if sum_rate > 0 else ingest,
                        "perf/ingest_env_steps_per_s": ingest,
                        "perf/updates_per_s": ups, "perf/learn_pct": learn_pct,
                        "async/policy_lag": max_lag, "async/ring_fill": float(np.mean(fills)) if fills else 0.0,
                        "async/weight_version": self.weight_version, "async/utd": utd})
        if stage_n:
            for st in shm.STAGES:
                scalars[f"perf/collector_{st}_ms"] = stage_sums[st] / stage_n
            scalars["perf/collect_ms_per_batch"] = sum(stage_sums[s] for s in shm.STAGES if s != "wait") / stage_n
        scalars.update({f"train/{k}": float(v) for k, v in self.last_train.items()})
        self.metrics.scalars(self.env_steps, scalars)
        self.ctl.learner.update(updates_per_s=ups, learn_pct=learn_pct, env_steps_per_s=scalars["perf/env_steps_per_s"])
        done = self.env_steps - self.start_env_steps
        eta = (time.perf_counter() - run_start) / done * (self.total_env_steps - self.env_steps) if done else math.inf
        it = self.env_steps // cfg.env.num_envs
        self.metrics.line(
            f"[{it}/{cfg.trainer.num_iterations}] {self.env_steps:,} steps | "
            f"{scalars['perf/env_steps_per_s']:,.0f} env-steps/s | {ups:.1f} upd/s | learn {learn_pct:.0f}% | "
            f"lag {max_lag} | ring {scalars['async/ring_fill']:.0%} | return {fmt(window.mean_return)} | "
            f"ETA {format_duration(eta)}")
        if len(self.feeds) > 1:
            for row in rows:
                self.metrics.line(row)

    def close(self) -> None:
        self.metrics.close()
        for feed in self.feeds:
            feed.close()
        self.ctl.close()
