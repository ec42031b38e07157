"""What a run reports, for both trainers: TensorBoard scalars and one console progress line per
log window, and the final ones when the run ends, however short it was.

Metric names (documented in docs/operations.md) are the contract: the synchronous trainer and the
async learner write the same names so runs compare side by side. Every rate is measured over
the log window from cumulative counters:
  perf/env_steps_per_s   env steps produced per second (async: by all collectors)
  perf/updates_per_s     gradient updates per second
  perf/learn_pct         100 x the window's wall time spent in updates / the window's wall time
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from fastsac.common.episodes import EpisodeWindow
from fastsac.common.eval_result import line, scalars


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def fmt(value: float, spec: str = ".1f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


class MetricsLogger:
    """Writes scalars to TensorBoard under run_path/tb and lines to stdout."""

    def __init__(self, run_path: Path, tensorboard: bool = True, console: bool = True):
        self.console_enabled = console
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # heavy, and only with logging.tensorboard
            self.writer = SummaryWriter(log_dir=str(Path(run_path) / "tb"))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                self.writer.add_scalar(name, float(value), step)

    def line(self, text: str) -> None:
        if self.console_enabled:
            print(text, flush=True, file=sys.stdout)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class Telemetry:
    """One log window at a time: the trainer adds update time (learn_time) and the last update's
    losses (last_train); log() turns the counters into scalars and the progress line."""

    def __init__(self, cfg, env_steps: int, num_updates: int, total_env_steps: int):
        self.cfg = cfg
        self.metrics = MetricsLogger(cfg.run_path, cfg.logging.tensorboard, cfg.logging.console)
        self.episodes = EpisodeWindow()
        self.last_train: dict = {}
        self.total_env_steps = total_env_steps
        self._env_steps, self._updates = env_steps, num_updates
        self.start(env_steps)

    def start(self, env_steps: int) -> None:
        """Begin the first window now (the run's clock for the ETA starts here too)."""
        self.run_start = self.window_start = time.perf_counter()
        self.start_env_steps = self._env_steps = env_steps
        self.learn_time = 0.0
        self.next_log_it = (env_steps // self.cfg.env.num_envs // self.cfg.logging.interval + 1) * \
            self.cfg.logging.interval

    def due(self, env_steps: int) -> bool:
        """Every logging.interval iterations, and at least every logging.interval_s seconds."""
        return (env_steps // self.cfg.env.num_envs >= self.next_log_it
                or time.perf_counter() - self.window_start >= self.cfg.logging.interval_s)

    def has_news(self, env_steps: int, num_updates: int) -> bool:
        """Anything happened since the last log? (the final log of a run that just logged is skipped:
        a second point at the same step would read all rates as 0)"""
        return env_steps != self._env_steps or num_updates != self._updates

    def log(self, env_steps: int, num_updates: int, episode_totals: tuple[int, float, int],
            scalars: dict | None = None, line_extra: str = "", rows: list[str] = ()) -> dict:
        """Close the window: write the scalars (the trainer's own plus the common ones) and the
        progress line; returns every scalar written."""
        cfg, now = self.cfg, time.perf_counter()
        dt = max(now - self.window_start, 1e-9)
        it = env_steps // cfg.env.num_envs
        self.episodes.take(*episode_totals)
        out = {"rollout/mean_return": self.episodes.mean_return, "rollout/mean_ep_len": self.episodes.mean_length,
               "perf/env_steps_per_s": (env_steps - self._env_steps) / dt,
               "perf/updates_per_s": (num_updates - self._updates) / dt,
               "perf/learn_pct": 100.0 * self.learn_time / dt}
        out.update(scalars or {})
        out.update({f"train/{k}": float(v) for k, v in self.last_train.items()})
        self.metrics.scalars(env_steps, out)
        done = env_steps - self.start_env_steps
        eta = (now - self.run_start) / done * (self.total_env_steps - env_steps) if done else math.inf
        self.metrics.line(
            f"[{it}/{cfg.trainer.num_iterations}] {env_steps:,} steps | {out['perf/env_steps_per_s']:,.0f} env-steps/s | "
            f"{out['perf/updates_per_s']:.1f} upd/s | learn {out['perf/learn_pct']:.0f}% | {line_extra}"
            f"return {fmt(self.episodes.mean_return)} | ETA {format_duration(eta)}")
        for row in rows:
            self.metrics.line(row)
        self.window_start, self.learn_time = now, 0.0
        self._env_steps, self._updates = env_steps, num_updates
        self.next_log_it = (it // cfg.logging.interval + 1) * cfg.logging.interval
        return out

    def log_eval(self, result: dict) -> None:
        """An evaluation's eval/* scalars at the env step of the weights it evaluated, and its line
        (fastsac.run.eval_episodes); the env step may lie behind the progress line's."""
        self.metrics.scalars(result["env_steps"], scalars(result))
        self.metrics.line(line(result))

    def close(self) -> None:
        self.metrics.close()
