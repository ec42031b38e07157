"""What a run reports, for both trainers: scalars (TensorBoard under run_dir/tb, one JSON line per
log point in run_dir/metrics.jsonl, and Weights & Biases when logging.wandb.enabled), one console
progress line per log window, the final ones when the run ends, however short it was, and a
summary at the end (wall time, counts, eval returns, where the files are, what to run next).

Metric names (documented in docs/operations.md) are the contract: the synchronous trainer and the
async learner write the same names so runs compare side by side. Every rate is measured over
the log window from cumulative counters:
  perf/env_steps_per_s   env steps produced per second (async: by all collectors)
  perf/updates_per_s     gradient updates per second
  perf/learn_pct         100 x the window's wall time spent in updates / the window's wall time
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from fastsac.common.episodes import EpisodeWindow
from fastsac.evaluation.result import line, scalars
from fastsac.run_dir.checkpoint import fsync_dir
from fastsac.run_dir.contents import METRICS_FILE, TB_DIR, Lineage


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def rewind_metrics(path: Path, upto: int | None, run_id: str) -> int:
    """Drop the rows of metrics.jsonl past env step `upto` (None: every row): what an earlier start
    logged after the checkpoint this one resumes from, which this start logs again (rows would
    repeat and go backwards otherwise), and a torn last line. The file is rewritten atomically
    (temp file, fsync, rename), and only when a row goes. Returns this start's incarnation: one
    more than the kept rows of run_id carry."""
    try:
        lines = path.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return 1
    kept, incarnation = [], 0
    for text in lines:
        try:
            row = json.loads(text)
        except ValueError:
            row = None
        steps = row.get("env_steps") if isinstance(row, dict) else None
        if upto is None or not text.endswith("\n") or not isinstance(steps, int) or steps > upto:
            continue
        kept.append(text)
        if row.get("run_id") == run_id and isinstance(row.get("incarnation"), int):
            incarnation = max(incarnation, row["incarnation"])
    if len(kept) < len(lines):
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    return incarnation + 1


class MetricsLogger:
    """Writes scalars to TensorBoard (run_path/tb), to run_path/metrics.jsonl (one JSON object per
    call: env_steps, wall_time, the run id and this start's incarnation, and the scalars by their
    TensorBoard names) and optionally to W&B (fastsac.training.wandb_sink), and lines to stdout.

    `lineage` (the run this process continues): both files start where its checkpoint is. Rows
    past the resumed checkpoint's env step are dropped from metrics.jsonl and TensorBoard purges
    its events from the step after it; a fresh start keeps no earlier row."""

    def __init__(self, run_path: Path, tensorboard: bool = True, console: bool = True, cfg=None,
                 lineage: Lineage | None = None):
        self.console_enabled = console
        self.writer = self.jsonl = self.wandb = None
        self.stamp: dict = {}
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # heavy, and only with logging.tensorboard
            Path(run_path).mkdir(parents=True, exist_ok=True)
            purge_step = None
            if lineage is not None:
                upto = lineage.resumed_at
                incarnation = rewind_metrics(Path(run_path) / METRICS_FILE, upto, lineage.run_id)
                self.stamp = {"run_id": lineage.run_id, "incarnation": incarnation}
                purge_step = 0 if upto is None else upto + 1
            self.writer = SummaryWriter(log_dir=str(Path(run_path) / TB_DIR), purge_step=purge_step)
            self.jsonl = open(Path(run_path) / METRICS_FILE, "a", buffering=1)   # line-buffered
            if cfg is not None and cfg.logging.wandb.enabled:
                try:
                    from fastsac.training.wandb_sink import WandbSink   # the optional extra, only when asked for
                    self.wandb = WandbSink(cfg)
                except Exception as exc:   # noqa: BLE001 -- any W&B failure: W&B only is lost
                    self._wandb_failed("could not start", exc)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is None:
            return
        finite = {name: float(value) for name, value in values.items()
                  if value is not None and not (isinstance(value, float) and math.isnan(value))}
        for name, value in finite.items():
            self.writer.add_scalar(name, value, step)
        self.jsonl.write(json.dumps({"env_steps": int(step), "wall_time": round(time.time(), 3), **self.stamp,
                                     **finite}) + "\n")
        if self.wandb is not None:
            try:
                self.wandb.log(step, finite)
            except Exception as exc:   # noqa: BLE001 -- a lost connection, a full disk under wandb/
                self._wandb_failed("failed", exc)

    def _wandb_failed(self, what: str, exc: Exception) -> None:
        """W&B is a third copy of the scalars: its failure never stops training. Warned once, then
        off for the rest of the run; TensorBoard and metrics.jsonl go on."""
        self.wandb = None
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        print(f"warning: Weights & Biases {what} ({type(exc).__name__}: {reason}); training goes on without it "
              "(the scalars are still written to TensorBoard and metrics.jsonl)", file=sys.stderr, flush=True)

    def line(self, text: str) -> None:
        if self.console_enabled:
            print(text, flush=True, file=sys.stdout)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
        if self.wandb is not None:
            try:
                self.wandb.close()
            except Exception as exc:   # noqa: BLE001 -- the run is over; its files are written
                self._wandb_failed("failed to finish", exc)
            self.wandb = None


class Telemetry:
    """One log window at a time: the trainer adds update time (learn_time) and the last update's
    losses (last_train); log() turns the counters into scalars and the progress line."""

    def __init__(self, cfg, env_steps: int, num_updates: int, total_env_steps: int, episode_steps: int = 0,
                 lineage: Lineage | None = None):
        self.cfg = cfg
        self.metrics = MetricsLogger(cfg.run_path, cfg.logging.tensorboard, cfg.logging.console, cfg, lineage)
        self.episodes = EpisodeWindow()
        self.last_train: dict = {}
        self.total_env_steps = total_env_steps
        self.episode_steps = episode_steps          # the task's episode length, for "no episode ended yet"
        self.created = time.perf_counter()
        self.last_eval: dict | None = None
        self.best_eval: dict | None = None
        self._env_steps, self._updates = env_steps, num_updates
        self._announced = False
        self.start(env_steps)

    def start(self, env_steps: int) -> None:
        """Begin the first window now (the run's clock starts here too)."""
        if not self._announced:
            self._announced = True
            self.metrics.line(f"run started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}: {self.cfg.run_path} "
                              f"(TensorBoard files in {self.cfg.run_path / TB_DIR})")
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
        # the ETA at the window's ingest rate: the phase the run is in now (warm-up steps are cheap)
        rate = (env_steps - self._env_steps) / dt
        eta = (self.total_env_steps - env_steps) / rate if rate > 0 else math.inf
        evaluated = f"eval {self.last_eval['mean_return']:.1f} | " if self.last_eval else ""
        self.metrics.line(
            f"[{it}/{cfg.trainer.num_iterations}] {env_steps:,} steps | {out['perf/env_steps_per_s']:,.0f} env-steps/s | "
            f"{out['perf/updates_per_s']:.1f} upd/s | learn {out['perf/learn_pct']:.0f}% | {line_extra}"
            f"return {self._return_text()} | {evaluated}{format_duration(now - self.created)}, "
            f"ETA {format_duration(eta)}")
        for row in rows:
            self.metrics.line(row)
        self.window_start, self.learn_time = now, 0.0
        self._env_steps, self._updates = env_steps, num_updates
        self.next_log_it = (it // cfg.logging.interval + 1) * cfg.logging.interval
        return out

    def _return_text(self) -> str:
        if not math.isnan(self.episodes.mean_return):
            return f"{self.episodes.mean_return:.1f}"
        length = f"; episodes are {self.episode_steps:,} steps" if self.episode_steps else ""
        return f"- (no episode ended yet{length})"

    def log_eval(self, result: dict) -> None:
        """An evaluation's eval/* scalars at the env step of the weights it evaluated, and its line
        (fastsac.evaluation.episodes); the env step may lie behind the progress line's."""
        self.metrics.scalars(result["env_steps"], scalars(result))
        self.metrics.line(line(result))
        self.last_eval = result
        if self.best_eval is None or result["mean_return"] > self.best_eval["mean_return"]:
            self.best_eval = result

    def summary(self, env_steps: int, num_updates: int, checkpoint: Path | None) -> None:
        """The run's last lines: what it did, what it reached, where it is, what to run next."""
        run = self.cfg.run_path
        lines = [f"run summary: {format_duration(time.perf_counter() - self.created)} wall, {env_steps:,} env steps, "
                 f"{num_updates:,} updates"]
        if self.last_eval:
            b = self.best_eval
            lines.append(f"  eval return (deterministic, {self.last_eval['episodes']} episodes): final "
                         f"{self.last_eval['mean_return']:.1f} at {self.last_eval['env_steps']:,} env steps, best "
                         f"{b['mean_return']:.1f} at {b['env_steps']:,}")
        if not math.isnan(self.episodes.mean_return):
            lines.append(f"  training episodes: mean return {self.episodes.mean_return:.1f} in the last log window")
        lines.append(f"  checkpoint: {checkpoint if checkpoint else 'none written'}")
        if self.metrics.writer is not None:
            lines.append(f"  metrics: tensorboard --logdir {run / TB_DIR}   (also {run / METRICS_FILE})")
        if checkpoint:
            lines += [f"  evaluate: fastsac-eval {run} --episodes 10", f"  export:   fastsac-export {run} "
                                                                      f"--format onnx {run / 'actor.onnx'}"]
        for text in lines:
            self.metrics.line(text)

    def close(self) -> None:
        self.metrics.close()
