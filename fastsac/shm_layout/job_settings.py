"""The settings every process of a job must agree on, recorded by the launcher in the control
block and checked by each process that attaches before it touches anything shared.

A collector started by hand with another config (another env, num_envs, ring capacity, seed,
actor size) would otherwise create a ring or snapshot of another shape, or feed the replay
buffer with transitions of another task: it is refused with exit 2 and a list of every
differing key with both values. Torch-free (the launcher imports it).
"""
from __future__ import annotations

from fastsac.config import Config, ConfigError
from fastsac.shm_layout.common import LAYOUT_VERSION

# Keys whose values decide the shared layouts (ring and snapshot shapes, env row blocks) or the
# meaning of the data (which task, which seeds, which policy the collectors run).
CONFIG_KEYS = (
    "env.name", "env.num_envs", "env.max_episode_steps", "seed",
    "trainer.async_options.num_collectors", "trainer.async_options.ring_capacity",
    "algo.actor_hidden_dim", "algo.actor_num_layers", "algo.trunk_shape", "algo.log_std_min", "algo.log_std_max",
    "algo.obs_normalization", "algo.learning_starts",
    "distributed.num_learners", "distributed.nnodes", "distributed.node_rank",
)


def _get(cfg: Config, dotted: str):
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def job_settings(cfg: Config, plan) -> dict:
    """What the launcher records: the config keys above, the env split and the layout version."""
    settings = {key: _get(cfg, key) for key in CONFIG_KEYS}
    settings["env rows per collector"] = [[c.env_first, c.env_count] for c in plan.collectors]
    # a collector fed by another learner than the job planned would write ingest records it does not own
    settings["learner per collector"] = [c.learner_index for c in plan.collectors]
    settings["shared-memory layout version"] = LAYOUT_VERSION
    return settings


def differences(recorded: dict, mine: dict) -> list[str]:
    """'key: A in the job, B here' for every key whose values differ (keys of either side)."""
    out = []
    for key in sorted(set(recorded) | set(mine)):
        a, b = recorded.get(key, "<absent>"), mine.get(key, "<absent>")
        if a != b:
            out.append(f"{key}: {a!r} in the running job, {b!r} here")
    return out


def check_against_job(ctl, cfg: Config, plan, who: str) -> None:
    """ConfigError (exit 2) when this process's settings differ from those the job recorded."""
    diff = differences(ctl.job_settings(), job_settings(cfg, plan))
    if diff:
        raise ConfigError(f"{who} does not match the running job {cfg.job_name!r} and was refused before touching "
                          "its shared memory; start it with the job's config and overrides "
                          "(`fastsac-launch CONFIG --plan` prints the exact command). Differences:\n  "
                          + "\n  ".join(diff))
