"""The settings every learner of a group must share, compared at the rendezvous (torch-free).

Learners average their gradients: two machines whose configs differ in gamma, the batch size,
a learning rate or the envs would average gradients of different objectives and train to the
end without a word. So at the rendezvous every rank publishes its config minus the keys that
are each machine's own, and every rank compares all the others' with its own: any difference
stops every rank with exit 2, naming the keys and both values.

Each machine's own: where it writes and what it is called (job_name, run_dir), which of its
checkpoints it resumes (only rank 0 reads one), its devices and its placement (numa keys,
collectors and their learners), its node_rank, how its launcher supervises (timeouts,
restarts), and what only rank 0 does (logging.*, checkpoint.*, eval.*: rank 0 alone logs,
checkpoints and evaluates). Everything else, the whole training objective, must match.
"""
from __future__ import annotations

from fastsac.config import Config, config_to_dict

PER_MACHINE_KEYS = frozenset({
    "job_name", "run_dir", "resume", "device",
    "distributed.node_rank", "distributed.learner_devices", "distributed.collector_learners",
    "distributed.master_addr",     # a name or an address of the same host: they did meet there
    "trainer.async_options.num_collectors", "trainer.async_options.collector_inference_device",
    "trainer.async_options.numa_binding", "trainer.async_options.placement", "trainer.async_options.numa_nodes",
    "trainer.async_options.cpus_per_collector", "trainer.async_options.learner_numa_node",
    "trainer.async_options.manual_collectors", "trainer.async_options.collector_wait_s",
    "trainer.async_options.max_restarts", "trainer.async_options.restart_backoff_s",
    "trainer.async_options.restart_reset_s", "trainer.async_options.heartbeat_timeout_s",
    "trainer.async_options.stop_timeout_s",
})
PER_MACHINE_SECTIONS = ("logging.", "checkpoint.", "eval.")   # rank 0's alone


def _flatten(data: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def shared_settings(cfg: Config) -> dict[str, object]:
    """The dotted keys of cfg that every machine of the group must have equal."""
    return {k: v for k, v in _flatten(config_to_dict(cfg)).items()
            if k not in PER_MACHINE_KEYS and not k.startswith(PER_MACHINE_SECTIONS)}


def differences(mine: dict, theirs: dict) -> list[tuple[str, object, object]]:
    """(key, my value, their value) for every key that differs, in key order."""
    missing = "<absent>"
    return [(k, mine.get(k, missing), theirs.get(k, missing)) for k in sorted(set(mine) | set(theirs))
            if mine.get(k, missing) != theirs.get(k, missing)]
