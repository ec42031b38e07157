"""Every seed of a job, derived in one place from the job's `seed`.

  collector i (its envs, its policy's sampling):       seed + i
  eval envs (`eval.seed`, or -1: derived):              resolve_eval_seed, never a collector's
The derivations are part of a run's reproducibility: change one and a seed's results change.
Torch-free.
"""
from __future__ import annotations

import numpy as np

_EVAL_SEED_TAG = 0x6576616C   # "eval": keys the derived seed apart from every other use of the job's seed


def eval_seed(train_seed: int, num_collectors: int) -> int:
    """A seed derived from the training seed, never one a collector of the job used (seed + i)."""
    used = {train_seed + i for i in range(max(1, num_collectors))}
    tag = _EVAL_SEED_TAG
    while True:
        seed = int(np.random.SeedSequence([train_seed, tag]).generate_state(1, np.uint32)[0])
        if seed not in used:
            return seed
        tag += 1


def resolve_eval_seed(cfg) -> int:
    """eval.seed, or the seed derived from the training seed (none a training env uses)."""
    if cfg.eval.seed >= 0:
        return cfg.eval.seed
    return eval_seed(cfg.seed, cfg.trainer.async_options.num_collectors)
