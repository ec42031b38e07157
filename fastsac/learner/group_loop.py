"""A learner of a data-parallel learner group (more than one learner in the job).

Same loop as fastsac.learner.loop.Learner, with every decision that must agree across ranks made
from values every rank holds (fastsac.learner.distributed.LearnerGroup), all ranks in lockstep:

  set-up    join the group; rank 0 restores the checkpoint (the others build a fresh agent),
            broadcast_agent gives every rank rank 0's agent; install (gradients averaged inside
            every update, normalizer batches merged by sync_normalizers); one exchange fixes the
            job's start env steps (rank 0's), its env-step batch (the sum of every machine's
            env.num_envs) and its budget (the sum of every machine's num_iterations x num_envs).
  wait      rounds of: attach own collectors, exchange the number still missing (and stop /
            timeout flags): no rank sits in a collective longer than one round.
  iteration ingest from own collectors (own replay rows) -> sync_normalizers + exchange
            (transitions, produced env steps, episodes, learn time per rank; stop and "buffer
            not ready" flags) -> k updates owed from the job's transitions (the same k on every
            rank) -> publish to own collectors -> rank 0 logs the job's totals and checkpoints.
  failure   a DistributedError (a peer died or hung: the message names its rank) -> rank 0
            writes a final checkpoint if it can, state FAILED, exit 1.

While it waits in a collective (a peer may be writing a checkpoint) a helper thread keeps this
learner's heartbeat fresh; collectives are bounded by distributed.timeout_s, so that is no hang.
"""
from __future__ import annotations

import copy
import time
import zlib

import torch

from fastsac import shm_layout as shm
from fastsac.common.pacing import BackgroundBeat, beat_period
from fastsac.common.seeds import learner_torch_seed
from fastsac.common.stopping import StopSignal
from fastsac.learner.distributed import DistributedError, LearnerGroup
from fastsac.learner.learner_telemetry import LearnerTelemetry
from fastsac.learner.loop import ATTACH_RETRY_S, Learner, StartState
from fastsac.machine.ranks import node_of
from fastsac.process.setup import log
from fastsac.training import state as run_state

ROLE = "learner"


class GroupTelemetry(LearnerTelemetry):
    """Rank 0 writes the job's totals (every rank's collectors); the other ranks write no
    TensorBoard and no console line, only their status record. perf/learn_pct_rank<r>: each
    rank's share of the window's wall time spent in updates."""

    def __init__(self, learner: "GroupLearner", cfg, *args, **kwargs):
        self.learner = learner
        self.learn_closed = 0.0
        self._job_prev: dict = {}
        super().__init__(cfg, *args, **kwargs)

    def start(self, env_steps: int) -> None:
        super().start(env_steps)
        self.learn_closed = 0.0
        self._job_prev = dict(self.learner.job)

    @property
    def learn_total(self) -> float:
        """Seconds in updates since start (cumulative: exchanged every iteration)."""
        return self.learn_closed + self.learn_time

    def produced_per_s(self, scalars: dict, dt: float) -> float:
        return max(self.learner.job.get("produced", 0.0) - self._job_prev.get("produced", 0.0), 0.0) / dt

    def _collector_scalars(self, dt: float):
        scalars, rows, _ = super()._collector_scalars(dt)
        job = self.learner.job
        for r in range(self.learner.group.world_size):
            key = f"learn_s_r{r}"
            scalars[f"perf/learn_pct_rank{r}"] = 100.0 * (job.get(key, 0.0) - self._job_prev.get(key, 0.0)) / dt
        totals = (int(job.get("episodes", 0)), job.get("return_sum", 0.0), int(job.get("length_sum", 0)))
        return scalars, rows, totals

    def log(self, env_steps: int, num_updates: int, weight_version: int) -> None:
        window = self.learn_time
        super().log(env_steps, num_updates, weight_version)
        self.learn_closed += window
        self._job_prev = dict(self.learner.job)


class GroupLearner(Learner):
    def __init__(self, ctx):
        # Its own state first: Learner.__init__ calls start_state, which joins the group.
        self.group: LearnerGroup | None = None
        self.beat_blocked: BackgroundBeat | None = None
        self.job: dict = {}
        self.global_ready = False
        self.group_stop: str | None = None
        self._stop = StopSignal()     # replaced by the process's own in run()
        self._produced: dict[int, tuple[int, int]] = {}   # per own collector: (incarnation, env_steps) seen
        self._produced_total = 0
        self._last_stats: dict[int, dict] = {}
        self.quota: int | None = None   # env steps this rank ingests in this run (see ingest_limit)
        self.own_ingested = 0
        super().__init__(ctx)
        if not self.group.is_root:
            self.evaluation.enabled = False   # the job's evaluator is rank 0's: it logs the results

    # ------------------------------------------------------------------ set-up (called by Learner.__init__)
    def start_state(self) -> StartState:
        cfg, me = self.cfg, self.me
        self.group = LearnerGroup.join(cfg, me.learner_index, self.device, lambda m: log(ROLE, m))
        # Rank 0's checkpoint is the job's: only it reads one; broadcast_agent gives it to everyone.
        env_steps = super().start_state().env_steps if self.group.is_root else 0
        self.group.broadcast_agent(self.agent)
        self.group.install(self.agent)
        first = me.learner_index == 0   # each machine's batch and budget, counted once
        sums, _ = self.group.exchange({
            "start": env_steps, "envs": cfg.env.num_envs if first else 0,
            "budget": cfg.trainer.num_iterations * cfg.env.num_envs if first else 0})
        start = StartState(env_steps=int(sums["start"]), batch_envs=int(sums["envs"]),
                           total_env_steps=int(sums["budget"]), writes_checkpoints=self.group.is_root)
        # every rank samples its own replay rows: their streams need not (and should not) be equal
        torch.manual_seed(learner_torch_seed(cfg.seed, self.group.rank))
        self.beat_blocked = BackgroundBeat(self.ctl.learner, beat_period(self.ao.heartbeat_timeout_s))
        log(ROLE, f"learner rank {self.group.rank} of {self.group.world_size}: {len(self.plan.collectors)} "
                  f"collector(s) on this machine, {self.buffer.num_envs} env rows here; "
                  f"job: {start.batch_envs} envs per env-step batch, {start.total_env_steps:,} env steps")
        return start

    def make_telemetry(self) -> LearnerTelemetry:
        view = copy.deepcopy(self.cfg)   # the job's iterations: env-step batches of all machines' envs
        view.env.num_envs = self.batch_envs
        view.trainer.num_iterations = max(1, self.total_env_steps // self.batch_envs)
        view.logging.tensorboard = view.logging.tensorboard and self.group.is_root
        view.logging.console = view.logging.console and self.group.is_root
        return GroupTelemetry(self, view, self.ctl, self.feeds, self.env_steps, self.agent.num_updates_done,
                              self.total_env_steps, lineage=run_state.lineage(self.cfg))

    # ------------------------------------------------------------------ lockstep
    def stop_reason(self, stop: StopSignal) -> str | None:
        """The group's decision of the last exchange (a local reason only counts once exchanged)."""
        return self.group_stop

    def _local_stop(self) -> str | None:
        return Learner.stop_reason(self, self._stop)

    def _stop_flags(self, local: str | None) -> dict[str, float]:
        """This rank's part of a stop decision: whether it stops, and (rank + 1) when its stop is a
        failure (its launcher gone, its job failing) rather than the end or a person's stop."""
        failing = self.exit_code != 0 or (self.ctl.stop_requested() and self.ctl.stop_reason in
                                          (shm.StopReason.LEARNER_FAILED, shm.StopReason.COLLECTOR_FAILED))
        return {"stop": 1.0 if local else 0.0, "failed_rank": float(self.group.rank + 1) if local and failing else 0.0}

    def _group_stop(self, local: str | None, maxes: dict[str, float]) -> str:
        """The reason this rank stops on the group's decision: its own, else the peer's. A stop
        because another rank failed is a failure here too (exit 1, naming that rank): a machine
        whose job died must never read as 'finished' on the others."""
        if local:
            return local
        if maxes["failed_rank"]:
            rank = int(maxes["failed_rank"]) - 1
            self.exit_code = 1
            return f"learner rank {rank} (node_rank {node_of(self.cfg, rank)}) stopped on a failure of its machine"
        return "another learner of the group stopped (a stop on its machine)"

    def buffer_ready(self) -> bool:
        return self.global_ready

    def ingest_limit(self) -> int:
        """Its quota of the job's env steps (its share of env rows of what was left at start) minus
        what it ingested: the ranks together stop at the budget (not each ingesting the whole rest),
        and every env steps its share, as in the synchronous trainer."""
        if self.quota is None:
            rest = max(self.total_env_steps - self.start_env_steps, 0)
            self.quota = -(-rest * self.buffer.num_envs // self.batch_envs)
        return self.quota - self.own_ingested

    def _own_counters(self) -> tuple[int, int, float, int]:
        """(env steps produced, episodes, return sum, length sum) of this learner's collectors, cumulative."""
        episodes, ret, length = 0, 0.0, 0
        for f in self.feeds:
            rec = self.ctl.collector(f.cid)
            inc, steps = rec["incarnation"], rec["env_steps"]
            prev_inc, prev_steps = self._produced.get(f.cid, (inc, 0))
            self._produced_total += max(steps - prev_steps if inc == prev_inc else steps, 0)
            self._produced[f.cid] = (inc, steps)
            stats = self.ctl.read_collector_stats(f.cid) or self._last_stats.get(f.cid)
            if stats:
                self._last_stats[f.cid] = stats
                episodes += stats["episodes"]
                ret += stats["return_sum"]
                length += stats["length_sum"]
        return self._produced_total, episodes, ret, length

    def count(self, slots: int, transitions: int) -> int:
        """Merge normalizer batches and exchange this iteration's counters: every rank then counts
        the job's transitions and takes the same decisions."""
        self.own_ingested += transitions
        local = self._local_stop()
        produced, episodes, ret, length = self._own_counters()
        rank, world = self.group.rank, self.group.world_size
        learn = self.telemetry.learn_total
        sums = {"transitions": transitions, "produced": produced, "episodes": episodes, "return_sum": ret,
                "length_sum": length, **{f"learn_s_r{r}": learn if r == rank else 0.0 for r in range(world)}}
        maxes = {**self._stop_flags(local), "not_ready": 0.0 if self.buffer.ready() else 1.0}
        with self.beat_blocked.covering():
            self.group.sync_normalizers(self.agent)
            sums, maxes = self.group.exchange(sums, maxes)
        self.job = sums
        self.global_ready = maxes["not_ready"] == 0
        if maxes["stop"] and self.group_stop is None:
            self.group_stop = self._group_stop(local, maxes)
        return int(sums["transitions"])

    def wait_for_collectors(self, stop: StopSignal) -> str | None:
        """Rounds until every learner's collectors attached once; a round ends in one exchange."""
        self._stop = stop
        start = last_report = time.monotonic()
        while True:
            local = self._local_stop()
            missing, now, last_report = self.attach_round(start, last_report)
            late = bool(missing) and now - start > self.ao.collector_wait_s
            with self.beat_blocked.covering():
                sums, maxes = self.group.exchange({"missing": len(missing)},
                                                  {**self._stop_flags(local), "late": 1.0 if late else 0.0})
            if maxes["late"]:
                self.exit_code = 1
                ids = ", ".join(str(f.cid) for f in missing)
                mine = f"collector(s) {ids} of this learner" if missing else "collector(s) of another learner"
                return (f"{mine} did not attach within trainer.async_options.collector_wait_s="
                        f"{self.ao.collector_wait_s:g}s ({int(sums['missing'])} missing in the job); start them "
                        "(fastsac-launch CONFIG --plan prints the commands) or raise collector_wait_s")
            if maxes["stop"]:
                return self._group_stop(local, maxes)
            if sums["missing"] == 0:
                break
            time.sleep(ATTACH_RETRY_S / 4)
        self.ctl.learner["waiting_mask"] = 0
        return None

    # ------------------------------------------------------------------ run, finish, failure
    def run(self, stop: StopSignal) -> int:
        self._stop = stop
        try:
            return super().run(stop)
        except DistributedError as exc:
            return self.fail(exc)

    def actor_digest(self) -> str:
        """crc32 of the actor weights as published: equal on every rank of a healthy group."""
        flat = self.agent.policy_flat().detach().to("cpu", torch.float32).contiguous().numpy()
        return f"{zlib.crc32(flat.tobytes()):08x}"

    def finish(self, reason: str) -> int:
        log(ROLE, f"learner rank {self.group.rank}: final actor digest {self.actor_digest()} after "
                  f"{self.agent.num_updates_done:,} updates")
        return super().finish(reason)

    def fail(self, exc: DistributedError) -> int:
        """A peer failed: name it, rank 0 keeps what it can (a final checkpoint), exit 1. Not after a
        gradient all-reduce the failed peer never joined (NCCL, LearnerGroup.settle): the weights
        after it are not the job's, and the last periodic checkpoint is the sound one."""
        log(ROLE, f"error: the learner group failed: {exc}")
        self.exit_code = 1
        self.ctl.learner["state"] = int(shm.ProcState.STOPPING)
        unsound = self.group.settle()
        if unsound is None:
            self.final_checkpoint("the learner group failed")   # rank 0 only; the exit code is 1 either way
        elif self.writes_checkpoints:
            log(ROLE, f"no final checkpoint: {unsound}, so this rank's weights are not the job's; the last "
                      "periodic checkpoint stands")
        self.ctl.learner["state"] = int(shm.ProcState.FAILED)
        return 1

    def close(self) -> None:
        if self.beat_blocked is not None:
            self.beat_blocked.close()   # before the control block goes away under it
        try:
            super().close()
        finally:
            if self.group is not None:
                self.group.close()
