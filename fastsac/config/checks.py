"""What one key alone cannot say: the checks across keys (job name, devices, value pairs, the
collectors' and the learners' lists, eval seeds, the machines of a distributed job), run on every
config after its keys were read.

Checks that need the machine (CPUs, memory, /dev/shm, GPUs, files) live in fastsac.launch.preflight
and fastsac.machine (plan, placement); this module checks what the config alone decides.
"""
from __future__ import annotations

import os

from fastsac.config.distributed_env import resolve_distributed_env
from fastsac.config.schema import DEVICE_RE, INT64_MAX, JOB_NAME_RE, AsyncOptions, Config
from fastsac.errors import ConfigError


def placement_keys_set(ao: AsyncOptions) -> list[str]:
    """The placement keys set in `ao`: they only mean something when processes are bound, so
    numa_binding 'auto' binds when any is set and 'off' with any is a contradiction."""
    return [k for k, on in (("numa_nodes", bool(ao.numa_nodes)), ("cpus_per_collector", ao.cpus_per_collector > 0),
                            ("learner_numa_node", ao.learner_numa_node >= 0),
                            ("placement", ao.placement != "spread")) if on]


def check_binding_keys(ao: AsyncOptions) -> None:
    """numa_binding 'off' with a placement key is a contradiction: say so instead of ignoring the key."""
    if ao.numa_binding != "off":
        return
    for key in placement_keys_set(ao):
        raise ConfigError(f"trainer.async_options.{key}: {getattr(ao, key)!r} contradicts "
                          f"trainer.async_options.numa_binding: 'off' (nothing is bound with 'off'); remove {key}, "
                          "or set numa_binding to 'auto', 'numactl' or 'inprocess'")


def check_cross_fields(cfg: Config) -> None:
    if not JOB_NAME_RE.match(cfg.job_name):
        raise ConfigError(f"job_name: {cfg.job_name!r} cannot name a shared-memory segment; "
                          "use 1-32 characters from A-Z a-z 0-9 _ -")
    for key in ("device", "trainer.async_options.collector_inference_device"):
        value = cfg.device if key == "device" else cfg.trainer.async_options.collector_inference_device
        if not DEVICE_RE.match(value):
            raise ConfigError(f"{key}: {value!r} is not valid; expected auto, cpu, cuda or cuda:N")
    a = cfg.algo
    if a.v_min >= a.v_max:
        raise ConfigError(f"algo.v_min: {a.v_min} must be below algo.v_max ({a.v_max})")
    if a.log_std_min >= a.log_std_max:
        raise ConfigError(f"algo.log_std_min: {a.log_std_min} must be below algo.log_std_max ({a.log_std_max})")
    if a.num_steps >= a.buffer_size:
        raise ConfigError(f"algo.num_steps: {a.num_steps} must be below algo.buffer_size ({a.buffer_size})")
    if a.trunk_shape == "tapered":
        for net in ("actor", "critic"):
            hidden, layers = getattr(a, f"{net}_hidden_dim"), getattr(a, f"{net}_num_layers")
            if hidden >> (layers - 1) < 1:
                raise ConfigError(f"algo.{net}_hidden_dim: {hidden} is too narrow for {layers} tapered layers (each "
                                  f"half as wide as the one before); use at least {1 << (layers - 1)}, fewer "
                                  f"algo.{net}_num_layers, or algo.trunk_shape: uniform")
    steps = cfg.trainer.num_iterations * cfg.env.num_envs
    if steps > INT64_MAX:  # env-step counters (checkpoints, control block, metrics) are int64
        raise ConfigError(f"trainer.num_iterations: {cfg.trainer.num_iterations} iterations x env.num_envs "
                          f"{cfg.env.num_envs} = {steps} env steps do not fit the 64-bit step counters; "
                          f"expected a product <= {INT64_MAX}")
    ao = cfg.trainer.async_options
    check_binding_keys(ao)
    if cfg.env.num_envs < ao.num_collectors:
        raise ConfigError(f"env.num_envs: {cfg.env.num_envs} is fewer than trainer.async_options.num_collectors "
                          f"({ao.num_collectors}); every collector needs at least one env")
    if ao.numa_nodes and len(ao.numa_nodes) != ao.num_collectors:
        raise ConfigError(f"trainer.async_options.numa_nodes: {ao.numa_nodes} has {len(ao.numa_nodes)} entries but "
                          f"num_collectors is {ao.num_collectors}; give one node per collector or leave it empty")
    for i, cid in enumerate(ao.manual_collectors):
        if not 0 <= cid < ao.num_collectors:
            raise ConfigError(f"trainer.async_options.manual_collectors[{i}]: {cid} is not a collector id; "
                              f"valid ids are 0..{ao.num_collectors - 1}")
        if cid in ao.manual_collectors[:i]:
            raise ConfigError(f"trainer.async_options.manual_collectors[{i}]: collector {cid} is listed twice "
                              f"({ao.manual_collectors}); list each collector id once")
    _check_eval(cfg)
    _check_distributed(cfg)
    # numpy-free at import: fastsac.envs loads numpy, and a config is read before a process binds itself
    from fastsac.envs.registry import check_env_name
    check_env_name(cfg.env.name)


def _check_eval(cfg: Config) -> None:
    ev, n = cfg.eval, cfg.trainer.async_options.num_collectors
    if ev.seed >= 0 and cfg.seed <= ev.seed < cfg.seed + n:
        raise ConfigError(f"eval.seed: {ev.seed} is the seed of training collector {ev.seed - cfg.seed}; evaluation "
                          f"must not replay training episodes: use -1 (derived) or a seed outside "
                          f"{cfg.seed}..{cfg.seed + n - 1}")


def _check_distributed(cfg: Config) -> None:
    d, ao = cfg.distributed, cfg.trainer.async_options
    resolve_distributed_env(d, os.environ)
    if d.node_rank >= d.nnodes:
        raise ConfigError(f"distributed.node_rank: {d.node_rank} is not a machine of distributed.nnodes={d.nnodes}; "
                          f"expected 0..{d.nnodes - 1}")
    if (d.num_learners > 1 or d.nnodes > 1) and not cfg.trainer.asynchronous:
        raise ConfigError("distributed.num_learners/nnodes: several learners need trainer.asynchronous: true "
                          "(the synchronous trainer is one process)")
    if d.learner_devices and len(d.learner_devices) != d.num_learners:
        raise ConfigError(f"distributed.learner_devices: {d.learner_devices} has {len(d.learner_devices)} entries "
                          f"but num_learners is {d.num_learners}; give one device per learner or leave it empty")
    for i, dev in enumerate(d.learner_devices):
        if not DEVICE_RE.match(dev) or dev == "auto":
            raise ConfigError(f"distributed.learner_devices[{i}]: {dev!r} is not valid; expected cpu, cuda or cuda:N")
    if d.num_learners > ao.num_collectors:
        raise ConfigError(f"distributed.num_learners: {d.num_learners} learners but only "
                          f"{ao.num_collectors} collector(s) (trainer.async_options.num_collectors); "
                          "every learner needs at least one collector of its own")
    if d.collector_learners:
        if len(d.collector_learners) != ao.num_collectors:
            raise ConfigError(f"distributed.collector_learners: {d.collector_learners} has "
                              f"{len(d.collector_learners)} entries but num_collectors is {ao.num_collectors}; "
                              "give one learner index per collector or leave it empty")
        for i, r in enumerate(d.collector_learners):
            if not 0 <= r < d.num_learners:
                raise ConfigError(f"distributed.collector_learners[{i}]: {r} is not a learner; valid learner "
                                  f"indices are 0..{d.num_learners - 1}")
        idle = sorted(set(range(d.num_learners)) - set(d.collector_learners))
        if idle:
            raise ConfigError(f"distributed.collector_learners: learner {idle[0]} has no collector; every learner "
                              "needs at least one collector of its own")
