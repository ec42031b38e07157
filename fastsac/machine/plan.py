"""Job plan: which process runs where, on which CPUs, with which envs, seed and command line.

`plan_job(cfg, topo, ...)` is a pure function of the config, the discovered Topology and the
launch parameters: no process is started and nothing is read from the machine (numactl's
location is looked up on PATH unless given). The launcher executes the plan; `--plan` prints
it with `fastsac.machine.plan_output.format_plan`; tests check it field by field. It decides
first (fastsac.machine.placement: binding, devices, nodes, CPUs, threads, notes; its rules are
there) and then renders the decision (`_render`, with the command lines of
fastsac.machine.commands).

Envs: collector i owns the fixed block [first, first + count) (`split_envs`): counts differ by at
most one, the first (num_envs % n) collectors get the extra env. seed = seed + i.

Invariants of a JobPlan: collector ids are 0..n-1 in order; env blocks are contiguous, disjoint
and cover 0..num_envs-1; with binding on, collectors' CPU sets are pairwise disjoint and each is
a subset of its node's usable CPUs, and the learner's CPUs are a subset of its node's; with
binding off every process has node None and the allowed CPUs.
"""
from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import dataclass, field
from typing import Literal, Sequence

from fastsac.common.seeds import collector_seed, resolve_eval_seed
from fastsac.config import Config, ConfigError
from fastsac.machine import devices as dv
from fastsac.machine import learner_plan as lp
from fastsac.machine.commands import ChildCommands, child_env
from fastsac.machine.placement import BindingMethod, Decision, decide
from fastsac.machine.topology import Topology, format_cpulist

__all__ = [
    "ProcessPlan", "LearnerPlan", "CollectorPlan", "JobPlan", "plan_job", "split_envs",
    "LEARNER_MODULE", "COLLECTOR_MODULE", "EVALUATOR_MODULE",
]

LEARNER_MODULE = "fastsac.learner_main"
COLLECTOR_MODULE = "fastsac.collector_main"
EVALUATOR_MODULE = "fastsac.evaluator_main"
_AO = "trainer.async_options"


class _Which:
    """Sentinel: look numactl up on PATH (None means "numactl is not available")."""
    def __repr__(self) -> str:
        return "shutil.which('numactl')"


_WHICH = _Which()


# --------------------------------------------------------------------------- dataclasses

@dataclass(frozen=True, kw_only=True)
class ProcessPlan:
    """One process of the job.

    node: NUMA node it is bound to; None when binding is off.
    cpus: CPUs it may run on (with binding off: every allowed CPU).
    threads: the size of each of its thread pools (torch intra-op, OpenMP, BLAS, env physics):
          the CPUs it owns; with binding off the allowed CPUs shared out among the job's
          processes, so that all of them together never run more threads than there are CPUs.
    env:  extra environment for the child (thread-pool sizes = threads, CUDA_DEVICE_ORDER), as sorted pairs.
    device: concrete ('cpu' or 'cuda:K'); device_reason says why (fastsac.machine.devices).
    argv: the exact command; argv[0] is numactl or the interpreter.
    """
    role: Literal["learner", "collector", "evaluator"]
    node: int | None
    cpus: tuple[int, ...]
    binding: BindingMethod
    device: str
    seed: int
    argv: tuple[str, ...]
    threads: int = 1
    env: tuple[tuple[str, str], ...] = ()
    device_reason: str = ""

    @property
    def name(self) -> str:
        return self.role

    @property
    def command(self) -> str:
        """argv shell-quoted, ready to paste into a terminal."""
        return shlex.join(self.argv)

    @property
    def shell_command(self) -> str:
        """`VAR=value ... command`: what a person types to start it with the planned thread env."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env), self.command])

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True, kw_only=True)
class LearnerPlan(ProcessPlan):
    """A learner: local index on this machine, global rank in the job's learner group (0 and 0
    with one learner); named 'learner <i>' only when this machine runs several."""
    learner_index: int = 0
    global_rank: int = 0
    node_rank: int = 0
    several: bool = False

    @property
    def name(self) -> str:
        return f"learner {self.learner_index}" if self.several else "learner"


@dataclass(frozen=True, kw_only=True)
class CollectorPlan(ProcessPlan):
    """A collector: owns envs [env_first, env_first + env_count). manual: a person starts it.
    learner_index: the local learner that drains its ring and feeds its snapshot."""
    collector_id: int
    env_first: int
    env_count: int
    manual: bool = False
    learner_index: int = 0

    @property
    def name(self) -> str:
        return f"collector {self.collector_id}"

    @property
    def env_stop(self) -> int:
        return self.env_first + self.env_count

    @property
    def env_ids(self) -> range:
        return range(self.env_first, self.env_stop)


@dataclass(frozen=True)
class JobPlan:
    """The whole job. See the module docstring for the invariants.

    binding: the method actually used ('auto' resolved); requested_binding: the config value.
    placement: 'explicit' (numa_nodes), 'spread', 'colocate', or 'none' when binding is off.
    """
    learners: tuple[LearnerPlan, ...]
    collectors: tuple[CollectorPlan, ...]
    binding: BindingMethod
    requested_binding: str
    placement: str
    numactl: str | None
    config_path: str
    topology: Topology = field(compare=False)
    notes: tuple[str, ...] = ()
    evaluator: ProcessPlan | None = None   # eval.interval > 0 (async): the evaluator process
    world_size: int = 1          # learners in the whole job (all machines); 1 = no learner group

    @property
    def learner(self) -> LearnerPlan:
        """The first local learner (the only one unless distributed.num_learners > 1)."""
        return self.learners[0]

    @property
    def processes(self) -> tuple[ProcessPlan, ...]:
        return (*self.learners, *self.collectors, *((self.evaluator,) if self.evaluator else ()))

    @property
    def manual_collectors(self) -> tuple[CollectorPlan, ...]:
        return tuple(c for c in self.collectors if c.manual)


# --------------------------------------------------------------------------- planning

def split_envs(num_envs: int, num_collectors: int) -> tuple[tuple[int, int], ...]:
    """(first, count) per collector: contiguous blocks, the first num_envs % n get one extra."""
    if num_collectors < 1:
        raise ConfigError(f"{_AO}.num_collectors: {num_collectors} is out of range; expected a value >= 1")
    if num_envs < num_collectors:
        raise ConfigError(f"env.num_envs: {num_envs} is fewer than {_AO}.num_collectors ({num_collectors}); "
                          "every collector needs at least one env")
    base, extra = divmod(num_envs, num_collectors)
    out, first = [], 0
    for i in range(num_collectors):
        count = base + (1 if i < extra else 0)
        out.append((first, count))
        first += count
    return tuple(out)


def _env_blocks(cfg: Config) -> tuple[tuple[int, int], ...]:
    """Each collector's env block, after checking the collector count and the manual ids."""
    from fastsac.shm_layout import MAX_COLLECTORS  # the layout's constant (numpy is imported only here)
    n = cfg.trainer.async_options.num_collectors
    if n > MAX_COLLECTORS:  # the control block has a fixed record per possible collector
        raise ConfigError(f"{_AO}.num_collectors: {n} is out of range; a job has at most {MAX_COLLECTORS} "
                          "collectors (the shared-memory layout's maximum)")
    blocks = split_envs(cfg.env.num_envs, n)
    for i, cid in enumerate(cfg.trainer.async_options.manual_collectors):
        if not 0 <= cid < n:
            raise ConfigError(f"{_AO}.manual_collectors[{i}]: {cid} is not a collector id; valid ids are 0..{n - 1}")
    return blocks


def plan_job(cfg: Config, topo: Topology, config_path: str, overrides: Sequence[str] = (),
             python: str = sys.executable, numactl_path: str | None | _Which = _WHICH,
             torch_build: dv.TorchBuild | None = None) -> JobPlan:
    """Plan the learner and every collector. Pure; raises ConfigError for an impossible layout.

    config_path / overrides are passed verbatim to every child, so each child re-loads exactly
    the config the launcher validated. numactl_path: default shutil.which('numactl'); None =
    numactl is not available (tests pass both explicitly). torch_build: the installed torch
    (default: read from its files), named in the reason of a GPU chosen by `auto`.
    """
    numactl = shutil.which("numactl") if isinstance(numactl_path, _Which) else numactl_path
    blocks = _env_blocks(cfg)
    decision = decide(cfg, topo, numactl, torch_build)
    commands = ChildCommands(decision.method, numactl, python, config_path, tuple(str(o) for o in overrides), topo)
    return _render(cfg, decision, blocks, commands)


def _render(cfg: Config, d: Decision, blocks: tuple[tuple[int, int], ...], cmd: ChildCommands) -> JobPlan:
    """The JobPlan of a decision: every process with its command line and environment."""
    ao, where, count = cfg.trainer.async_options, d.where, d.threads
    devices = [c.device for c in d.choices]
    several = len(devices) > 1
    learners = tuple(
        LearnerPlan(role="learner", node=where.learner_nodes[k], cpus=where.learner_cpu_sets[k], binding=d.method,
                    device=devices[k], device_reason=d.choices[k].reason, seed=cfg.seed, learner_index=k,
                    global_rank=rank, node_rank=cfg.distributed.node_rank, several=several,
                    argv=cmd.argv(LEARNER_MODULE, where.learner_nodes[k], where.learner_cpu_sets[k],
                                  [lp.LEARNER_INDEX_ARG, str(k)] if several else []),
                    threads=count.learners[k], env=child_env(count.learners[k]))
        for k, rank in enumerate(lp.ranks(cfg)))
    node = where.learner_nodes[0]
    evaluator = None if d.evaluator_cpus is None else ProcessPlan(
        role="evaluator", node=node, cpus=d.evaluator_cpus, binding=d.method, device="cpu",
        device_reason="the evaluator runs its episodes on the CPU", seed=resolve_eval_seed(cfg),
        argv=cmd.argv(EVALUATOR_MODULE, node, d.evaluator_cpus, []), threads=count.evaluator,
        env=child_env(count.evaluator))
    inference = [dv.collector_device_choice(ao.collector_inference_device, devices[d.owner[i]], d.owner[i], several,
                                            cmd.topology) for i in range(ao.num_collectors)]
    nodes, cpus = where.collector_nodes, [tuple(c) for c in where.collector_cpus]
    collectors = tuple(
        CollectorPlan(role="collector", collector_id=i, node=nodes[i], cpus=cpus[i], binding=d.method,
                      device=inference[i].device, device_reason=inference[i].reason, seed=collector_seed(cfg.seed, i),
                      env_first=blocks[i][0], env_count=blocks[i][1], manual=i in ao.manual_collectors,
                      learner_index=d.owner[i], threads=count.collectors[i], env=child_env(count.collectors[i]),
                      argv=cmd.argv(COLLECTOR_MODULE, nodes[i], cpus[i], ["--collector-id", str(i)]))
        for i in range(ao.num_collectors))
    return JobPlan(learners=learners, collectors=collectors, binding=d.method, requested_binding=ao.numa_binding,
                   placement=where.name, numactl=cmd.numactl if d.method == "numactl" else None,
                   config_path=cmd.config_path, topology=cmd.topology, notes=d.notes, evaluator=evaluator,
                   world_size=lp.world_size(cfg))
