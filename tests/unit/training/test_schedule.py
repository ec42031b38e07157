"""The run schedule both trainers share: a checkpoint every checkpoint.interval iterations of the
job's env steps, never on the last one, and the same cadence after a resume."""
from __future__ import annotations

from fastsac.training.schedule import RunSchedule


def due_iterations(schedule: RunSchedule, batch: int, start_it: int, end_it: int) -> list[int]:
    return [it for it in range(start_it + 1, end_it + 1) if schedule.checkpoint_due(it * batch)]


def test_a_checkpoint_every_interval_iterations_but_not_on_the_last():
    s = RunSchedule(checkpoint_interval=3, batch_envs=4, total_env_steps=12 * 4, env_steps=0)
    assert due_iterations(s, 4, 0, 12) == [3, 6, 9]          # 12 is the end: the final checkpoint
    assert s.finished(12 * 4) and not s.finished(11 * 4)


def test_a_resumed_run_keeps_the_cadence_of_the_job_not_of_its_start():
    s = RunSchedule(checkpoint_interval=3, batch_envs=4, total_env_steps=12 * 4, env_steps=4 * 4)
    assert s.next_checkpoint_it == 6
    assert due_iterations(s, 4, 4, 12) == [6, 9]


def test_the_learner_counts_iterations_from_env_steps_that_come_in_uneven_amounts():
    s = RunSchedule(checkpoint_interval=2, batch_envs=10, total_env_steps=100, env_steps=0)
    seen = [steps for steps in (7, 15, 21, 38, 45, 61, 99, 100) if s.checkpoint_due(steps)]
    assert seen == [21, 45, 61, 99]   # iterations 2, 4, 6 and 9 (past 8), each the first time; 100 is the end


def test_interval_0_means_no_periodic_checkpoints():
    s = RunSchedule(checkpoint_interval=0, batch_envs=4, total_env_steps=40, env_steps=0)
    assert due_iterations(s, 4, 0, 10) == []
