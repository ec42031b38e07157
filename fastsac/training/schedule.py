"""The run's checkpoint cadence and budget, one schedule for the synchronous trainer and the learner.

Both count iterations as env-step batches of the job (env.num_envs transitions; a learner
group: the sum over its machines), so `checkpoint.interval` means the same in either trainer
and across a resume: a checkpoint every interval iterations of the job's env steps, never on
the last one (the final checkpoint is written then). Logging (fastsac.training.telemetry.Telemetry.due)
and evaluation (fastsac.evaluation.episodes.next_due) keep their cadence on the same count.
"""
from __future__ import annotations

import math


class RunSchedule:
    def __init__(self, checkpoint_interval: int, batch_envs: int, total_env_steps: int, env_steps: int):
        self.interval = checkpoint_interval      # 0: no periodic checkpoints
        self.batch_envs = batch_envs
        self.total_env_steps = total_env_steps
        self.next_checkpoint_it: float = self._after(env_steps)

    def finished(self, env_steps: int) -> bool:
        return env_steps >= self.total_env_steps

    def nothing_left(self, env_steps: int) -> str | None:
        """Why a run resumed at env_steps has nothing to do (its checkpoint is at or past the
        budget), else None. Such a run writes nothing: a final checkpoint would be a copy of the one
        it resumed from, and its retention would prune a distinct older one."""
        if env_steps < self.total_env_steps:
            return None
        budget = f"the job's budget of {self.total_env_steps:,} env steps (trainer.num_iterations x env.num_envs)"
        where = f"at {budget}" if env_steps == self.total_env_steps else \
            f"past {budget}: the budget is smaller than the env steps already done"
        return (f"nothing to do: the checkpoint resumed from is at env step {env_steps:,}, {where}; nothing was "
                f"trained or written. Raise trainer.num_iterations above {env_steps // self.batch_envs:,} to "
                "train on")

    def checkpoint_due(self, env_steps: int) -> bool:
        """True once per checkpoint.interval iterations (the next one is then scheduled)."""
        if not self.interval or env_steps // self.batch_envs < self.next_checkpoint_it or self.finished(env_steps):
            return False
        self.next_checkpoint_it = self._after(env_steps)
        return True

    def _after(self, env_steps: int) -> float:
        """The first multiple of the interval after env_steps' iteration (inf: no checkpoints)."""
        it = env_steps // self.batch_envs
        return (it // self.interval + 1) * self.interval if self.interval else math.inf
