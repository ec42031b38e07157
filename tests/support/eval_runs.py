"""Tiny runs with evaluation on: a config file's eval section, and the eval/* scalars of a run read
back from its TensorBoard files."""
from __future__ import annotations

import yaml

PENDULUM_STEPS = 200
EVAL_TAGS = ("eval/mean_return", "eval/mean_ep_len", "eval/min_return", "eval/max_return", "eval/min_ep_len",
             "eval/max_ep_len", "eval/seconds")


def with_eval(path, **ev):
    """tiny_config's file with an eval section."""
    d = yaml.safe_load(path.read_text())
    d["eval"] = ev
    path.write_text(yaml.safe_dump(d))
    return path


def eval_points(run_dir) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every eval/* scalar in the run's TensorBoard files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"] if t.startswith("eval/")}
