"""The evaluator loop of an async job (eval.interval > 0): deterministic episodes of the newest
weights the learner sent it, on envs that are not training envs, off the learner's time.

    python -m fastsac.evaluator_main --config JOB.yaml [key=value ...]

Started by the launcher (on eval.cpus of the learner's CPUs when binding is on; `--plan` prints
the command). It attaches to the job like a collector, but never to a ring: it creates its
weight snapshot `/fastsac.<job>.eval.wts` (the learner publishes to it when an evaluation is
due, the weights tagged with their env step) and its channel `/fastsac.<job>.eval` (its pid,
state, heartbeat, incarnation and newest result, which the learner logs). Loop:

  poll the snapshot (non-blocking seqlock read) -> new weights: play eval.episodes episodes
  (fastsac.evaluation.episodes) -> write the result to the channel -> poll again.

It exits 0 on the stop flag or SIGTERM/SIGINT, 1 when the launcher is gone. A crash or a hang
never stops training: the launcher restarts it (max_restarts, backoff), then gives up on
evaluation while the job goes on. A restarted evaluator re-attaches both segments.
"""
from __future__ import annotations

import time

import numpy as np

from fastsac import shm_layout as shm
from fastsac.algo.policy import InferencePolicy
from fastsac.common.seeds import resolve_eval_seed
from fastsac.common.stopping import StopSignal
from fastsac.evaluation.episodes import make_eval_env, run_eval_episodes
from fastsac.evaluation.result import line, summarize
from fastsac.process import setup as process_setup
from fastsac.shm_layout.eval_channel import snapshot_numel, unpack_tag
from fastsac.shm_layout.job_settings import check_against_job
from fastsac.shm_layout.policy_layout import policy_flat_numel

POLL_S = 0.05               # snapshot poll while idle (an evaluation is due every eval.interval iterations)
LIVENESS_INTERVAL_S = 0.5   # how often the launcher's liveness is checked


class Evaluator:
    def __init__(self, ctx, role: str):
        self.role = role
        self.cfg = ctx.cfg
        cfg = self.cfg
        self.ctl = shm.ControlBlock.attach(cfg.job_name, role="observer")
        self.channel = self.snapshot = self.env = None
        # Before touching anything shared: an evaluator started with another config is refused.
        check_against_job(self.ctl, cfg, ctx.plan, "the evaluator")
        self.seed = resolve_eval_seed(cfg)
        self.env = make_eval_env(cfg, num_threads=ctx.me.threads)
        env = self.env
        self.policy_numel = policy_flat_numel(env.obs_dim, env.act_dim, cfg.algo)
        inc = self.ctl.incarnation
        # The channel first: its lock keeps a second evaluator of the job out before it touches the snapshot.
        self.channel = shm.EvalChannel.create_or_attach(cfg.job_name, inc)
        self.snapshot = shm.WeightSnapshot.create_or_attach(cfg.job_name, shm.EVALUATOR_ID,
                                                            snapshot_numel(self.policy_numel), inc)
        self.buf = np.zeros(snapshot_numel(self.policy_numel), np.float32)
        self.policy = InferencePolicy(env.obs_dim, env.act_dim, env.action_low, env.action_high, cfg.algo, "cpu")
        self.version = 0
        # A restarted evaluator does not evaluate again the weights its previous incarnation finished.
        done = self.channel.read_result()
        self.done_env_steps = done[1]["env_steps"] if done else -1
        self.incarnation = self.channel.status()["incarnation"] + 1
        now = time.monotonic_ns()
        self.channel.update(incarnation=self.incarnation, state=int(shm.ProcState.RUNNING), started_ns=now,
                            heartbeat_ns=now, busy_env_steps=0)
        self.exit_code, self.last_liveness = 0, 0.0
        process_setup.log(self.role, f"{cfg.env.name}: {cfg.eval.episodes} episode(s) on {env.num_envs} env(s) per "
                                f"evaluation, seed {self.seed}, incarnation {self.incarnation}; waiting for weights")

    def stop_reason(self, stop: StopSignal) -> str | None:
        if stop.requested or self.ctl.stop_requested():
            return "stop requested"
        now = time.monotonic()
        if now - self.last_liveness >= LIVENESS_INTERVAL_S:
            self.last_liveness = now
            if not shm.job_is_alive(self.cfg.job_name) or not self.ctl.still_current():
                self.exit_code = 1
                return "the launcher of this job is gone"
        return None

    def run(self, stop: StopSignal) -> int:
        ch = self.channel

        def keep_going() -> bool:
            ch.beat()
            return self.stop_reason(stop) is None

        reason = None
        while reason is None:
            reason = self.stop_reason(stop)
            if reason is not None:
                break
            ch.beat()
            version = self.snapshot.try_load(self.buf, self.version)
            if version is None:
                time.sleep(POLL_S)
                continue
            self.version = version
            env_steps, weight_version = unpack_tag(self.buf)
            if env_steps == self.done_env_steps:
                continue
            self.policy.load_flat(self.buf[:self.policy_numel])
            ch.update(busy_env_steps=max(1, env_steps))
            t0 = time.perf_counter()
            out = run_eval_episodes(lambda obs: self.policy.act(obs, deterministic=True), self.env, self.seed,
                                    self.cfg.eval.episodes, on_step=keep_going)
            ch.update(busy_env_steps=0)
            if out is None:     # stopped mid-evaluation: that result is abandoned
                continue
            result = summarize(*out, env_steps, weight_version, time.perf_counter() - t0)
            ch.write_result(result)
            ch.update(evaluations=ch.status()["evaluations"] + 1)
            self.done_env_steps = env_steps
            process_setup.log(self.role, line(result))
        process_setup.log(self.role, f"{reason}: exiting")
        ch.update(state=int(shm.ProcState.EXITED if self.exit_code == 0 else shm.ProcState.FAILED))
        return self.exit_code

    def close(self) -> None:
        for part in (self.snapshot, self.channel, self.env, self.ctl):
            if part is not None:
                part.close()
