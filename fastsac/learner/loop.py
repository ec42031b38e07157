"""The learner's loop: attach, ingest from every ring, update, publish, status, log, checkpoint.

Each collector owns a fixed block of env rows in the replay buffer and its ring is drained
on its own: a slow or stalled collector never holds back the others (no lockstep merge), and
a faulty one is dropped without taking the job down (fastsac.learner.feed).

One loop for a learner alone and for a rank of a learner group: what it agrees with the rest of
its job (start state, ingest quota, counts, stop) it asks its coordination
(fastsac.learner.coordination). Its construction is a row of small builders, each making one part.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from fastsac import shm_layout as shm
from fastsac.common.pacing import IdleBackoff, beating_while
from fastsac.common.seeds import learner_torch_seed
from fastsac.common.stopping import StopSignal
from fastsac.envs.registry import EnvSpec, make_env
from fastsac.learner.coordination import ATTACH_RETRY_S, ROLE, SoloCoordination, Verdict
from fastsac.learner.eval_link import LearnerEval
from fastsac.learner.feed import CollectorFeed, FeedFault
from fastsac.learner.gpu_sync import ChunkTimer, WeightCopy
from fastsac.learner.staging import IngestStaging
from fastsac.process.setup import log
from fastsac.process.torch_runtime import open_device
from fastsac.shm_layout.job_settings import check_against_job
from fastsac.shm_layout.policy_layout import policy_flat_numel
from fastsac.training import state as run_state
from fastsac.training.schedule import RunSchedule
from fastsac.training.thread_tuner import ThreadTuner

STATUS_INTERVAL_S = 0.5  # the control block's status records (fastsac-launch --status) refresh cadence
WAIT_REPORT_S = 10.0     # how often the console repeats which collectors the job still waits for


def update_thread_range(me, collectors, planned: int) -> tuple[int, int]:
    """(the update's planned threads, the most it may try): its own, plus the threads of the
    collectors it feeds from that run on CPUs it may run on too (binding off, or a shared node):
    a collector blocked on a full ring leaves them idle, and the tuner keeps the extra threads
    only while they make the updates faster (a busy collector makes them slower)."""
    mine = set(me.cpus)
    idle = sum(c.threads for c in collectors if set(c.cpus) <= mine)
    return planned, min(len(mine), planned + idle) if mine else planned


def own_collectors(ctx) -> list:
    """This learner's collectors: it drains their rings, writes their ingest records and holds
    only their env rows (all collectors with one learner)."""
    return [c for c in ctx.plan.collectors if c.learner_index == ctx.me.learner_index]


def attach_control(ctx, mine: list) -> "shm.ControlBlock":
    """The job's control block, as this learner, checked against the job's settings."""
    cfg = ctx.cfg
    ctl = shm.ControlBlock.attach(cfg.job_name, role="learner", num_collectors=cfg.trainer.async_options.num_collectors,
                                  learner_index=ctx.me.learner_index, ingest_ids=[c.collector_id for c in mine],
                                  num_learners=len(ctx.plan.learners))
    check_against_job(ctl, cfg, ctx.plan, "this learner")
    return ctl


def probe_env(cfg) -> tuple[EnvSpec, object, object]:
    """The task's spec and action bounds, from one env made and closed."""
    probe = make_env(cfg.env.name, 1, seed=cfg.seed, max_episode_steps=cfg.env.max_episode_steps)
    spec = EnvSpec(probe.obs_dim, probe.critic_obs_dim, probe.act_dim, probe.max_episode_steps)
    low, high = probe.action_low, probe.action_high
    probe.close()
    return spec, low, high


def thread_tuner(ctx, mine: list, device, agent) -> ThreadTuner | None:
    """On the CPU the update's thread count is measured, not assumed (fastsac.training.thread_tuner),
    between its own CPUs and those its collectors leave idle while they wait on a full ring."""
    planned, most = update_thread_range(ctx.me, mine, torch.get_num_threads())
    if device.type != "cpu" or most <= 1:
        return None
    return ThreadTuner(most, agent.set_threads, log=lambda m: log(ROLE, m), fewest=planned)


def collector_feeds(cfg, spec: EnvSpec, mine: list, numel: int) -> list[CollectorFeed]:
    """One feed per collector, each over its own block of this learner's replay rows."""
    rows = [sum(c.env_count for c in mine[:j]) for j in range(len(mine))]   # its rows in this buffer
    return [CollectorFeed(cfg.job_name, c.collector_id, first, c.env_count, shm.job_ring_spec(cfg, spec, c.env_count),
                          numel) for c, first in zip(mine, rows)]


def announce_running(ctl: "shm.ControlBlock", me, device, agent, env_steps: int) -> None:
    """RUNNING (and the first heartbeat) only once set up: from here on the heartbeat is checked.
    start_env_steps first: collectors derive their envs' reset seed from it (a resumed run)."""
    path = shm.UpdatePath.COMPILING if agent.compiled else shm.UpdatePath.EAGER
    ctl.learner.update(global_rank=me.global_rank, device=str(device)[:16], update_path=int(path))
    ctl.learner.update(pid=os.getpid(), env_steps=env_steps, start_env_steps=env_steps,
                       num_updates=agent.num_updates_done, started_ns=time.monotonic_ns(),
                       heartbeat_ns=time.monotonic_ns(), state=int(shm.ProcState.RUNNING))


class Learner:
    """The learner's loop over its own collectors. `coordination` decides what the rest of the job
    must agree on: SoloCoordination (the default) for the one learner of a job, GroupCoordination
    (fastsac.learner.group_coordination) for a rank of a learner group."""

    def __init__(self, ctx, coordination=None):
        cfg = self.cfg = ctx.cfg
        self.ao = cfg.trainer.async_options
        self.coord = coordination or SoloCoordination()   # alone, or a rank of a learner group
        self.idle_backoff = IdleBackoff()
        self.plan, self.me = ctx.plan, ctx.me
        mine = own_collectors(ctx)
        self.ctl = attach_control(ctx, mine)
        self.spec, low, high = probe_env(cfg)
        # the plan's concrete device, made current before any other CUDA call; logged with torch,
        # CUDA, driver, GPU name and compute capability
        self.device = open_device(ctx.me.device, tf32=cfg.algo.tf32, log=lambda m: log(ROLE, m))
        torch.manual_seed(learner_torch_seed(cfg.seed))
        self.agent, self.buffer = run_state.build_agent(cfg, self.spec, low, high, self.device,
                                                        num_envs=sum(c.env_count for c in mine))
        self.threads = thread_tuner(ctx, mine, self.device, self.agent)
        start = self.coord.start(ctx, self.spec, self.agent, self.buffer, self.ctl, self.device)
        self.env_steps = self.start_env_steps = start.env_steps
        self.batch_envs = start.batch_envs
        self.total_env_steps = start.total_env_steps
        self.writes_checkpoints = start.writes_checkpoints
        self.schedule = RunSchedule(cfg.checkpoint.interval, self.batch_envs, self.total_env_steps, self.env_steps)
        numel = policy_flat_numel(self.spec.obs_dim, self.spec.act_dim, cfg.algo)
        self.feeds = collector_feeds(cfg, self.spec, mine, numel)
        self.staging = IngestStaging([f.spec for f in self.feeds], self.ao.max_ingest_per_iter, self.device)
        self.chunk_timer = ChunkTimer(self.device)
        self.weights = WeightCopy(numel, self.device)
        self.publish_to: list[CollectorFeed] | None = None   # the feeds of the copy in flight
        cfg.run_path.mkdir(parents=True, exist_ok=True)
        self.telemetry = self.coord.telemetry(cfg, self.ctl, self.feeds, self.agent.num_updates_done)
        self.telemetry.episode_steps = self.spec.max_episode_steps
        self.evaluation = LearnerEval(cfg, self.ctl.incarnation, numel, self.env_steps, self.telemetry,
                                      lambda m: log(ROLE, m))   # eval.*: the evaluator process's weights and results
        if not self.writes_checkpoints:
            self.evaluation.enabled = False   # the job's evaluator is rank 0's: it logs the results
        announce_running(self.ctl, ctx.me, self.device, self.agent, self.env_steps)
        # torch.compile runs inside the first critic and first actor update (CUDA, algo.compile) and can
        # take longer than heartbeat_timeout_s: the learner reports STARTING until they are done, so
        # neither the collectors nor the launcher mistake the compilation for a hang.
        self.compile_updates_left = cfg.algo.policy_frequency if self.agent.compiled else 0
        self.compile_t0 = 0.0
        self.weight_version = 0
        self.updates_owed = 0.0
        self.updates_since_publish = 0
        self.last_attach = self.last_status = self.last_liveness = 0.0
        self.exit_code = 0
        self.stop_signal = StopSignal()   # the process's own, from run()
        log(ROLE, f"{cfg.env.name}: {self.buffer.num_envs} envs in {len(self.feeds)} collector(s), device {self.device}, "
                  f"utd_mode {self.ao.utd_mode}, env steps {self.env_steps:,}/{self.total_env_steps:,}")

    # ------------------------------------------------------------------ collectors
    def attach_collectors(self) -> None:
        """Attach rings/snapshots of collectors that appeared and send them the current weights."""
        fresh = []
        for feed in self.feeds:
            rec = self.ctl.collector(feed.cid)
            if feed.dropped_incarnation is not None and rec["state"] != shm.ProcState.RUNNING:
                continue   # a dropped collector's next incarnation is running once it replaced its ring
            was_dropped = feed.dropped_incarnation is not None
            try:
                if not feed.try_attach(rec["incarnation"]):
                    continue
            except FeedFault as exc:
                self.drop(feed, f"cannot attach its segments: {exc}")
                continue
            if was_dropped:
                log(ROLE, f"collector {feed.cid}: re-attached (incarnation {rec['incarnation']})")
            fresh.append(feed)
        if fresh:
            self.publish(fresh)   # initial weights for a collector that just appeared

    def drop(self, feed: CollectorFeed, reason: str) -> None:
        """Stop training on a faulty collector; the job goes on (the launcher restarts it)."""
        incarnation = self.ctl.collector(feed.cid)["incarnation"]
        if feed.last_incarnation is not None:
            self.buffer.drop_newest(feed.rows)   # its newest transition will never get a successor
        feed.drop(incarnation)
        who = "the launcher restarts it" if not self.plan.collectors[feed.cid].manual else \
            f"restart it by hand: {self.plan.collectors[feed.cid].command}"
        log(ROLE, f"collector {feed.cid} dropped (fault {feed.faults}): {reason}; none of its data after the last "
                  f"good slot is trained on; {who}")
        self.ctl.ingest(feed.cid).update(dropped=1, dropped_incarnation=incarnation, faults=feed.faults,
                                         rejected_slots=feed.rejected_slots, fault=reason[:40])

    def waiting_for(self) -> list[CollectorFeed]:
        return [f for f in self.feeds if not f.attached_once]

    def attach_round(self, start: float, last_report: float) -> tuple[list[CollectorFeed], float, float]:
        """One round of waiting: beat, attach who appeared, publish the waiting mask and status, and
        name the missing collectors now and then. (missing, now, last_report)."""
        self.beat()
        self.attach_collectors()
        missing = self.waiting_for()
        self.ctl.learner["waiting_mask"] = sum(1 << f.cid for f in missing)
        self.telemetry.refresh_status()
        now = time.monotonic()
        if missing and (now - last_report >= WAIT_REPORT_S or last_report == start):
            last_report = now + (1e-9 if last_report == start else 0.0)
            for f in missing:
                c = self.plan.collectors[f.cid]
                how = f"start it by hand: {c.command}" if c.manual else "the launcher starts it"
                log(ROLE, f"waiting for collector {f.cid} ({how})")
        return missing, now, last_report

    def wait_for_collectors(self) -> Verdict | None:
        """Hold the job until every planned collector (manual ones included; a group: of every
        learner) attached once, as the coordination decides; a Verdict when the learner stops meanwhile.

        No env step counts and no update runs before: a job whose collector is started by hand
        must not reach its budget on the others alone.
        """
        verdict = self.coord.wait_for_collectors(self.waiting_for, self.attach_round, self.own_stop,
                                                 self.ao.collector_wait_s)
        if verdict is None:
            self.ctl.learner["waiting_mask"] = 0
        elif verdict.failed:
            self.exit_code = 1
        return verdict

    # ------------------------------------------------------------------ weights
    def publish(self, feeds=None) -> None:
        """Broadcast: flatten + ONE device->host copy into pinned memory (non-blocking on CUDA: the
        next update is queued behind it), then, once it landed (deliver), a non-blocking seqlock
        write per collector. A copy still in flight is delivered first."""
        self.deliver(wait=True)
        self.weights.start(self.agent.policy_flat())
        self.publish_to = list(feeds) if feeds is not None else self.feeds
        self.updates_since_publish = 0
        self.deliver(wait=not self.weights.cuda)   # on the CPU the copy is done: deliver now

    def deliver(self, wait: bool = False) -> None:
        """Write the landed weights to every snapshot of the publish (and the evaluator's)."""
        if self.publish_to is None or not (wait or self.weights.ready()):
            return
        flat, feeds, self.publish_to = self.weights.take(), self.publish_to, None
        for feed in feeds:
            if feed.snapshot is not None:
                repairs = feed.snapshot.repairs
                feed.snapshot.publish(flat)
                if feed.snapshot.repairs != repairs:
                    log(ROLE, f"collector {feed.cid}: its weight snapshot's seq was changed by another process; "
                              "restored a consistent snapshot")
                    self.ctl.ingest(feed.cid)["snapshot_repairs"] = feed.snapshot.repairs
        self.weight_version += 1
        self.evaluation.on_publish(flat, self.env_steps, self.weight_version)
        self.ctl.learner["weight_version"] = self.weight_version

    # ------------------------------------------------------------------ ingestion
    def ingest(self) -> tuple[int, int]:
        """Drain ready slots from every ring (fair share of max_ingest_per_iter) into ONE staging
        buffer, ONE host->device copy, then the replay buffer; returns (slots, env steps)."""
        ready = []
        for feed in self.feeds:
            try:
                if feed.available():
                    ready.append(feed)
            except FeedFault as exc:
                self.drop(feed, str(exc))
        budget = self.ao.max_ingest_per_iter
        remaining = self.coord.quota(self.env_steps)  # never ingest past the run length (a group: its share)
        if remaining <= 0:   # a learner of a group that ingested its share waits for the others
            return 0, 0
        runs, transitions = [], 0
        self.staging.begin()
        for i, feed in enumerate(ready):
            share = max(1, budget // (len(ready) - i))
            share = min(share, max(1, math.ceil((remaining - transitions) / feed.spec.num_envs)))
            run = self.staging.take(feed, share)
            try:
                bad = feed.validate(run.slots, self.ctl.collector(feed.cid)["incarnation"])
                reason = f"{bad} of {run.k} slot(s) hold NaN/inf values" if bad else None
            except FeedFault as exc:
                reason = str(exc)
            if reason:
                feed.rejected_slots += run.k
                self.staging.rewind(run)
                self.drop(feed, reason)
                continue
            feed.ring.release(run.k)    # the data is out of shared memory
            runs.append(run)
            budget -= run.k
            transitions += run.k * feed.spec.num_envs
            if budget <= 0 or transitions >= remaining:
                break
        self.staging.send()
        for run in runs:
            self.extend(run)
        return sum(r.k for r in runs), transitions

    def extend(self, run) -> None:
        feed = run.feed
        for j, s in enumerate(self.staging.slots(run)):
            stamps = run.slots.stamps(j)
            incarnation = stamps.incarnation
            if feed.last_incarnation is not None and incarnation != feed.last_incarnation:
                # A restarted collector: the previous incarnation's newest transition has no
                # successor and never will; forget it instead of bootstrapping from garbage.
                self.buffer.drop_newest(feed.rows)
                log(ROLE, f"collector {feed.cid}: new incarnation {incarnation}")
            feed.last_incarnation = incarnation
            feed.max_lag = max(feed.max_lag, feed.snapshot_version - stamps.weight_version)
            run_state.ingest(self.agent, self.buffer, feed.rows, s)
        last = run.slots.stamps(-1)
        feed.note_ingested(run.k, last.incarnation, last.env_step)

    # ------------------------------------------------------------------ updates
    def updates_to_run(self, transitions: int) -> int:
        cfg = self.cfg
        if cfg.algo.num_updates == 0 or not self.coord.buffer_ready(self.buffer):
            return 0
        if self.env_steps < cfg.algo.learning_starts * self.batch_envs:
            return 0
        # strict: num_updates per env-step batch of num_envs transitions, exactly as the sync trainer.
        self.updates_owed += cfg.algo.num_updates * transitions / self.batch_envs
        k = int(self.updates_owed)
        self.updates_owed -= k
        if self.ao.utd_mode == "learner_bound" and k == 0 and transitions == 0:
            k = cfg.algo.num_updates  # no new data: keep the GPU busy on the buffer we have
        return k

    def update(self, k: int) -> None:
        """k gradient updates in chunks of at most weight_publish_interval: weights go out on time
        and the heartbeat keeps beating through a long backlog of owed updates."""
        while k > 0:
            chunk = min(k, self.ao.weight_publish_interval - self.updates_since_publish)
            if self.compile_updates_left > 0 and self.ctl.learner["state"] == shm.ProcState.RUNNING:
                log(ROLE, "compiling the update (torch.compile): state STARTING, no heartbeat until done")
                self.ctl.learner["state"] = int(shm.ProcState.STARTING)
                self.compile_t0 = time.perf_counter()
            token = self.chunk_timer.start()
            self.telemetry.last_train = self.agent.train(self.buffer, chunk)
            spent = self.chunk_timer.end(token, chunk)   # None on CUDA: the GPU's time, collected below
            if spent is not None:
                self.telemetry.learn_time += spent
                if self.threads is not None:
                    self.threads.record(spent, chunk)
            if self.compile_updates_left > 0:
                self.compile_updates_left -= chunk
                if self.compile_updates_left <= 0:
                    self.compiled_or_fell_back()
            if self.agent.compiled:   # which path the updates ran: train/update_compiled 1, or 0 after a fallback
                fell_back = getattr(self.agent, "compile_fallback_reason", None) is not None
                self.telemetry.last_train = {**self.telemetry.last_train, "update_compiled": float(not fell_back)}
            k -= chunk
            self.updates_since_publish += chunk
            if self.updates_since_publish >= self.ao.weight_publish_interval:
                self.publish()
            self.beat()
        self.telemetry.learn_time += self.chunk_timer.collect()   # the chunks the GPU finished by now

    def compiled_or_fell_back(self) -> None:
        """The first updates ran: say (loudly) whether torch.compile's path or eager runs from here;
        the agent sets compile_fallback_reason when compiling failed anywhere in the first step."""
        reason = getattr(self.agent, "compile_fallback_reason", None)
        took = time.perf_counter() - self.compile_t0
        if reason is None:
            log(ROLE, f"update compiled in {took:.1f}s")
        else:
            log(ROLE, f"warning: torch.compile failed after {took:.1f}s, the update runs EAGER (train/update_compiled "
                      f"0): {reason}")
        self.ctl.learner["update_path"] = int(shm.UpdatePath.COMPILED if reason is None else shm.UpdatePath.FELL_BACK)
        self.beat()  # fresh beat before RUNNING
        self.ctl.learner["state"] = int(shm.ProcState.RUNNING)

    # ------------------------------------------------------------------ main loop
    def beat(self) -> None:
        self.ctl.learner["heartbeat_ns"] = time.monotonic_ns()

    def own_stop(self) -> tuple[str | None, bool]:
        """This learner's own reason to stop (a signal, the launcher's stop flag, the launcher gone:
        exit 1), and whether it is a failure of its machine (the launcher gone, or its job stopping
        on a learner's or a collector's failure), which a learner group passes on to the other ranks."""
        reason, stop = None, self.stop_signal
        if stop.requested or self.ctl.stop_requested():
            reason = f"stop requested ({'signal ' + str(stop.signum) if stop.requested else 'launcher'})"
        elif (now := time.perf_counter()) - self.last_liveness >= 0.5:
            self.last_liveness = now
            if not shm.job_is_alive(self.cfg.job_name):
                self.exit_code = 1
                reason = "the launcher is gone (its lock on the control segment was released)"
        if reason is None:
            return None, False
        return reason, self.exit_code != 0 or (self.ctl.stop_requested() and self.ctl.stop_reason in
                                               (shm.StopReason.LEARNER_FAILED, shm.StopReason.COLLECTOR_FAILED))

    def run(self, stop: StopSignal) -> int:
        """Hold until every collector attached, then iterate until the budget or a stop; finish. A
        failure of the coordination (a peer of a learner group) ends it with exit code 1."""
        self.stop_signal = stop
        try:
            return self.run_to_the_end()
        except self.coord.failures as exc:
            return self.fail(exc)

    def run_to_the_end(self) -> int:
        if done := self.schedule.nothing_left(self.env_steps):   # a finished run resumed: write nothing
            log(ROLE, done)
            self.ctl.learner["state"] = int(shm.ProcState.FINISHED)
            return 0
        verdict = self.wait_for_collectors()
        self.telemetry.start(self.env_steps)
        while verdict is None and not self.schedule.finished(self.env_steps):
            verdict = self.coord.stop(self.own_stop)
            if verdict is None:
                self.iteration()
            elif verdict.failed:
                self.exit_code = 1
        return self.finish(verdict.reason if verdict else "finished")

    def iteration(self) -> None:
        """One pass of named steps: attach, ingest, update (+ publish), status, log, checkpoint."""
        self.beat()
        now = time.perf_counter()
        if now - self.last_attach >= ATTACH_RETRY_S:
            self.last_attach = now
            self.attach_collectors()
        slots, transitions = self.ingest()
        transitions = self.coord.count(transitions, self.own_stop)   # a group: every rank's
        self.env_steps += transitions
        self.telemetry.add_batches(transitions / self.batch_envs)
        k = self.updates_to_run(transitions)
        if self.cfg.algo.num_updates == 0 and slots:
            # Collect-only runs still exercise the broadcast: one "update" per ingested slot.
            self.updates_since_publish += slots
            if self.updates_since_publish >= self.ao.weight_publish_interval:
                self.publish()
        self.update(k)
        self.deliver()    # the weights of a publish whose copy landed meanwhile
        self.idle(busy=bool(slots or k))
        self.ctl.learner.update(env_steps=self.env_steps, num_updates=self.agent.num_updates_done)
        if time.perf_counter() - self.last_status >= STATUS_INTERVAL_S:
            self.last_status = time.perf_counter()
            self.telemetry.refresh_status()
        self.evaluation.poll()
        if self.telemetry.due(self.env_steps):
            self.telemetry.log(self.env_steps, self.agent.num_updates_done, self.weight_version)
        self.checkpoint_if_due()

    def idle(self, busy: bool) -> None:
        """Nothing ingested and nothing updated: back off instead of spinning (common.pacing)."""
        if busy:
            self.idle_backoff.reset()
        else:
            self.idle_backoff.wait()

    def checkpoint_if_due(self) -> None:
        if not self.schedule.checkpoint_due(self.env_steps) or not self.writes_checkpoints:
            return
        with beating_while(self.ctl.learner, self.ao.heartbeat_timeout_s):
            try:
                run_state.save(self.cfg, self.spec, self.agent, self.env_steps)
            except run_state.CheckpointSaveError as exc:  # disk full, I/O error: keep training
                log(ROLE, f"error: {exc}; training goes on, next try at iteration {self.schedule.next_checkpoint_it:,}")

    def finish(self, reason: str) -> int:
        """Final metrics (however short the run), final checkpoint, final state; the exit code."""
        self.coord.finishing(self.agent)
        self.deliver(wait=True)
        self.telemetry.learn_time += self.chunk_timer.collect(wait=True)
        self.evaluation.finish(self, reason == "finished")
        if self.telemetry.has_news(self.env_steps, self.agent.num_updates_done):
            self.telemetry.log(self.env_steps, self.agent.num_updates_done, self.weight_version)
        self.telemetry.refresh_status()
        self.ctl.learner["state"] = int(shm.ProcState.STOPPING)  # no heartbeat while the final checkpoint is written
        path = self.final_checkpoint(reason)
        if self.writes_checkpoints:
            self.telemetry.summary(self.env_steps, self.agent.num_updates_done, path)
        self.ctl.learner["state"] = int(shm.ProcState.FINISHED if self.exit_code == 0 else shm.ProcState.FAILED)
        return self.exit_code

    def final_checkpoint(self, reason: str) -> Path | None:
        """Rank 0's (or the one learner's) last checkpoint: its path, None when none was written."""
        if not self.writes_checkpoints:
            log(ROLE, f"{reason} at env step {self.env_steps:,} (rank 0 writes the checkpoints)")
            return None
        try:
            path = run_state.save(self.cfg, self.spec, self.agent, self.env_steps)
            log(ROLE, f"{reason}: final checkpoint {path} at env step {self.env_steps:,}")
            return path
        except run_state.CheckpointSaveError as exc:  # the job did not end whole: exit 1 with the reason
            log(ROLE, f"error: {reason}, but the final checkpoint failed: {exc}")
            self.exit_code = 1
            return None

    def fail(self, exc: BaseException) -> int:
        """A peer failed: name it, rank 0 keeps what it can (a final checkpoint), exit 1. Not after a
        gradient all-reduce the failed peer never joined (NCCL, LearnerGroup.settle): the weights
        after it are not the job's, and the last periodic checkpoint is the sound one."""
        log(ROLE, f"error: the learner group failed: {exc}")
        self.exit_code = 1
        self.ctl.learner["state"] = int(shm.ProcState.STOPPING)
        unsound = self.coord.settle()
        if unsound is None:
            self.final_checkpoint("the learner group failed")   # rank 0 only; the exit code is 1 either way
        elif self.writes_checkpoints:
            log(ROLE, f"no final checkpoint: {unsound}, so this rank's weights are not the job's; the last "
                      "periodic checkpoint stands")
        self.ctl.learner["state"] = int(shm.ProcState.FAILED)
        return 1

    def close(self) -> None:
        self.coord.stop_beat()   # a group's helper thread, before the control block goes away under it
        try:
            self.evaluation.close()
            self.telemetry.close()
            for feed in self.feeds:
                feed.close()
            self.ctl.close()
        finally:
            self.coord.close()   # a group: leave it
