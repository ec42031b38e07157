"""Job configuration: one YAML file -> typed, validated dataclasses.

Torch-free on purpose: the launcher, `--plan` and the NUMA check mode load configs
without importing torch.

Validation is strict. Every problem raises `ConfigError` whose message names the full
dotted key path, the offending value and what would be valid (with the closest key for
a typo). The CLI turns a ConfigError into exit code 2 before anything touches the disk.

YAML is read strictly too (`load_config` and every override): an empty file, a duplicate key
and any alias are errors with the file and line. PyYAML would silently run an empty file with
every default, keep the last of two equal keys, recurse forever on a self-referencing alias and
expand a few hundred bytes of nested aliases into gigabytes; a job config needs none of that.

Checks that need the machine (CPUs, memory, /dev/shm, GPUs, files) live in fastsac.launch.preflight
and fastsac.machine.plan; this module checks what the config alone decides.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from fastsac.config.strict_yaml import YamlInputError, strict_yaml_load
from fastsac.errors import ConfigError  # its own module: fastsac.envs.registry raises it too

# Every integer ends up in an int64 somewhere (numpy/torch shapes, shared-memory counters): a
# bigger one would overflow there, far from the key that caused it.
INT64_MAX = 2**63 - 1
# Seeds: seed + collector id, seed + 7919 x restarts (collectors) or x iterations (sync trainer)
# go to numpy SeedSequence (non-negative ints) and torch.manual_seed (at most 2**64 - 1); a
# 32-bit seed leaves that arithmetic room for any run and is the range most tools accept.
SEED_MAX = 2**32 - 1
# Sizes: far above any machine's (the memory checks refuse what does not fit long before), low
# enough that no product of them (batch x width x atoms, envs x slots x dims) overflows an int64
# storage size: algo.batch_size=2**62 passed every check and killed the learner at its first update.
MAX_BATCH = 2**24        # transitions per update (the reference uses 8,192)
MAX_WIDTH = 2**16        # hidden units of a layer, C51 atoms
MAX_ENVS = 2**32         # parallel envs of a job (training or eval)
MAX_SLOTS = 2**40        # replay slots per env
MAX_LAYERS = 64          # hidden layers of a network
# A process is declared hung after heartbeat_timeout_s without a beat. One healthy beat interval
# can reach ~1 s (one reference-size update on a CPU learner, one step of 4096 Humanoid envs on
# one core), so anything below twice that kills healthy processes.
MIN_HEARTBEAT_TIMEOUT_S = 2.0
# A graceful stop lets the learner finish its iteration (up to ~1 s) and write the final
# checkpoint (a reference-size agent is ~100 MB: seconds on a slow disk) before escalation.
MIN_STOP_TIMEOUT_S = 5.0
# restart_backoff_s * 2**restarts must stay a finite float (2**1024 overflows).
MAX_RESTARTS = 1000


def _f(default: Any = dataclasses.MISSING, *, help: str = "", min: float | None = None,
       max: float | None = None, min_exclusive: bool = False, default_factory: Any = dataclasses.MISSING):
    meta = {"help": help, "min": min, "max": max, "min_exclusive": min_exclusive}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class EnvConfig:
    name: str = _f("pendulum", help="task name: a built-in env (see fastsac.envs.registry), gymnasium:<id>, envpool:<task id> or package.module:Class")
    num_envs: int = _f(4096, min=1, max=MAX_ENVS, help="total parallel envs, split across collectors")
    max_episode_steps: int = _f(0, min=0, help="episode length before truncation; 0 = the task's default")


@dataclass
class AlgoConfig:
    """FastSAC hyper-parameters. Defaults are the GPU reference values (holosoma / MotrixLab)."""
    actor_hidden_dim: int = _f(512, min=1, max=MAX_WIDTH)
    critic_hidden_dim: int = _f(768, min=1, max=MAX_WIDTH)
    actor_num_layers: int = _f(3, min=1, max=MAX_LAYERS, help="hidden layers of the actor MLP")
    critic_num_layers: int = _f(3, min=1, max=MAX_LAYERS, help="hidden layers of each critic MLP")
    trunk_shape: Literal["tapered", "uniform"] = _f(
        "tapered", help="hidden layer widths: tapered = hidden, hidden/2, hidden/4, ... (the reference FastSAC's); "
                        "uniform = every layer hidden wide")
    num_atoms: int = _f(101, min=2, max=MAX_WIDTH, help="C51 support size")
    v_min: float = _f(-20.0)
    v_max: float = _f(20.0)
    critic_init: Literal["uniform", "zero_return"] = _f(
        "uniform", help="the critics' initial return distribution: uniform = near-uniform over the support, every "
                        "initial Q (v_min + v_max) / 2 (the reference's); zero_return = a narrow bump at return 0")
    gamma: float = _f(0.97, min=0.0, max=1.0)
    tau: float = _f(0.125, min=0.0, max=1.0, min_exclusive=True, help="target network soft-update rate")
    batch_size: int = _f(8192, min=1, max=MAX_BATCH)
    num_updates: int = _f(8, min=0, help="gradient updates per env-step batch; 0 = collect only")
    policy_frequency: int = _f(4, min=1, help="actor update every N critic updates (alpha steps with every critic update)")
    num_steps: int = _f(1, min=1, help="n-step return horizon")
    buffer_size: int = _f(1024, min=2, max=MAX_SLOTS, help="replay slots per env (one circular row per env)")
    learning_starts: int = _f(10, min=0, help="env-step batches of random actions before the policy acts and updates start")
    actor_lr: float = _f(3e-4, min=0.0, min_exclusive=True)
    critic_lr: float = _f(3e-4, min=0.0, min_exclusive=True)
    alpha_lr: float = _f(3e-4, min=0.0, min_exclusive=True)
    adam_beta1: float = _f(0.9, min=0.0, max=1.0)
    adam_beta2: float = _f(0.95, min=0.0, max=1.0)
    weight_decay: float = _f(0.001, min=0.0)
    alpha_init: float = _f(0.001, min=0.0, min_exclusive=True)
    autotune_alpha: bool = _f(True)
    target_entropy_ratio: float = _f(0.0, help="target entropy = -act_dim * ratio")
    log_std_min: float = _f(-5.0)
    log_std_max: float = _f(0.0)
    obs_normalization: bool = _f(True)
    max_grad_norm: float = _f(0.0, min=0.0, help="gradient clipping; 0 = off")
    compile: bool = _f(False, help="torch.compile the update (CUDA only; ignored on CPU)")
    amp: bool = _f(False, help="bf16 autocast for the update (CUDA only; ignored on CPU)")
    tf32: bool = _f(True, help="TF32 tensor cores for fp32 matmuls and convolutions (CUDA only; ignored on CPU)")


@dataclass
class AsyncOptions:
    num_collectors: int = _f(1, min=1, help="collector processes; each owns one ring and one weight snapshot")
    ring_capacity: int = _f(16, min=2, help="slots (env-step batches) per collector ring")
    max_ingest_per_iter: int = _f(16, min=1, help="most slots the learner drains from all rings per iteration")
    utd_mode: Literal["strict", "learner_bound"] = _f("strict")
    weight_publish_interval: int = _f(8, min=1, help="publish actor weights every N updates")
    weight_poll_interval: int = _f(8, min=1, help="collectors poll their snapshot every N env steps")
    collector_inference_device: str = _f("auto", help="auto = the GPU of the learner it feeds, cpu when that learner "
                                                       "trains on the CPU | cpu | cuda | cuda:N")
    numa_binding: Literal["off", "auto", "numactl", "inprocess"] = _f(
        "auto", help="auto = bind when it pays: several collectors on a machine with several NUMA nodes, or a "
                     "placement key below is set; one collector or one node stays unbound")
    placement: Literal["spread", "colocate"] = _f("spread")
    numa_nodes: list[int] = _f(default_factory=list, help="explicit node per collector (overrides placement)")
    cpus_per_collector: int = _f(0, min=0, help="CPUs per collector inside a node; 0 = the node's CPUs shared evenly")
    learner_numa_node: int = _f(-1, min=-1, help="-1 = the GPU's node (node 0 when unknown)")
    learner_cpus: int = _f(2, min=0, help="CPUs a CUDA learner keeps for itself on its node when the collectors "
                                          "there share the node (cpus_per_collector 0); 0 = share them")
    manual_collectors: list[int] = _f(default_factory=list, help="collector ids the launcher leaves for a person to start")
    collector_wait_s: float = _f(600.0, min=0.0, min_exclusive=True,
                                 help="the learner holds the job (no env step counts) until every planned collector, "
                                      "manual ones included, attached once; fail after this long")
    max_restarts: int = _f(3, min=0, max=MAX_RESTARTS, help="restarts per collector before the job stops")
    restart_backoff_s: float = _f(1.0, min=0.0, help="delay before a restart; doubles with each restart")
    restart_reset_s: float = _f(600.0, min=0.0, min_exclusive=True,
                                help="a collector that ran this long since its last restart starts counting afresh")
    heartbeat_timeout_s: float = _f(30.0, min=MIN_HEARTBEAT_TIMEOUT_S,
                                    help="a process whose heartbeat is older than this is considered dead")
    stop_timeout_s: float = _f(120.0, min=MIN_STOP_TIMEOUT_S,
                               help="graceful stop (final checkpoint) deadline before SIGTERM/SIGKILL escalation")


@dataclass
class TrainerConfig:
    num_iterations: int = _f(1000, min=1, help="run length in env-step batches (per collector in async mode)")
    asynchronous: bool = _f(True)
    async_options: AsyncOptions = field(default_factory=AsyncOptions)


@dataclass
class WandbConfig:
    """Weights & Biases (fastsac.training.wandb_sink; optional extra fastsac[wandb]): off by default."""
    enabled: bool = _f(False, help="also log every scalar to W&B (needs pip install 'fastsac[wandb]')")
    project: str = _f("fastsac", help="W&B project")
    entity: str = _f("", help="W&B entity (user or team); '' = your default")
    mode: Literal["online", "offline"] = _f("online", help="offline: write under run_dir/wandb, `wandb sync` later")
    run_name: str = _f("", help="'' = the job_name")


@dataclass
class LoggingConfig:
    interval: int = _f(10, min=1, help="console + TensorBoard every N iterations")
    interval_s: float = _f(10.0, min=0.0, min_exclusive=True, help="and at least every this many seconds")
    tensorboard: bool = _f(True, help="TensorBoard files in run_dir/tb and the same scalars in run_dir/metrics.jsonl")
    console: bool = _f(True)
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class CheckpointConfig:
    interval: int = _f(500, min=0, help="checkpoint every N iterations; 0 = only at the end")
    keep: int = _f(3, min=1, help="newest checkpoints kept")


@dataclass
class EvalConfig:
    """Deterministic evaluation during training (fastsac.evaluation.episodes): off unless interval > 0."""
    interval: int = _f(0, min=0, help="evaluate every N iterations (env-step batches); 0 = off")
    episodes: int = _f(16, min=1, help="episodes per evaluation (the mean/min/max are over these)")
    num_envs: int = _f(16, min=1, max=MAX_ENVS, help="eval envs stepped together; the episodes are split over them")
    seed: int = _f(-1, min=-1, max=SEED_MAX,
                   help="eval env seed; -1 = derived from seed, never one a training env uses")
    cpus: int = _f(1, min=1, help="async trainer: CPUs of the evaluator process, taken from the learner's node")


@dataclass
class DistributedConfig:
    """Data-parallel learners on torch.distributed (fastsac.learner.distributed). The defaults are one
    learner on one machine: no process group at all."""
    num_learners: int = _f(1, min=1, help="learner processes on this machine (one per GPU; at most num_collectors)")
    learner_devices: list[str] = _f(default_factory=list,
                                    help="device per learner; [] = the first num_learners GPUs, or cpu without GPUs")
    collector_learners: list[int] = _f(default_factory=list,
                                       help="learner (local index) per collector; [] = the learner on the "
                                            "collector's NUMA node, else round-robin")
    nnodes: int = _f(0, min=0, max=4096, help="machines in the job; 0 = $NNODES, else 1")
    node_rank: int = _f(-1, min=-1, max=4095, help="this machine's index; -1 = $NODE_RANK, else 0")
    master_addr: str = _f("", help="address of node_rank 0's rendezvous; '' = $MASTER_ADDR, else 127.0.0.1")
    master_port: int = _f(0, min=0, max=65535, help="its TCP port; 0 = $MASTER_PORT, else 29500")
    backend: Literal["auto", "nccl", "gloo"] = _f("auto", help="auto = nccl on CUDA learners, gloo on CPU")
    timeout_s: float = _f(120.0, min=MIN_HEARTBEAT_TIMEOUT_S,
                          help="a collective that waits longer than this fails the job (no hang)")


@dataclass
class Config:
    job_name: str = _f("fastsac", help="names the shared-memory segments: [A-Za-z0-9_-], at most 32 characters")
    run_dir: str = _f("", help="TensorBoard logs, checkpoints and process logs; '' = runs/<job_name>")
    seed: int = _f(1, min=0, max=SEED_MAX, help="every seed of the job derives from it (collector i: seed + i)")
    device: str = _f("auto", help="learner device: auto = cuda:0 when a GPU is visible (exit 2 if torch cannot use "
                                  "it), else cpu | cpu | cuda | cuda:N")
    resume: str = _f("", help="'' = fresh start, 'auto' = newest valid checkpoint in run_dir, or a .pt path")
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir or f"runs/{self.job_name}")


# \A...\Z, never ^...$: '$' also matches before a final newline, and "name\n" would pass.
JOB_NAME_RE = re.compile(r"\A[A-Za-z0-9_-]{1,32}\Z")
_DEVICE_RE = re.compile(r"\A(auto|cpu|cuda(:\d+)?)\Z")


# --------------------------------------------------------------------------- loading

_YAML_BOOL_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(path: str, value: Any, tp: Any, meta: dict) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool):  # YAML 1.1 reads a bare off/on/no/yes as a boolean
            value = next((c for c in _YAML_BOOL_WORDS[value] if c in choices), value)
        if value not in choices:
            raise ConfigError(f"{path}: {value!r} is not valid; expected one of {', '.join(map(repr, choices))}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected a {_type_name(tp)} (e.g. [0, 1])")
        return [_coerce(f"{path}[{i}]", v, item_tp, meta) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            words = isinstance(value, str) and value.lower() in (*_YAML_BOOL_WORDS[False], *_YAML_BOOL_WORDS[True])
            hint = f" (YAML 1.2 reads {value} as text, not as YAML 1.1's boolean)" if words else ""
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected true or false{hint}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            hint = ""
            if isinstance(value, str) and _looks_numeric(value):
                hint = f" (YAML reads {value} as text; write the integer's digits)"
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected an integer{hint}")
        if meta.get("max") is None:
            meta = {**meta, "max": INT64_MAX}
    elif tp is float:
        if isinstance(value, str):  # YAML 1.1 reads '3e-4' as a string; accept what float() accepts
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected a number")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{path}: {value!r} is not a finite number")
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected a string")
        return value
    lo, hi = meta.get("min"), meta.get("max")
    too_low = lo is not None and (value < lo or (meta.get("min_exclusive") and value == lo))
    if too_low or (hi is not None and value > hi):
        valid = [f"{'>' if meta.get('min_exclusive') else '>='} {lo}"] if lo is not None else []
        valid += [f"<= {hi}"] if hi is not None else []
        raise ConfigError(f"{path}: {value!r} is out of range; expected a value {' and '.join(valid)}")
    return value


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _build(cls: type, data: Any, prefix: str) -> Any:
    where = prefix or "the config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields and (not isinstance(key, str) or not key.strip()):   # "": 3, a null or numeric key
            what = "is empty" if isinstance(key, str) else f"is not a name ({type(key).__name__})"
            raise ConfigError(f"{where}: the key {key!r} {what}; valid keys in {where}: {', '.join(fields)}")
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = f"; did you mean '{(prefix + '.' if prefix else '') + close[0]}'?" if close else ""
            raise ConfigError(f"{path}: unknown key{hint} (valid keys in {where}: {', '.join(fields)})")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, path)
        else:
            kwargs[key] = _coerce(path, value, tp, dict(fields[key].metadata))
    return cls(**kwargs)


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


def _check_cross_fields(cfg: Config) -> None:
    if not JOB_NAME_RE.match(cfg.job_name):
        raise ConfigError(f"job_name: {cfg.job_name!r} cannot name a shared-memory segment; "
                          "use 1-32 characters from A-Z a-z 0-9 _ -")
    for key in ("device", "trainer.async_options.collector_inference_device"):
        value = cfg.device if key == "device" else cfg.trainer.async_options.collector_inference_device
        if not _DEVICE_RE.match(value):
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


# torchrun's variables, read where the distributed key is left at its "absent" value
_DIST_ENV = {"nnodes": ("NNODES", 0, 1), "node_rank": ("NODE_RANK", -1, 0),
             "master_addr": ("MASTER_ADDR", "", "127.0.0.1"), "master_port": ("MASTER_PORT", 0, 29500)}


def resolve_distributed_env(dist: DistributedConfig, environ: typing.Mapping[str, str]) -> None:
    """Fill the multi-machine keys left absent from torchrun-style environment variables, then
    from the single-machine defaults. Explicit keys (file or command line) always win."""
    for key, (var, absent, default) in _DIST_ENV.items():
        if getattr(dist, key) != absent:
            continue
        raw = environ.get(var, "").strip()
        if not raw:
            setattr(dist, key, default)
            continue
        if isinstance(default, int):
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"distributed.{key}: ${var}={raw!r} is not an integer; set the variable to "
                                  f"an integer or give distributed.{key} explicitly") from None
            lo = {"nnodes": 1, "node_rank": 0, "master_port": 1}[key]
            hi = {"nnodes": 4096, "node_rank": 4095, "master_port": 65535}[key]
            if not lo <= value <= hi:
                raise ConfigError(f"distributed.{key}: ${var}={value} is out of range; expected {lo}..{hi}")
            setattr(dist, key, value)
        else:
            setattr(dist, key, raw)


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
        if not _DEVICE_RE.match(dev) or dev == "auto":
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


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. trainer.num_iterations=200")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: the key {key!r} is not a dotted key path")
    try:
        value = strict_yaml_load(raw) if raw.strip() else ""
    except YamlInputError as exc:
        raise ConfigError(f"override {key}: {exc.message} in value {raw!r}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from None
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(parts[:i + 1])} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data


def config_from_dict(data: dict | None, overrides: list[str] = ()) -> Config:
    data = apply_overrides(dict(data or {}), list(overrides))
    cfg = _build(Config, data, "")
    _check_cross_fields(cfg)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Load and validate a job config. Raises ConfigError (exit 2) on any problem.

    The one place a config file is read: the launcher, the sync trainer, the learner and every
    collector process all come through here.
    """
    data: dict = {}
    if path is not None:
        p = Path(path)
        where = f"config file {str(p)!r}"
        if not p.is_file():
            raise ConfigError(f"{where} does not exist" if not p.exists() else f"{where} is not a regular file")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where} cannot be read: {exc}") from None
        try:
            data = strict_yaml_load(text)
        except YamlInputError as exc:
            raise ConfigError(f"{where}, line {exc.line}: {exc.message}") from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            at = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            context = f" ({exc.context})" if exc.context else ""
            raise ConfigError(f"{where}{at}: not valid YAML: {exc.problem}{context}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where} is not valid YAML: {exc}") from None
        if data is None:  # an empty or truncated file would otherwise run with every default
            raise ConfigError(f"{where}, line 1: no settings (the file is empty or only comments); a job config "
                              "sets at least job_name (write {} to run with every default)")
        if not isinstance(data, dict):
            raise ConfigError(f"{where}, line 1: expected a mapping of keys at the top, got {type(data).__name__}")
    return config_from_dict(data, overrides)


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def config_keys_markdown() -> str:
    """The table of every config key (docs/configuration.md embeds it; a test keeps them equal)."""
    rows = ["| key | type | default | valid | meaning |", "|---|---|---|---|---|"]

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, path = hints[f.name], prefix + f.name
            if dataclasses.is_dataclass(tp):
                walk(tp, path + ".")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            meta = f.metadata
            valid = []
            if meta.get("min") is not None:
                valid.append((">" if meta.get("min_exclusive") else ">=") + f" {meta['min']}")
            if meta.get("max") is not None:
                valid.append(f"<= {meta['max']}")
            cells = [f"`{path}`", _type_name(tp), f"`{default!r}`", ", ".join(valid), meta.get("help", "")]
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")   # a | inside a cell

    walk(Config, "")
    return "\n".join(rows)
