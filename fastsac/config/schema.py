"""The config's keys: one dataclass per section, each key with its type, default, valid range and
help text (the key table, docs/configuration.md, is generated from them), and the limits they use.

Torch-free on purpose: the launcher, `--plan` and the NUMA check mode load configs
without importing torch. What reads a config into these classes: fastsac.config.yaml_io (files),
fastsac.config.coercion (each value to its type), fastsac.config.checks (what one key alone
cannot say).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
DEVICE_RE = re.compile(r"\A(auto|cpu|cuda(:\d+)?)\Z")
