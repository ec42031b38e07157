"""The learner's side of evaluation during training (async trainer, eval.interval > 0).

Evaluation never takes the learner's time: the evaluator process plays the episodes
(fastsac.evaluator_main). The learner only
  * publishes: when a publish of its weights reaches an evaluation's env step (every
    eval.interval iterations), the same host vector also goes into the evaluator's snapshot,
    tagged with its env step and weight version (one more memcpy, a non-blocking seqlock
    write). Until the evaluator has created its snapshot the evaluation stays due, and the
    first publish after it appears sends the weights of that moment;
  * logs: reads the evaluator's channel for a new result (one int64 load when there is
    none, at most every POLL_S) and writes it to TensorBoard and the console through
    Telemetry.log_eval (the learner is the only TensorBoard writer).
"""
from __future__ import annotations

import time

import numpy as np

from fastsac import shm_layout as shm
from fastsac.evaluation.episodes import next_due
from fastsac.shm_layout.eval_channel import pack_weights, snapshot_numel

POLL_S = 0.5          # how often the channel is read for a new result
# A run that finishes waits for the evaluation of its final weights (the last point of the eval
# curve) this many times as long as the previous evaluation took, at least FINAL_WAIT_MIN_S.
FINAL_WAIT_FACTOR, FINAL_WAIT_MIN_S = 3.0, 5.0
ATTACH_RETRY_S = 0.5  # how often the evaluator's segments are looked for until they exist


class LearnerEval:
    def __init__(self, cfg, incarnation: int, policy_numel: int, env_steps: int, telemetry, log):
        self.cfg, self.incarnation, self.telemetry, self.log = cfg, incarnation, telemetry, log
        # a learner group turns it off on every rank but 0 (fastsac.learner.loop): rank 0 logs
        self.enabled = cfg.eval.interval > 0 and cfg.trainer.asynchronous
        self.due_at = next_due(env_steps, cfg) if self.enabled else 0
        self.numel = snapshot_numel(policy_numel)
        self.buf = np.zeros(self.numel, np.float32) if self.enabled else None
        self.snapshot = self.channel = None
        self.last_result = 0
        self.published_env_steps = -1     # the env step of the weights last sent to the evaluator
        self.last_seconds = 0.0           # how long the newest evaluation took
        self.done_env_steps = -1          # the env step of the newest result
        self.last_poll = self.last_snapshot_try = self.last_channel_try = 0.0

    def on_publish(self, flat: np.ndarray, env_steps: int, weight_version: int) -> None:
        """Called with every publish's host vector: send it to the evaluator when an evaluation is due."""
        if not self.enabled or env_steps < self.due_at:
            return
        if self.snapshot is None:
            now = time.monotonic()
            if now - self.last_snapshot_try < ATTACH_RETRY_S:
                return
            self.last_snapshot_try = now
            try:
                self.snapshot = shm.WeightSnapshot.attach(self.cfg.job_name, shm.EVALUATOR_ID, self.numel,
                                                          role="writer", incarnation=self.incarnation)
            except shm.ShmLayoutError:
                return   # the evaluator is not there (yet): the evaluation stays due
        self.snapshot.publish(pack_weights(self.buf, flat, env_steps, weight_version))
        self.published_env_steps = env_steps
        self.due_at = next_due(env_steps, self.cfg)

    def poll(self, force: bool = False) -> None:
        """Log a new result, if the evaluator wrote one since the last poll."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last_poll < POLL_S):
            return
        self.last_poll = now
        if self.channel is None:
            if not force and now - self.last_channel_try < ATTACH_RETRY_S:
                return
            self.last_channel_try = now
            try:
                self.channel = shm.EvalChannel.attach(self.cfg.job_name, self.incarnation)
            except shm.ShmLayoutError:
                return
        got = self.channel.read_result(self.last_result)
        if got is not None:
            self.last_result, result = got
            self.last_seconds = result["seconds"]
            self.done_env_steps = result["env_steps"]
            self.telemetry.log_eval(result)

    def finish(self, learner, finished: bool) -> None:
        """End of the run: log what arrived; a run that finished also sends its final weights when an
        evaluation is due and waits (bounded, heartbeat kept) for the evaluation of the last weights
        it sent, so the eval curve ends at the final policy."""
        self.poll(force=True)
        if not finished or not self.enabled:
            return
        if learner.env_steps >= self.due_at:
            flat = learner.agent.policy_flat().detach().to("cpu").numpy()
            self.on_publish(flat, learner.env_steps, learner.weight_version)
        if self.snapshot is None or self.published_env_steps < 0:
            return
        deadline = time.monotonic() + max(FINAL_WAIT_MIN_S, FINAL_WAIT_FACTOR * self.last_seconds)
        while self.done_env_steps != self.published_env_steps and time.monotonic() < deadline:
            learner.beat()
            time.sleep(0.05)
            self.poll(force=True)
        if self.done_env_steps != self.published_env_steps:
            self.log(f"the evaluation of the final weights (env step {self.published_env_steps:,}) did not arrive "
                     "in time; it is not logged")

    def close(self) -> None:
        for part in (self.snapshot, self.channel):
            if part is not None:
                part.close()
        self.snapshot = self.channel = None
