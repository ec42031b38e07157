"""Weights & Biases as a third scalar sink (logging.wandb.enabled; optional extra fastsac[wandb]).

Written by the process that writes TensorBoard (the sync trainer, or the async learner of rank
0), with the same names. Every scalar is logged against `env_steps` (wandb.define_metric), not
W&B's own step counter, so an evaluation's scalars, which belong to the env step of the weights
it evaluated and may lie behind the progress line's, are kept rather than dropped as
out-of-order. The run's files go under run_dir/wandb; offline mode writes there only (`wandb
sync run_dir/wandb/offline-run-*` uploads later); a resumed run continues the same W&B run (its
id is kept in run_dir/wandb/fastsac_run_id).
"""
from __future__ import annotations

import secrets
from pathlib import Path

import wandb  # the optional extra: this module is imported only when logging.wandb.enabled

from fastsac.config import config_to_dict
from fastsac.run_dir.contents import WANDB_DIR

STEP_METRIC = "env_steps"
RUN_ID_FILE = "fastsac_run_id"


def _run_id(directory: Path) -> str:
    path = directory / RUN_ID_FILE
    if path.exists():
        return path.read_text().strip()
    run_id = secrets.token_hex(8)
    path.write_text(run_id + "\n")
    return run_id


class WandbSink:
    def __init__(self, cfg):
        w = cfg.logging.wandb
        directory = cfg.run_path / WANDB_DIR
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=w.project, entity=w.entity or None, name=w.run_name or cfg.job_name,
                              mode=w.mode, dir=str(cfg.run_path), id=_run_id(directory), resume="allow",
                              config=config_to_dict(cfg))
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("*", step_metric=STEP_METRIC)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({STEP_METRIC: int(step), **values})

    def close(self) -> None:
        self.run.finish()
