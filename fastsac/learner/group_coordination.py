"""The coordination of a learner of a data-parallel learner group (more than one learner in the
job): the one Learner loop (fastsac.learner.loop) with every decision that must agree across ranks
made from values every rank holds (fastsac.learner.distributed.LearnerGroup, the torch.distributed
group of the job's learners), all ranks in lockstep:

  start     join the group; rank 0 restores the checkpoint (the others build a fresh agent),
            broadcast_agent gives every rank rank 0's agent; install (gradients averaged inside
            every update, normalizer batches merged by sync_normalizers); one exchange fixes the
            job's start env steps (rank 0's), its env-step batch (the sum of every machine's
            env.num_envs) and its budget (the sum of every machine's num_iterations x num_envs).
  wait      rounds of: attach own collectors, exchange the number still missing (and stop /
            timeout flags): no rank sits in a collective longer than one round.
  count     after ingesting from own collectors (own replay rows): sync_normalizers + exchange
            (transitions, produced env steps, episodes, learn time per rank; stop and "buffer
            not ready" flags) -> k updates owed from the job's transitions (the same k on every
            rank) -> publish to own collectors -> rank 0 logs the job's totals and checkpoints.
  failure   a DistributedError (a peer died or hung: the message names its rank) -> rank 0
            writes a final checkpoint if it can, state FAILED, exit 1 (Learner.fail).

While it waits in a collective (a peer may be writing a checkpoint) a helper thread keeps this
learner's heartbeat fresh; collectives are bounded by distributed.timeout_s, so that is no hang.
"""
from __future__ import annotations

import copy
import time
import zlib

import torch

from fastsac.common.pacing import BackgroundBeat, beat_period
from fastsac.common.seeds import learner_torch_seed
from fastsac.learner.coordination import ATTACH_RETRY_S, ROLE, OwnStop, StartState, Verdict, restore
from fastsac.learner.distributed import DistributedError, LearnerGroup
from fastsac.learner.learner_telemetry import LearnerTelemetry
from fastsac.machine.ranks import node_of
from fastsac.process.setup import log
from fastsac.training import state as run_state


class GroupTelemetry(LearnerTelemetry):
    """Rank 0 writes the job's totals (every rank's collectors); the other ranks write no
    TensorBoard and no console line, only their status record. perf/learn_pct_rank<r>: each
    rank's share of the window's wall time spent in updates."""

    def __init__(self, coordination: "GroupCoordination", cfg, *args, **kwargs):
        self.coordination = coordination
        self.learn_closed = 0.0
        self._job_prev: dict = {}
        super().__init__(cfg, *args, **kwargs)

    def start(self, env_steps: int) -> None:
        super().start(env_steps)
        self.learn_closed = 0.0
        self._job_prev = dict(self.coordination.job)

    @property
    def learn_total(self) -> float:
        """Seconds in updates since start (cumulative: exchanged every iteration)."""
        return self.learn_closed + self.learn_time

    def produced_per_s(self, scalars: dict, dt: float) -> float:
        return max(self.coordination.job.get("produced", 0.0) - self._job_prev.get("produced", 0.0), 0.0) / dt

    def _collector_scalars(self, dt: float):
        scalars, rows, _ = super()._collector_scalars(dt)
        job = self.coordination.job
        for r in range(self.coordination.group.world_size):
            key = f"learn_s_r{r}"
            scalars[f"perf/learn_pct_rank{r}"] = 100.0 * (job.get(key, 0.0) - self._job_prev.get(key, 0.0)) / dt
        totals = (int(job.get("episodes", 0)), job.get("return_sum", 0.0), int(job.get("length_sum", 0)))
        return scalars, rows, totals

    def log(self, env_steps: int, num_updates: int, weight_version: int) -> None:
        window = self.learn_time
        super().log(env_steps, num_updates, weight_version)
        self.learn_closed += window
        self._job_prev = dict(self.coordination.job)


class GroupCoordination:
    """One rank of a learner group: what it agrees with the other ranks, and how."""
    failures: tuple[type[BaseException], ...] = (DistributedError,)

    def __init__(self):
        self.group: LearnerGroup | None = None
        self.beat_blocked: BackgroundBeat | None = None
        self.job: dict = {}              # the last exchange's sums: the job's counters
        self.global_ready = False        # every rank's replay buffer is ready
        self.group_stop: Verdict | None = None   # what the ranks agreed at the last exchange
        self._produced: dict[int, tuple[int, int]] = {}   # per own collector: (incarnation, env_steps) seen
        self._produced_total = 0
        self._last_stats: dict[int, dict] = {}
        self.quota_left: int | None = None   # env steps this rank ingests in this run (see quota)
        self.own_ingested = 0

    # ------------------------------------------------------------------ set-up
    def start(self, ctx, spec, agent, buffer, ctl, device) -> StartState:
        cfg, me = ctx.cfg, ctx.me
        self.cfg, self.agent, self.buffer, self.ctl = cfg, agent, buffer, ctl
        self.group = LearnerGroup.join(cfg, me.learner_index, device, lambda m: log(ROLE, m))
        # Rank 0's checkpoint is the job's: only it reads one; broadcast_agent gives it to everyone.
        env_steps = restore(cfg, spec, agent) if self.group.is_root else 0
        self.group.broadcast_agent(agent)
        self.group.install(agent)
        first = me.learner_index == 0   # each machine's batch and budget, counted once
        sums, _ = self.group.exchange({
            "start": env_steps, "envs": cfg.env.num_envs if first else 0,
            "budget": cfg.trainer.num_iterations * cfg.env.num_envs if first else 0})
        self.started = StartState(env_steps=int(sums["start"]), batch_envs=int(sums["envs"]),
                                  total_env_steps=int(sums["budget"]), writes_checkpoints=self.group.is_root)
        # every rank samples its own replay rows: their streams need not (and should not) be equal
        torch.manual_seed(learner_torch_seed(cfg.seed, self.group.rank))
        self.beat_blocked = BackgroundBeat(ctl.learner, beat_period(cfg.trainer.async_options.heartbeat_timeout_s))
        log(ROLE, f"learner rank {self.group.rank} of {self.group.world_size}: {len(ctx.plan.collectors)} "
                  f"collector(s) on this machine, {buffer.num_envs} env rows here; "
                  f"job: {self.started.batch_envs} envs per env-step batch, {self.started.total_env_steps:,} env steps")
        return self.started

    def telemetry(self, cfg, ctl, feeds, num_updates: int) -> LearnerTelemetry:
        s, self.feeds = self.started, feeds
        view = copy.deepcopy(cfg)   # the job's iterations: env-step batches of all machines' envs
        view.env.num_envs = s.batch_envs
        view.trainer.num_iterations = max(1, s.total_env_steps // s.batch_envs)
        view.logging.tensorboard = view.logging.tensorboard and self.group.is_root
        view.logging.console = view.logging.console and self.group.is_root
        self._telemetry = GroupTelemetry(self, view, ctl, feeds, s.env_steps, num_updates, s.total_env_steps,
                                         lineage=run_state.lineage(cfg))
        return self._telemetry

    # ------------------------------------------------------------------ lockstep
    def _stop_flags(self, own: tuple[str | None, bool]) -> dict[str, float]:
        """This rank's part of a stop decision: whether it stops, and (rank + 1) when its stop is a
        failure (its launcher gone, its job failing) rather than the end or a person's stop."""
        reason, failing = own
        return {"stop": 1.0 if reason else 0.0,
                "failed_rank": float(self.group.rank + 1) if reason and failing else 0.0}

    def _group_stop(self, reason: str | None, maxes: dict[str, float]) -> Verdict:
        """The reason this rank stops on the group's decision: its own, else the peer's. A stop
        because another rank failed is a failure here too (exit 1, naming that rank): a machine
        whose job died must never read as 'finished' on the others."""
        if reason:
            return Verdict(reason)
        if maxes["failed_rank"]:
            rank = int(maxes["failed_rank"]) - 1
            return Verdict(f"learner rank {rank} (node_rank {node_of(self.cfg, rank)}) stopped on a failure of its "
                           "machine", failed=True)
        return Verdict("another learner of the group stopped (a stop on its machine)")

    def wait_for_collectors(self, waiting_for, attach_round, own_stop: OwnStop, wait_s: float) -> Verdict | None:
        """Rounds until every learner's collectors attached once; a round ends in one exchange."""
        start = last_report = time.monotonic()
        while True:
            own = own_stop()
            missing, now, last_report = attach_round(start, last_report)
            late = bool(missing) and now - start > wait_s
            with self.beat_blocked.covering():
                sums, maxes = self.group.exchange({"missing": len(missing)},
                                                  {**self._stop_flags(own), "late": 1.0 if late else 0.0})
            if maxes["late"]:
                ids = ", ".join(str(f.cid) for f in missing)
                mine = f"collector(s) {ids} of this learner" if missing else "collector(s) of another learner"
                return Verdict(f"{mine} did not attach within trainer.async_options.collector_wait_s={wait_s:g}s "
                               f"({int(sums['missing'])} missing in the job); start them (fastsac-launch CONFIG "
                               "--plan prints the commands) or raise collector_wait_s", failed=True)
            if maxes["stop"]:
                return self._group_stop(own[0], maxes)
            if sums["missing"] == 0:
                return None
            time.sleep(ATTACH_RETRY_S / 4)

    def quota(self, env_steps: int) -> int:
        """Its quota of the job's env steps (its share of env rows of what was left at start) minus
        what it ingested: the ranks together stop at the budget (not each ingesting the whole rest),
        and every env steps its share, as in the synchronous trainer."""
        if self.quota_left is None:
            s = self.started
            rest = max(s.total_env_steps - s.env_steps, 0)
            self.quota_left = -(-rest * self.buffer.num_envs // s.batch_envs)
        return self.quota_left - self.own_ingested

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

    def count(self, transitions: int, own_stop: OwnStop) -> int:
        """Merge normalizer batches and exchange this iteration's counters: every rank then counts
        the job's transitions and takes the same decisions."""
        self.own_ingested += transitions
        own = own_stop()
        produced, episodes, ret, length = self._own_counters()
        rank, world = self.group.rank, self.group.world_size
        learn = self._telemetry.learn_total
        sums = {"transitions": transitions, "produced": produced, "episodes": episodes, "return_sum": ret,
                "length_sum": length, **{f"learn_s_r{r}": learn if r == rank else 0.0 for r in range(world)}}
        maxes = {**self._stop_flags(own), "not_ready": 0.0 if self.buffer.ready() else 1.0}
        with self.beat_blocked.covering():
            self.group.sync_normalizers(self.agent)
            sums, maxes = self.group.exchange(sums, maxes)
        self.job = sums
        self.global_ready = maxes["not_ready"] == 0
        if maxes["stop"] and self.group_stop is None:
            self.group_stop = self._group_stop(own[0], maxes)
        return int(sums["transitions"])

    def buffer_ready(self, buffer) -> bool:
        """Every rank's buffer (the last exchange's flag): the ranks update in lockstep."""
        return self.global_ready

    def stop(self, own_stop: OwnStop) -> Verdict | None:
        """The group's decision of the last exchange (a local reason only counts once exchanged)."""
        return self.group_stop

    # ------------------------------------------------------------------ finish, failure
    def actor_digest(self) -> str:
        """crc32 of the actor weights as published: equal on every rank of a healthy group."""
        flat = self.agent.policy_flat().detach().to("cpu", torch.float32).contiguous().numpy()
        return f"{zlib.crc32(flat.tobytes()):08x}"

    def finishing(self, agent) -> None:
        log(ROLE, f"learner rank {self.group.rank}: final actor digest {self.actor_digest()} after "
                  f"{agent.num_updates_done:,} updates")

    def settle(self) -> str | None:
        """After a failure: why the weights are not the job's (a gradient all-reduce the failed peer
        never joined), or None when a final checkpoint is sound (LearnerGroup.settle)."""
        return self.group.settle()

    def stop_beat(self) -> None:
        if self.beat_blocked is not None:
            self.beat_blocked.close()   # before the control block goes away under it

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
