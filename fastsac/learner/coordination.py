"""How a learner agrees with the rest of its job, for the one loop (fastsac.learner.loop.Learner):
alone (SoloCoordination, here) or as one rank of a learner group (GroupCoordination in
fastsac.learner.group_coordination, the only one that loads torch.distributed).

The loop asks its coordination, in this order:

  start       where it starts (StartState): the job's env steps (a checkpoint's, or 0), its
              env-step batch, its budget, and whether this learner writes the checkpoints
  telemetry   what it reports (a group: rank 0 the job's totals, the others their status only)
  wait        until every collector of the job attached once, and the stop agreement meanwhile
  quota       the transitions it may still ingest (a group: its share of the job's rest)
  count       the transitions an iteration adds to the job's env steps (a group: every rank's),
              and whether the replay buffer is ready to train on
  stop        whether to stop now: its own reason, or (a group) what the ranks agreed
  failures    the errors that end the loop as a failure of the coordination (a group: a peer's)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from fastsac.learner.learner_telemetry import LearnerTelemetry
from fastsac.process.setup import log
from fastsac.training import state as run_state

ROLE = "learner"
ATTACH_RETRY_S = 0.2     # how often missing rings/snapshots are looked for (collectors create them)

# the loop's own reason to stop (a signal, the launcher's stop flag, the launcher gone) and whether
# it is a failure of this learner's machine; (None, False): none
OwnStop = Callable[[], "tuple[str | None, bool]"]


@dataclass(frozen=True)
class StartState:
    """Where a learner starts: its job's position and size, restored from a checkpoint or fresh."""
    env_steps: int            # the job's env steps so far (0 = a fresh run)
    batch_envs: int           # transitions of one env-step batch of the job
    total_env_steps: int      # the job's budget in env steps
    writes_checkpoints: bool  # the one learner, or rank 0 of a group


@dataclass(frozen=True)
class Verdict:
    """Why the learner stops, and whether that makes its exit a failure (exit code 1)."""
    reason: str
    failed: bool = False


def restore(cfg, spec, agent) -> int:
    """The checkpoint named by `resume` into the agent (none: a fresh start): its env steps."""
    return run_state.restore(cfg, spec, agent, lambda m: log(ROLE, m))


def late_collectors(missing, wait_s: float) -> str:
    ids = ", ".join(str(f.cid) for f in missing)
    return (f"collector(s) {ids} did not attach within trainer.async_options.collector_wait_s={wait_s:g}s; start them "
            "(fastsac-launch CONFIG --plan prints the commands) or raise collector_wait_s")


class SoloCoordination:
    """The one learner of a job: the whole job is its own, and it decides alone."""
    failures: tuple[type[BaseException], ...] = ()

    def start(self, ctx, spec, agent, buffer, ctl, device) -> StartState:
        cfg = ctx.cfg
        self.started = StartState(env_steps=restore(cfg, spec, agent), batch_envs=cfg.env.num_envs,
                                  total_env_steps=cfg.trainer.num_iterations * cfg.env.num_envs,
                                  writes_checkpoints=True)
        return self.started

    def telemetry(self, cfg, ctl, feeds, num_updates: int) -> LearnerTelemetry:
        s = self.started
        return LearnerTelemetry(cfg, ctl, feeds, s.env_steps, num_updates, s.total_env_steps,
                                lineage=run_state.lineage(cfg))

    def wait_for_collectors(self, waiting_for, attach_round, own_stop: OwnStop, wait_s: float) -> Verdict | None:
        """Hold the job until every planned collector (manual ones included) attached once."""
        start = last_report = time.monotonic()
        while waiting_for():
            reason, _ = own_stop()
            if reason:
                return Verdict(reason)
            missing, now, last_report = attach_round(start, last_report)
            if missing and now - start > wait_s:
                return Verdict(late_collectors(missing, wait_s), failed=True)
            time.sleep(ATTACH_RETRY_S / 4)
        return None

    def quota(self, env_steps: int) -> int:
        """Transitions this learner may still ingest: the rest of the job's budget."""
        return self.started.total_env_steps - env_steps

    def count(self, transitions: int, own_stop: OwnStop) -> int:
        """The transitions this iteration adds to the job's env steps: its own."""
        return transitions

    def buffer_ready(self, buffer) -> bool:
        return buffer.ready()

    def stop(self, own_stop: OwnStop) -> Verdict | None:
        reason, _ = own_stop()
        return Verdict(reason) if reason else None

    def finishing(self, agent) -> None:
        """Before the final metrics and checkpoint: nothing to say alone."""

    def settle(self) -> str | None:
        return None

    def stop_beat(self) -> None:
        """Nothing beats for a learner alone."""

    def close(self) -> None:
        """Nothing to leave."""
