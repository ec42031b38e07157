"""Every seed of a job, derived in one place from the job's `seed` (docs/processes.md, "Seeds").

  env with global id g:           SeedSequence([seed, g]) (env_seed_sequence); EnvPool: one 32-bit
                                  seed per env, (hash(seed) + g) mod 2**32 (envpool_env_seeds)
  a shard's reset:                seed, or from (seed, restart, start_env_steps) after a restart
                                  or a resume (reset_seed): nothing replays, a resume repeats
  collector i on machine r:       torch seed + i + r * node_stride; its uniform warm-up actions
                                  from (seed + i, incarnation, start_env_steps[, r])
  the synchronous trainer:        torch seed; warm-up actions from (seed, start iteration)
  learner (rank k of a group):    torch seed + k
  eval envs:                      eval.seed, or derived (eval_seed), never a collector's seed + i

Changing one changes a seed's results: each is part of a run's reproducibility. Numpy-free at
import: the placement plan (loaded before a process binds itself) shows the collectors' seeds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_EVAL_SEED_TAG = 0x6576616C   # "eval": keys the derived seed apart from every other use of the job's seed


def env_seed_sequence(seed: int, first_env_id: int, num_envs: int) -> list[np.random.SeedSequence]:
    """One independent SeedSequence per *global* env id.

    Keyed by (seed, global env id), so collector shards of one job never share a stream
    and a shard's streams do not depend on how many collectors split the envs.
    """
    import numpy as np  # numpy-free at import (see the module docstring)
    return [np.random.SeedSequence([seed, first_env_id + i]) for i in range(num_envs)]


def envpool_env_seeds(seed: int, first_env_id: int, num_envs: int) -> np.ndarray:
    """EnvPool's per-env seeds (int32) of the global env ids [first_env_id, first_env_id + num_envs)."""
    import numpy as np  # numpy-free at import (see the module docstring)
    base = int(np.random.SeedSequence(seed).generate_state(1, np.uint32)[0])
    ids = np.arange(first_env_id, first_env_id + num_envs, dtype=np.uint64)
    return ((base + ids) % 2**32).astype(np.uint32).view(np.int32)


def reset_seed(seed: int, restart: int = 0, start_env_steps: int = 0) -> int:
    """The seed a shard's envs are reset with; each env derives its stream from (it, global env id).

    A fresh start uses the job's seed. A restarted collector (restart > 0) or a resumed run
    (start_env_steps > 0: the checkpoint's env steps) must not replay the episodes it already
    played, yet stay reproducible: the seed is derived from all three. The one place that
    decides it, for the collectors and the synchronous trainer alike.
    """
    import numpy as np  # numpy-free at import (see the module docstring)
    if restart == 0 and start_env_steps == 0:
        return seed
    return int(np.random.SeedSequence([seed, restart, start_env_steps]).generate_state(1, np.uint32)[0])


def collector_seed(seed: int, collector_id: int) -> int:
    """The seed the plan shows for collector i."""
    return seed + collector_id


def collector_torch_seed(seed: int, collector_id: int, node_rank: int, node_stride: int) -> int:
    """Collector i of machine r samples its policy's actions from torch seed + i + r * stride
    (stride: the most collectors a machine may have), so no two collectors of a job share one."""
    return collector_seed(seed, collector_id) + node_rank * node_stride


def collector_action_seed(seed: int, collector_id: int, incarnation: int, start_env_steps: int,
                          node_rank: int) -> list[int]:
    """Entropy of a collector's warm-up action generator: distinct per incarnation and resume."""
    return [collector_seed(seed, collector_id), incarnation, start_env_steps] + ([node_rank] if node_rank else [])


def sync_action_seed(seed: int, start_iteration: int) -> list[int]:
    """Entropy of the synchronous trainer's warm-up action generator (a resume draws anew)."""
    return [seed, start_iteration]


def learner_torch_seed(seed: int, rank: int = 0) -> int:
    """A learner's torch seed (replay sampling, the actions of its updates); ranks differ."""
    return seed + rank


def eval_seed(train_seed: int, num_collectors: int) -> int:
    """A seed derived from the training seed, never one a collector of the job used (seed + i)."""
    import numpy as np  # numpy-free at import (see the module docstring)
    used = {collector_seed(train_seed, i) for i in range(max(1, num_collectors))}
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
