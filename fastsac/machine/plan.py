"""Job plan: which process runs where, on which CPUs, with which envs, seed and command line.

`plan_job(cfg, topo, ...)` is a pure function of the config, the discovered Topology and the
launch parameters: no process is started and nothing is read from the machine (numactl's
location is looked up on PATH unless given). The launcher executes the plan; `--plan` prints
it with `fastsac.machine.plan_output.format_plan`; tests check it field by field. It decides
first (`_decide`: binding, devices, nodes, CPUs, threads, notes) and then renders the decision
(`_render`, with the command lines of fastsac.machine.commands).

Rules (the why is in docs/placement.md):
  * binding   'off': no numactl, no binding, every process on all allowed CPUs (node None).
              A placement key (numa_nodes, cpus_per_collector, learner_numa_node, placement
              'colocate') with 'off' is a contradiction (ConfigError), never silently ignored.
              'auto' (default): binds when it pays, i.e. several collectors on a machine where
              this process may use several NUMA nodes, or a placement key asks for it; then
              numactl when installed (and the kernel has NUMA), else 'inprocess'. Otherwise it
              is 'off' (one collector, or one usable node), with the exact unbound plan.
              'numactl': argv is prefixed with `numactl --cpunodebind=N --membind=N` (or
              `--physcpubind=<cpus>` when the process gets a slice of a node: --cpunodebind
              would hand it the whole node and the slice would be a wish, not a binding).
              'inprocess': argv carries `--bind-node N --bind-cpus L`; the process calls
              fastsac.machine.binding.bind_from_argv() first thing.
  * learner   node: learner_numa_node, else the GPU's node, else the lowest usable node
              (node 0 on an unrestricted machine). CPUs: the node's CPUs not given to
              collectors; if none remain it shares the node's CPUs (plan note). A CUDA learner
              keeps learner_cpus of its node when the collectors there would take them all.
              Devices: concrete, with their reason (fastsac.machine.devices).
  * collectors node: numa_nodes[i] if given; else 'spread' (i-th usable node, round-robin) or
              'colocate' (the learner's node). Collectors on one node get contiguous disjoint
              CPU slices in core order (SMT siblings stay together): cpus_per_collector each,
              or the node's CPUs divided evenly (the first ones get one extra) when it is 0.
  * envs      collector i owns the fixed block [first, first + count): counts differ by at
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
from fastsac.config import AsyncOptions, Config, ConfigError, check_binding_keys, placement_keys_set
from fastsac.machine import devices as dv
from fastsac.machine import learner_plan as lp
from fastsac.machine.commands import ChildCommands, child_env
from fastsac.machine.topology import NumaNode, Topology, format_cpulist

__all__ = [
    "ProcessPlan", "LearnerPlan", "CollectorPlan", "JobPlan", "plan_job", "split_envs",
    "LEARNER_MODULE", "COLLECTOR_MODULE", "EVALUATOR_MODULE",
]

BindingMethod = Literal["numactl", "inprocess", "off"]
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


def _ids(ids) -> str:
    return ", ".join(str(i) for i in ids) or "none"


def _check_node(key: str, node_id: int, topo: Topology) -> NumaNode:
    """The node `key` asks for, or a ConfigError that says what exists and what is usable."""
    usable = _ids(topo.usable_node_ids)
    if node_id < 0:
        raise ConfigError(f"{key}: {node_id} is not a NUMA node id; node ids are >= 0 (usable nodes: {usable})")
    if not topo.has_node(node_id):
        raise ConfigError(f"{key}: node {node_id} does not exist; this machine has node(s) "
                          f"{_ids(topo.node_ids)} (usable: {usable})")
    node = topo.node(node_id)
    if not node.usable:
        raise ConfigError(f"{key}: node {node_id} is not usable by this process: {node.unusable_reason}; "
                          f"usable nodes: {usable}")
    return node


def _auto_binds(ao: AsyncOptions, topo: Topology, notes: list[str]) -> bool:
    """Does numa_binding 'auto' bind this job? Several collectors and several usable nodes, or a
    placement key that only means something bound. One collector stays unbound (its plan is the
    same as with 'off'): binding it would only move the learner and it away from each other."""
    if placement_keys_set(ao):
        return True
    if ao.num_collectors > 1 and len(topo.usable_nodes) > 1:
        return True
    if ao.num_collectors > 1:
        notes.append(f"numa_binding 'auto' binds nothing: this process can use one NUMA node only; set {_AO}."
                     "numa_binding to 'numactl' or 'inprocess' (or give cpus_per_collector) to pin collectors "
                     "to CPU slices of it")
    return False


def _resolve_binding(ao: AsyncOptions, numactl: str | None, topo: Topology, notes: list[str]) -> BindingMethod:
    key = f"{_AO}.numa_binding"
    requested = ao.numa_binding
    if requested == "off":
        check_binding_keys(ao)  # config.py refuses a placement key with 'off' too; the plan must not trust it
        return "off"
    if requested == "numactl":
        if not numactl:
            raise ConfigError(f"{key}: 'numactl' but no numactl executable was found on PATH; install it "
                              "(Debian/Ubuntu: apt-get install numactl; RHEL: dnf install numactl) or use "
                              "'inprocess' (each process binds itself), 'auto' or 'off'")
        if not topo.numa_supported:
            raise ConfigError(f"{key}: 'numactl' but this kernel exposes no NUMA nodes (no "
                              f"{topo.sysfs_root}/devices/system/node), where numactl refuses to run; "
                              "use 'inprocess', 'auto' or 'off'")
        return "numactl"
    if requested == "auto":
        if not _auto_binds(ao, topo, notes):
            return "off"
        if numactl and topo.numa_supported:
            return "numactl"
        notes.append("numa_binding 'auto' -> 'inprocess': " + (
            "numactl is not on PATH" if not numactl else "the kernel exposes no NUMA nodes")
            + "; each process binds itself before importing torch")
        return "inprocess"
    if requested == "inprocess":
        return "inprocess"
    raise ConfigError(f"{key}: {requested!r} is not valid; expected one of 'off', 'auto', 'numactl', 'inprocess'")


def _learner_node(cfg: Config, topo: Topology, notes: list[str], device: str | None = None) -> int:
    ao = cfg.trainer.async_options
    key = f"{_AO}.learner_numa_node"
    if ao.learner_numa_node < -1:
        raise ConfigError(f"{key}: {ao.learner_numa_node} is not valid; expected -1 (the GPU's node) or a "
                          f"node id ({_ids(topo.usable_node_ids)})")
    if ao.learner_numa_node >= 0:
        return _check_node(key, ao.learner_numa_node, topo).id
    fallback = topo.usable_nodes[0].id
    device = cfg.device if device is None else device
    gpu = topo.gpu_node_for(device)
    if gpu >= 0 and topo.node(gpu).usable:
        return gpu
    if gpu >= 0:
        notes.append(f"the GPU is on node {gpu}, but {topo.node(gpu).unusable_reason}; the learner runs on "
                     f"node {fallback} and its host-device copies cross the socket link")
    elif device == "cpu":
        notes.append(f"learner device is 'cpu' (no GPU node): learner on node {fallback}; "
                     f"set {key} to choose another")
    else:
        notes.append(f"the GPU's NUMA node is unknown (see the topology notes): learner on node {fallback}; "
                     f"set {key} if you know the GPU's node")
    return fallback


def _collector_nodes(cfg: Config, topo: Topology, learner_node: int) -> tuple[list[int], str]:
    ao = cfg.trainer.async_options
    n = ao.num_collectors
    if ao.numa_nodes:
        if len(ao.numa_nodes) != n:  # config.py checks this too; the plan must not trust its caller
            raise ConfigError(f"{_AO}.numa_nodes: {ao.numa_nodes} has {len(ao.numa_nodes)} entries but "
                              f"num_collectors is {n}; give one node per collector or leave it empty")
        return [_check_node(f"{_AO}.numa_nodes[{i}]", nid, topo).id for i, nid in enumerate(ao.numa_nodes)], \
            "explicit"
    if ao.placement == "spread":
        usable = topo.usable_node_ids
        return [usable[i % len(usable)] for i in range(n)], "spread"
    if ao.placement == "colocate":
        return [learner_node] * n, "colocate"
    raise ConfigError(f"{_AO}.placement: {ao.placement!r} is not valid; expected one of 'spread', 'colocate'")


def _learner_reserve(cfg: Config, topo: Topology, learner_nodes: list, devices: list, nodes: list,
                     notes: list[str]) -> dict[int, int]:
    """CPUs to keep for the CUDA learners of each node when its collectors would take them all
    (cpus_per_collector 0): the learner is the one thread launching the update's kernels, and on
    a CPU shared with a collector every launch waits behind physics. learner_cpus per CUDA
    learner, plus eval.cpus on the node of learner 0 when the job's evaluator runs there (it
    takes them from the learner's CPUs), at most what leaves each collector there one CPU."""
    want = cfg.trainer.async_options.learner_cpus
    if not want or cfg.trainer.async_options.cpus_per_collector:
        return {}
    out = {}
    for nid in sorted({ln for ln, dev in zip(learner_nodes, devices) if dev != "cpu"}):
        k = sum(1 for x in nodes if x == nid)
        if not k:
            continue   # no collector there: the learner has the node's CPUs anyway
        cuda_here = sum(1 for ln, dev in zip(learner_nodes, devices) if ln == nid and dev != "cpu")
        evaluator = cfg.eval.cpus if nid == learner_nodes[0] and _has_evaluator(cfg) else 0
        have = len(topo.node(nid).core_ordered_cpus)
        out[nid] = min(want * cuda_here + evaluator, max(0, have - k))
        if out[nid] < want * cuda_here + evaluator:
            notes.append(f"node {nid}: {_AO}.learner_cpus={want} for {cuda_here} CUDA learner(s)"
                         f"{f' and eval.cpus={evaluator}' if evaluator else ''} would leave its {k} collector(s) "
                         f"no CPU; the learner keeps {out[nid]}")
    return out


def _cpu_slices(cfg: Config, topo: Topology, nodes: list[int], reserve: dict[int, int] | None = None
                ) -> list[tuple[int, ...]]:
    """Contiguous disjoint CPU slices (in core order) for the collectors sharing each node; the
    last `reserve[node]` CPUs of a node (in core order) stay out of them, for its learners."""
    reserve = reserve or {}
    per = cfg.trainer.async_options.cpus_per_collector
    key = f"{_AO}.cpus_per_collector"
    if per < 0:
        raise ConfigError(f"{key}: {per} is out of range; expected a value >= 0 (0 = the node's CPUs shared evenly)")
    slices: list[tuple[int, ...]] = [()] * len(nodes)
    for nid in sorted(set(nodes)):
        node = topo.node(nid)
        order = node.core_ordered_cpus
        members = [i for i, x in enumerate(nodes) if x == nid]
        k, have = len(members), len(order)
        who = f"collector{'s' if k > 1 else ''} {_ids(members)}"
        if per > have:
            raise ConfigError(f"{key}: {per} is more than node {nid} has ({have} usable CPUs: "
                              f"{format_cpulist(order)})")
        if per and per * k > have:
            raise ConfigError(f"{key}: {per} x {k} collectors on node {nid} ({who}) needs {per * k} CPUs but "
                              f"node {nid} has {have} usable CPUs ({format_cpulist(order)}); lower "
                              f"cpus_per_collector to at most {have // k}, or place fewer collectors there")
        if not per and k > have:
            raise ConfigError(f"{_AO}.num_collectors: {k} collectors on node {nid} ({who}) but node {nid} has only "
                              f"{have} usable CPU{'s' if have != 1 else ''} ({format_cpulist(order)}); every "
                              "collector needs its own CPU: use fewer collectors or spread them "
                              f"({_AO}.placement / numa_nodes)")
        share = have - reserve.get(nid, 0)
        sizes = [per] * k if per else [share // k + (1 if j < share % k else 0) for j in range(k)]
        start = 0
        for member, size in zip(members, sizes):
            slices[member] = tuple(sorted(order[start:start + size]))
            start += size
    return slices


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
    decision = _decide(cfg, topo, numactl, torch_build)
    commands = ChildCommands(decision.method, numactl, python, config_path, tuple(str(o) for o in overrides), topo)
    return _render(cfg, decision, blocks, commands)


@dataclass
class _Placement:
    """Where the learners and collectors run: a node (None when binding is off) and CPUs each."""
    learner_nodes: list
    learner_cpu_sets: list
    collector_nodes: list
    collector_cpus: list          # each collector's CPU slice
    name: str                     # 'explicit', 'spread', 'colocate', or 'none' when binding is off


@dataclass
class _Decision:
    """Everything plan_job decides before any command line is written (_render writes them)."""
    method: BindingMethod
    choices: list                 # each local learner's device choice (devices.learner_device_choices)
    where: _Placement
    owner: list                   # the learner (local index) each collector feeds
    evaluator_cpus: tuple[int, ...] | None
    threads: "_ThreadCounts"
    notes: list[str]


def _decide(cfg: Config, topo: Topology, numactl: str | None, torch_build: dv.TorchBuild | None) -> _Decision:
    ao = cfg.trainer.async_options
    notes: list[str] = []
    method = _resolve_binding(ao, numactl, topo, notes)
    choices = dv.learner_device_choices(cfg, topo, torch_build or dv.installed_torch())
    where = _placement(cfg, topo, method, [c.device for c in choices], notes)
    notes[:] = list(dict.fromkeys(notes))   # several learners on one node would repeat its notes
    owner = lp.assign_collectors(cfg, where.learner_nodes, where.collector_nodes)
    # a job's evaluator runs next to learner rank 0 (rank 0 logs its results); other machines plan none
    evaluator_cpus, where.learner_cpu_sets[0] = _evaluator_cpus(cfg, method, tuple(where.learner_cpu_sets[0]), notes)
    threads = _thread_counts(method, topo, ao.num_collectors, where.learner_cpu_sets, where.collector_cpus,
                             evaluator_cpus)
    manual = sorted(set(ao.manual_collectors))
    if manual:
        many = len(manual) > 1
        notes.append(f"collector{'s' if many else ''} {_ids(manual)} must be started by hand with the "
                     f"command shown; the launcher waits for {'them' if many else 'it'}")
    return _Decision(method, choices, where, owner, evaluator_cpus, threads, notes)


def _render(cfg: Config, d: _Decision, blocks: tuple[tuple[int, int], ...], cmd: ChildCommands) -> JobPlan:
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
                   config_path=cmd.config_path, topology=cmd.topology, notes=tuple(d.notes), evaluator=evaluator,
                   world_size=lp.world_size(cfg))


def _placement(cfg: Config, topo: Topology, method: str, devices: list, notes: list[str]) -> _Placement:
    """Each learner's node and CPUs, each collector's node and CPU slice, the placement name."""
    ao, n = cfg.trainer.async_options, cfg.trainer.async_options.num_collectors
    if method == "off":
        have = len(topo.allowed_cpus)
        if n > have:  # the bound case checks this per node in _cpu_slices
            raise ConfigError(f"{_AO}.num_collectors: {n} collectors but this process may use only {have} "
                              f"CPU{'s' if have != 1 else ''} ({format_cpulist(topo.allowed_cpus)}); every collector "
                              f"needs its own CPU: use at most {have} collector{'s' if have != 1 else ''}")
        nodes, placement = [None] * n, "none"
        learner_cpus, slices = topo.allowed_cpus, [topo.allowed_cpus] * n
        learner_nodes, learner_cpu_sets = [None] * len(devices), [tuple(learner_cpus)] * len(devices)
    else:
        if not topo.usable_nodes:
            raise ConfigError(f"{_AO}.numa_binding: {ao.numa_binding!r} needs a usable NUMA node but this process "
                              "can use none: " + "; ".join(f"node {x.id}: {x.unusable_reason}" for x in topo.nodes)
                              + "; fix the cpuset/affinity or set numa_binding: off")
        learner_nodes = [_learner_node(cfg, topo, notes, dev) for dev in devices]
        learner_node = learner_nodes[0]
        nodes, placement = _collector_nodes(cfg, topo, learner_node)
        slices = _cpu_slices(cfg, topo, nodes, _learner_reserve(cfg, topo, learner_nodes, devices, nodes, notes))
        learner_cpus = _learner_cpus(topo, learner_node, nodes, slices, notes)
        learner_cpu_sets = _learners_cpus(topo, learner_nodes, nodes, slices, notes) if len(devices) > 1 \
            else [tuple(learner_cpus)]
        _note_idle_cpus(topo, nodes, slices, learner_node, {c for s in learner_cpu_sets for c in s}, notes)
    return _Placement(learner_nodes, learner_cpu_sets, nodes, slices, placement)


@dataclass(frozen=True)
class _ThreadCounts:
    learners: list[int]
    collectors: list[int]
    evaluator: int


def _thread_counts(method: str, topo: Topology, n: int, learner_cpu_sets: list, slices: list,
                   evaluator_cpus) -> _ThreadCounts:
    """Each process's thread-pool size (ProcessPlan.threads). Binding off: every process may run
    on every allowed CPU, so the CPUs are shared out among all of them (more threads than CPUs
    in all is what stalls every process when anything else runs). Bound: the CPUs it owns; a
    learner gets the CPUs of its set no collector or other learner is pinned to (one when none
    are left: a second OpenMP thread would spin on a collector's core, measured: the learner's
    ingest took ~50% of a core instead of a few %), an evaluator sharing the learner's CPUs one."""
    learners = len(learner_cpu_sets)
    if method == "off":
        share = max(1, len(topo.allowed_cpus) // (learners + n + (evaluator_cpus is not None)))
        return _ThreadCounts([share] * learners, [share] * n, share)
    pinned = {c for s in slices for c in s}
    own = [max(1, len(set(cpus) - pinned - {c for j, o in enumerate(learner_cpu_sets) if j != k for c in o}))
           for k, cpus in enumerate(learner_cpu_sets)]
    shares = evaluator_cpus is not None and set(evaluator_cpus) & set(learner_cpu_sets[0])
    evaluator = 1 if evaluator_cpus is None or shares else len(evaluator_cpus)
    return _ThreadCounts(own, [max(1, len(s)) for s in slices], evaluator)


def _learner_cpus(topo: Topology, node: int, nodes: list, slices: list, notes: list[str]) -> tuple[int, ...]:
    taken = {c for nid, s in zip(nodes, slices) if nid == node for c in s}
    own = topo.node(node).core_ordered_cpus
    rest = tuple(sorted(c for c in own if c not in taken))
    if rest:
        return rest
    sharers = [i for i, nid in enumerate(nodes) if nid == node]
    notes.append(f"the learner shares node {node}'s CPUs ({format_cpulist(own)}) with collector"
                 f"{'s' if len(sharers) > 1 else ''} {_ids(sharers)}: none are left over; set "
                 f"{_AO}.cpus_per_collector to leave some for the learner")
    return tuple(sorted(own))


def _learners_cpus(topo: Topology, learner_nodes: list, nodes: list, slices: list, notes: list[str]) -> list:
    """Several learners: each node's left-over CPUs in disjoint slices among the learners there."""
    out: list = [()] * len(learner_nodes)
    for nid in sorted(set(learner_nodes)):
        members = [k for k, x in enumerate(learner_nodes) if x == nid]
        rest = _learner_cpus(topo, nid, nodes, slices, notes)
        for k, cpus in zip(members, lp.learner_cpu_slices(rest, len(members))):
            out[k] = cpus
    return out


def _has_evaluator(cfg: Config) -> bool:
    """This machine runs the job's evaluator: async, eval.interval > 0, next to learner rank 0."""
    return cfg.eval.interval > 0 and cfg.trainer.asynchronous and cfg.distributed.node_rank == 0


def _evaluator_cpus(cfg: Config, method: str, learner_cpus: tuple[int, ...], notes: list[str]):
    """(the evaluator's CPUs or None without one, the learner's CPUs after that). Bound: the last
    eval.cpus of the learner's CPUs, which the learner gives up while it keeps at least one;
    otherwise it shares them (a note). Binding off: every allowed CPU, like every process."""
    if not _has_evaluator(cfg):
        return None, learner_cpus
    k = cfg.eval.cpus
    if method == "off":
        if k > 1:
            notes.append(f"eval.cpus={k} is not applied: without binding (numa_binding off) the evaluator, like "
                         f"every process, may run on every allowed CPU ({format_cpulist(learner_cpus)})")
        return learner_cpus, learner_cpus
    if len(learner_cpus) > k:
        return learner_cpus[-k:], learner_cpus[:-k]
    notes.append(f"the evaluator shares the learner's CPUs ({format_cpulist(learner_cpus)}): eval.cpus={k} would "
                 "leave the learner none")
    return learner_cpus, learner_cpus


def _note_idle_cpus(topo: Topology, nodes: list, slices: list, learner_node: int, learner_cpus, notes) -> None:
    used = {c for s in slices for c in s} | set(learner_cpus)
    for nid in sorted(set(nodes) | {learner_node}):
        idle = [c for c in topo.node(nid).cpus if c not in used]
        if idle:
            notes.append(f"node {nid}: CPUs {format_cpulist(idle)} are used by no process")
