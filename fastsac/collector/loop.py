"""The collector's step loop: act, step, push into its ring, load weights (the command line, the
protocol and the loop in outline: fastsac.collector.main)."""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from fastsac import shm_layout as shm
from fastsac.algo.policy import InferencePolicy
from fastsac.common.episodes import EpisodeTracker
from fastsac.common.pacing import IdleBackoff
from fastsac.common.procs import pid_alive
from fastsac.common.seeds import collector_action_seed, collector_torch_seed, reset_seed
from fastsac.common.stopping import StopSignal, ending_at_once
from fastsac.envs.registry import make_env
from fastsac.envs.stepping import act_and_step
from fastsac.errors import FatalError
from fastsac.machine.learner_plan import machine_env_offset
from fastsac.process.setup import log
from fastsac.process.torch_runtime import open_device
from fastsac.shm_layout.job_settings import check_against_job
from fastsac.shm_layout.policy_layout import policy_flat_numel

STATS_INTERVAL_S = 0.1       # how often the stats record in the control block is refreshed
LIVENESS_INTERVAL_S = 0.5    # how often the launcher/learner liveness is checked
# A publish takes ~1 ms (4 MB): newer weights that stay unloadable this long mean the snapshot
# itself is broken (e.g. its seq corrupted); the collector then flags it in its record.
SNAPSHOT_STUCK_S = 1.0


class StageTimer:
    """Cumulative nanoseconds per loop stage (published to the learner as stats): start() at the top
    of an iteration, lap(stage) at the end of each stage (the time since the last start or lap)."""

    def __init__(self):
        self.ns = dict.fromkeys(shm.STAGES, 0)
        self.t0 = 0

    def start(self) -> None:
        self.t0 = time.perf_counter_ns()

    def lap(self, stage: str) -> None:
        t1 = time.perf_counter_ns()
        self.ns[stage] += t1 - self.t0
        self.t0 = t1


class CollectorError(RuntimeError):
    pass


class Collector:
    def __init__(self, ctx, role: str, stop: StopSignal):
        self.role = role
        cfg, me = ctx.cfg, ctx.me
        self.cfg, self.cid, self.ao = cfg, me.collector_id, cfg.trainer.async_options
        # ctl.learner is the record of the learner this collector belongs to (its weights, its state)
        self.ctl = shm.ControlBlock.attach(cfg.job_name, role="collector", collector_id=me.collector_id,
                                           num_collectors=self.ao.num_collectors, learner_index=me.learner_index,
                                           num_learners=cfg.distributed.num_learners)
        # Before touching anything shared: a collector started by hand with another config is refused.
        check_against_job(self.ctl, cfg, ctx.plan, f"collector {me.collector_id}")
        self.rec = self.ctl.collector(me.collector_id)
        # Another machine of the job (node_rank > 0) steps other global env ids and other action streams:
        # the same collector id on two machines must not replay the same episodes.
        self.node_rank = cfg.distributed.node_rank
        # building the envs can take a minute (8k MuJoCo envs, a large EnvPool pool) and creates
        # nothing shared yet: a stop ends it at once (the launcher signals a collector still starting)
        with ending_at_once(stop):
            self.env = make_env(cfg.env.name, me.env_count, seed=cfg.seed,
                                first_env_id=me.env_first + machine_env_offset(cfg),
                                max_episode_steps=cfg.env.max_episode_steps, num_threads=me.threads)
        self.env_first, self.n = me.env_first, me.env_count
        env = self.env
        spec = shm.job_ring_spec(cfg, env, self.n)
        job_incarnation = self.ctl.incarnation
        # Created here, under this process's binding, the pages land on our node; a restart
        # re-attaches instead and unread slots survive.
        # A ring the learner dropped as faulty is replaced, not continued.
        self.ring = shm.TransitionRing.create_or_attach(cfg.job_name, self.cid, spec, job_incarnation,
                                                        replace=bool(self.ctl.ingest(self.cid)["dropped"]))
        numel = policy_flat_numel(env.obs_dim, env.act_dim, cfg.algo)
        self.snapshot = shm.WeightSnapshot.create_or_attach(cfg.job_name, self.cid, numel, job_incarnation)
        self.flat = np.zeros(numel, np.float32)
        # the plan's concrete device: the GPU of the learner this collector feeds, or the CPU
        self.device = open_device(me.device, "trainer.async_options.collector_inference_device", cfg.algo.tf32,
                                  log=lambda m: log(role, m))
        self.policy = InferencePolicy(env.obs_dim, env.act_dim, env.action_low, env.action_high, cfg.algo, self.device)
        # A new incarnation per (re)start: the learner sees the change in the slot headers and drops
        # the dangling last transition of the previous incarnation (it has no successor).
        self.incarnation = self.rec["incarnation"] + 1
        self.rec.update(pid=os.getpid(), incarnation=self.incarnation, state=int(shm.ProcState.STARTING),
                        started_ns=time.monotonic_ns(), heartbeat_ns=time.monotonic_ns())
        self.weight_version = 0
        self.learner_version_at_load = 0   # the learner's publish count when we last loaded weights
        self.stuck_since_ns = 0
        stepping = env.describe_stepping()
        log(role, f"envs {self.env_first}..{self.env_first + self.n - 1} of {cfg.env.name}"
                  f"{f' ({stepping})' if stepping else ''}, ring capacity {spec.capacity}, policy on {self.device}, "
                  f"incarnation {self.incarnation}")

    # ------------------------------------------------------------------ liveness
    def _should_stop(self, stop: StopSignal) -> str | None:
        if stop.requested:
            return f"signal {stop.signum}"
        if self.ctl.stop_requested():
            return "stop requested by the launcher"
        return None

    def _check_peers(self) -> None:
        if not shm.job_is_alive(self.cfg.job_name):
            raise CollectorError("the launcher of this job is gone (its lock on the control segment was released)")
        learner = self.ctl.learner
        state, pid = shm.ProcState(learner["state"]), learner["pid"]
        if state == shm.ProcState.FAILED:
            raise CollectorError("the learner failed")
        if pid and state != shm.ProcState.FINISHED and not pid_alive(pid):
            raise CollectorError(f"the learner (pid {pid}) is gone")
        age = self.ctl.learner_heartbeat_age_s()
        if state == shm.ProcState.RUNNING and age is not None and age > self.ao.heartbeat_timeout_s:
            raise CollectorError(f"the learner's heartbeat is {age:.0f}s old (heartbeat_timeout_s="
                                 f"{self.ao.heartbeat_timeout_s:g})")

    def _wait_for_learner(self, stop: StopSignal) -> int | None:
        """The learner's start env steps (a resumed run: the checkpoint's), once it is set up;
        None when the job stops first."""
        while self.ctl.learner["state"] == shm.ProcState.EMPTY:
            if self._should_stop(stop):
                return None
            if not shm.job_is_alive(self.cfg.job_name):
                self.rec["state"] = int(shm.ProcState.FAILED)
                raise FatalError("the launcher of this job is gone (its lock on the control segment was released)",
                                 role=self.role)
            self.rec["heartbeat_ns"] = time.monotonic_ns()
            time.sleep(0.02)
        return self.ctl.learner["start_env_steps"]

    def _poll_weights(self) -> bool:
        """Load newer weights if the snapshot has them (non-blocking); True when loaded."""
        version = self.snapshot.try_load(self.flat, self.weight_version)
        if version is not None:
            self.policy.load_flat(self.flat)
            self.weight_version = version
            self.learner_version_at_load = self.ctl.learner["weight_version"]
            self.rec["loaded_weight_version"] = version
            if self.stuck_since_ns:
                self.stuck_since_ns = 0
                self.rec["snapshot_stuck_ns"] = 0
            return True
        if self.ctl.learner["weight_version"] > self.learner_version_at_load:  # newer weights exist
            now = time.monotonic_ns()
            if not self.stuck_since_ns:
                self.stuck_since_ns = now
            elif now - self.stuck_since_ns > SNAPSHOT_STUCK_S * 1e9 and not self.rec["snapshot_stuck_ns"]:
                self.rec["snapshot_stuck_ns"] = self.stuck_since_ns
                log(self.role, f"weight snapshot unreadable for {SNAPSHOT_STUCK_S:g}s although the learner "
                               "published newer weights (seq stuck?); reported to the learner")
        return False

    # ------------------------------------------------------------------ main loop
    def run(self, stop: StopSignal) -> int:
        cfg, env, ring, n = self.cfg, self.env, self.ring, self.n
        start_env_steps = self._wait_for_learner(stop)
        if start_env_steps is None:
            self.rec["state"] = int(shm.ProcState.EXITED)
            return 0
        torch.manual_seed(collector_torch_seed(cfg.seed, self.cid, self.node_rank, shm.MAX_COLLECTORS))
        self.rng = np.random.default_rng(collector_action_seed(cfg.seed, self.cid, self.incarnation, start_env_steps,
                                                               self.node_rank))
        # Distinct env streams per incarnation and per resume: neither replays the same episodes.
        obs, critic_obs = env.reset(reset_seed(cfg.seed, self.incarnation - 1, start_env_steps))
        # The policy acts once weights arrived and learning_starts batches were collected, by this
        # collector or before (a resumed job: the learner's env_steps start at the checkpoint's).
        learned_batches = 0
        episodes, timer = EpisodeTracker(n), StageTimer()
        steps = 0
        last_stats = last_liveness = time.monotonic()
        backoff = IdleBackoff()
        self.rec["state"] = int(shm.ProcState.RUNNING)
        while True:
            reason = self._should_stop(stop)
            if reason:
                log(self.role, f"stopping: {reason}; {steps} env-step batches pushed this incarnation")
                self.rec["state"] = int(shm.ProcState.EXITED)
                return 0
            now = time.monotonic()
            if now - last_liveness >= LIVENESS_INTERVAL_S:
                last_liveness = now
                try:
                    self._check_peers()
                except CollectorError as exc:
                    self.rec["state"] = int(shm.ProcState.FAILED)
                    raise FatalError(str(exc), role=self.role) from None
            timer.start()
            slot = ring.next_free_slot()
            if slot is None:  # full ring: back off, do not step the env, drop nothing
                backoff.wait()
                timer.lap("wait")
                self.rec["heartbeat_ns"] = time.monotonic_ns()
                continue
            backoff.reset()
            if steps % self.ao.weight_poll_interval == 0:
                if self._poll_weights():
                    learned_batches = self.ctl.learner["env_steps"] // cfg.env.num_envs
                timer.lap("sync")   # the weight sync stage (shm_layout.control.STAGES)
            warming_up = self.weight_version == 0 or max(steps, learned_batches) < cfg.algo.learning_starts
            res, batch = act_and_step(env, obs, critic_obs, self.rng, None if warming_up else self.policy.act,
                                      lap=timer.lap)   # the sample_actions and env_step stages
            self._check_finite(res, batch.final_idx)
            steps += 1
            slot.write(batch, self.weight_version, steps, self.incarnation)
            ring.commit()
            timer.lap("push")
            episodes.step(res.reward, res.terminated | res.truncated)
            obs, critic_obs = res.obs, res.critic_obs
            self.rec["env_steps"] = steps * n
            self.rec["heartbeat_ns"] = time.monotonic_ns()
            if now - last_stats >= STATS_INTERVAL_S:
                last_stats = now
                self._publish_stats(steps, episodes, timer)

    def _publish_stats(self, steps: int, episodes: EpisodeTracker, timer: StageTimer) -> None:
        self.ctl.write_collector_stats(self.cid, {
            "steps": steps, "episodes": episodes.count, "return_sum": episodes.return_sum,
            "length_sum": episodes.length_sum, **{f"{k}_ns": v for k, v in timer.ns.items()}})

    def _check_finite(self, res, done_idx: np.ndarray) -> None:
        """NaN/inf from an env never reaches the ring (and so never the replay buffer)."""
        bad = ~np.isfinite(res.reward) | ~np.isfinite(res.obs).all(axis=1)
        if done_idx.size:
            bad[done_idx] |= ~np.isfinite(res.final_obs[done_idx]).all(axis=1)
        if res.critic_obs is not None:
            bad |= ~np.isfinite(res.critic_obs).all(axis=1)
        if bad.any():
            ids = (np.flatnonzero(bad) + self.env_first).tolist()
            self.rec["state"] = int(shm.ProcState.FAILED)
            raise FatalError(f"env {self.cfg.env.name!r} produced NaN/inf (observation or reward) in global env ids "
                             f"{ids[:20]}{' ...' if len(ids) > 20 else ''}; that transition was not pushed",
                             role=self.role)

    def close(self) -> None:
        for seg in (self.ring, self.snapshot):
            seg.close()
        self.ctl.close()
        self.env.close()
