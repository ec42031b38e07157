"""The placement decision of a job: binding, devices, nodes, CPUs, thread counts and the notes that
explain them, decided before any command line is written (fastsac.machine.plan renders it).

`decide(cfg, topo, numactl, torch_build)` is a pure function of the config, the discovered Topology
and numactl's location: no process is started and nothing is read from the machine. A
`PlacementPlanner` makes one decision; each of its steps that finds something worth telling adds a
note to the planner's own list (`note`: each text once, since several learners on one node would
repeat their node's notes), and the Decision carries them to `--plan`.

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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fastsac.config import Config, ConfigError, check_binding_keys, placement_keys_set
from fastsac.machine import devices as dv
from fastsac.machine import learner_plan as lp
from fastsac.machine.topology import NumaNode, Topology, format_cpulist

BindingMethod = Literal["numactl", "inprocess", "off"]
_AO = "trainer.async_options"


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


@dataclass
class Placement:
    """Where the learners and collectors run: a node (None when binding is off) and CPUs each."""
    learner_nodes: list
    learner_cpu_sets: list
    collector_nodes: list
    collector_cpus: list          # each collector's CPU slice
    name: str                     # 'explicit', 'spread', 'colocate', or 'none' when binding is off


@dataclass(frozen=True)
class ThreadCounts:
    learners: list[int]
    collectors: list[int]
    evaluator: int


@dataclass
class Decision:
    """Everything plan_job decides before any command line is written (plan._render writes them)."""
    method: BindingMethod
    choices: list                 # each local learner's device choice (devices.learner_device_choices)
    where: Placement
    owner: list                   # the learner (local index) each collector feeds
    evaluator_cpus: tuple[int, ...] | None
    threads: ThreadCounts
    notes: tuple[str, ...]


def decide(cfg: Config, topo: Topology, numactl: str | None, torch_build: dv.TorchBuild | None) -> Decision:
    """The placement decision of a job (see the module docstring); raises ConfigError for an
    impossible layout."""
    return PlacementPlanner(cfg, topo, numactl).decide(torch_build)


class PlacementPlanner:
    """Decides one job's placement. Its steps share the config, the topology and numactl's location,
    and write what they find worth telling into `self.notes` (through `note`), which the Decision
    carries out."""

    def __init__(self, cfg: Config, topo: Topology, numactl: str | None):
        self.cfg, self.topo, self.numactl = cfg, topo, numactl
        self.ao = cfg.trainer.async_options
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        """A note for `--plan`, once: several learners on one node would repeat their node's notes."""
        if text not in self.notes:
            self.notes.append(text)

    def decide(self, torch_build: dv.TorchBuild | None) -> Decision:
        cfg, topo, ao = self.cfg, self.topo, self.ao
        method = self.binding()
        choices = dv.learner_device_choices(cfg, topo, torch_build or dv.installed_torch())
        where = self.placement(method, [c.device for c in choices])
        owner = lp.assign_collectors(cfg, where.learner_nodes, where.collector_nodes)
        # a job's evaluator runs next to learner rank 0 (rank 0 logs its results); other machines plan none
        evaluator_cpus, where.learner_cpu_sets[0] = self.evaluator_cpus(method, tuple(where.learner_cpu_sets[0]))
        threads = _thread_counts(method, topo, ao.num_collectors, where.learner_cpu_sets, where.collector_cpus,
                                 evaluator_cpus)
        manual = sorted(set(ao.manual_collectors))
        if manual:
            many = len(manual) > 1
            self.note(f"collector{'s' if many else ''} {_ids(manual)} must be started by hand with the "
                      f"command shown; the launcher waits for {'them' if many else 'it'}")
        return Decision(method, choices, where, owner, evaluator_cpus, threads, tuple(self.notes))

    # ------------------------------------------------------------------ binding
    def _auto_binds(self) -> bool:
        """Does numa_binding 'auto' bind this job? Several collectors and several usable nodes, or a
        placement key that only means something bound. One collector stays unbound (its plan is the
        same as with 'off'): binding it would only move the learner and it away from each other."""
        ao = self.ao
        if placement_keys_set(ao):
            return True
        if ao.num_collectors > 1 and len(self.topo.usable_nodes) > 1:
            return True
        if ao.num_collectors > 1:
            self.note(f"numa_binding 'auto' binds nothing: this process can use one NUMA node only; set {_AO}."
                      "numa_binding to 'numactl' or 'inprocess' (or give cpus_per_collector) to pin collectors "
                      "to CPU slices of it")
        return False

    def binding(self) -> BindingMethod:
        """numa_binding resolved: 'auto' becomes what it does on this machine."""
        ao, numactl, topo = self.ao, self.numactl, self.topo
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
            if not self._auto_binds():
                return "off"
            if numactl and topo.numa_supported:
                return "numactl"
            self.note("numa_binding 'auto' -> 'inprocess': " + (
                "numactl is not on PATH" if not numactl else "the kernel exposes no NUMA nodes")
                + "; each process binds itself before importing torch")
            return "inprocess"
        if requested == "inprocess":
            return "inprocess"
        raise ConfigError(f"{key}: {requested!r} is not valid; expected one of 'off', 'auto', 'numactl', 'inprocess'")

    # ------------------------------------------------------------------ nodes and CPUs
    def placement(self, method: str, devices: list) -> Placement:
        """Each learner's node and CPUs, each collector's node and CPU slice, the placement name."""
        cfg, topo = self.cfg, self.topo
        ao, n = self.ao, self.ao.num_collectors
        if method == "off":
            have = len(topo.allowed_cpus)
            if n > have:  # the bound case checks this per node in _cpu_slices
                raise ConfigError(f"{_AO}.num_collectors: {n} collectors but this process may use only {have} "
                                  f"CPU{'s' if have != 1 else ''} ({format_cpulist(topo.allowed_cpus)}); every "
                                  f"collector needs its own CPU: use at most {have} collector{'s' if have != 1 else ''}")
            nodes, placement = [None] * n, "none"
            learner_cpus, slices = topo.allowed_cpus, [topo.allowed_cpus] * n
            learner_nodes, learner_cpu_sets = [None] * len(devices), [tuple(learner_cpus)] * len(devices)
        else:
            if not topo.usable_nodes:
                raise ConfigError(f"{_AO}.numa_binding: {ao.numa_binding!r} needs a usable NUMA node but this "
                                  "process can use none: " + "; ".join(f"node {x.id}: {x.unusable_reason}"
                                                                      for x in topo.nodes)
                                  + "; fix the cpuset/affinity or set numa_binding: off")
            learner_nodes = [self.learner_node(dev) for dev in devices]
            learner_node = learner_nodes[0]
            nodes, placement = _collector_nodes(cfg, topo, learner_node)
            slices = _cpu_slices(cfg, topo, nodes, self.learner_reserve(learner_nodes, devices, nodes))
            learner_cpus = self.learner_cpus(learner_node, nodes, slices)
            learner_cpu_sets = self.learners_cpus(learner_nodes, nodes, slices) if len(devices) > 1 \
                else [tuple(learner_cpus)]
            self.note_idle_cpus(nodes, slices, learner_node, {c for s in learner_cpu_sets for c in s})
        return Placement(learner_nodes, learner_cpu_sets, nodes, slices, placement)

    def learner_node(self, device: str) -> int:
        """The node of a learner on `device`: learner_numa_node, else its GPU's, else the lowest usable."""
        ao, topo = self.ao, self.topo
        key = f"{_AO}.learner_numa_node"
        if ao.learner_numa_node < -1:
            raise ConfigError(f"{key}: {ao.learner_numa_node} is not valid; expected -1 (the GPU's node) or a "
                              f"node id ({_ids(topo.usable_node_ids)})")
        if ao.learner_numa_node >= 0:
            return _check_node(key, ao.learner_numa_node, topo).id
        fallback = topo.usable_nodes[0].id
        gpu = topo.gpu_node_for(device)
        if gpu >= 0 and topo.node(gpu).usable:
            return gpu
        if gpu >= 0:
            self.note(f"the GPU is on node {gpu}, but {topo.node(gpu).unusable_reason}; the learner runs on "
                      f"node {fallback} and its host-device copies cross the socket link")
        elif device == "cpu":
            self.note(f"learner device is 'cpu' (no GPU node): learner on node {fallback}; "
                      f"set {key} to choose another")
        else:
            self.note(f"the GPU's NUMA node is unknown (see the topology notes): learner on node {fallback}; "
                      f"set {key} if you know the GPU's node")
        return fallback

    def learner_reserve(self, learner_nodes: list, devices: list, nodes: list) -> dict[int, int]:
        """CPUs to keep for the CUDA learners of each node when its collectors would take them all
        (cpus_per_collector 0): the learner is the one thread launching the update's kernels, and on
        a CPU shared with a collector every launch waits behind physics. learner_cpus per CUDA
        learner, plus eval.cpus on the node of learner 0 when the job's evaluator runs there (it
        takes them from the learner's CPUs), at most what leaves each collector there one CPU."""
        cfg = self.cfg
        want = self.ao.learner_cpus
        if not want or self.ao.cpus_per_collector:
            return {}
        out = {}
        for nid in sorted({ln for ln, dev in zip(learner_nodes, devices) if dev != "cpu"}):
            k = sum(1 for x in nodes if x == nid)
            if not k:
                continue   # no collector there: the learner has the node's CPUs anyway
            cuda_here = sum(1 for ln, dev in zip(learner_nodes, devices) if ln == nid and dev != "cpu")
            evaluator = cfg.eval.cpus if nid == learner_nodes[0] and _has_evaluator(cfg) else 0
            have = len(self.topo.node(nid).core_ordered_cpus)
            out[nid] = min(want * cuda_here + evaluator, max(0, have - k))
            if out[nid] < want * cuda_here + evaluator:
                self.note(f"node {nid}: {_AO}.learner_cpus={want} for {cuda_here} CUDA learner(s)"
                          f"{f' and eval.cpus={evaluator}' if evaluator else ''} would leave its {k} collector(s) "
                          f"no CPU; the learner keeps {out[nid]}")
        return out

    def learner_cpus(self, node: int, nodes: list, slices: list) -> tuple[int, ...]:
        """The CPUs of `node` no collector there takes; all of them (a note) when none are left."""
        taken = {c for nid, s in zip(nodes, slices) if nid == node for c in s}
        own = self.topo.node(node).core_ordered_cpus
        rest = tuple(sorted(c for c in own if c not in taken))
        if rest:
            return rest
        sharers = [i for i, nid in enumerate(nodes) if nid == node]
        self.note(f"the learner shares node {node}'s CPUs ({format_cpulist(own)}) with collector"
                  f"{'s' if len(sharers) > 1 else ''} {_ids(sharers)}: none are left over; set "
                  f"{_AO}.cpus_per_collector to leave some for the learner")
        return tuple(sorted(own))

    def learners_cpus(self, learner_nodes: list, nodes: list, slices: list) -> list:
        """Several learners: each node's left-over CPUs in disjoint slices among the learners there."""
        out: list = [()] * len(learner_nodes)
        for nid in sorted(set(learner_nodes)):
            members = [k for k, x in enumerate(learner_nodes) if x == nid]
            rest = self.learner_cpus(nid, nodes, slices)
            for k, cpus in zip(members, lp.learner_cpu_slices(rest, len(members))):
                out[k] = cpus
        return out

    def evaluator_cpus(self, method: str, learner_cpus: tuple[int, ...]):
        """(the evaluator's CPUs or None without one, the learner's CPUs after that). Bound: the last
        eval.cpus of the learner's CPUs, which the learner gives up while it keeps at least one;
        otherwise it shares them (a note). Binding off: every allowed CPU, like every process."""
        if not _has_evaluator(self.cfg):
            return None, learner_cpus
        k = self.cfg.eval.cpus
        if method == "off":
            if k > 1:
                self.note(f"eval.cpus={k} is not applied: without binding (numa_binding off) the evaluator, like "
                          f"every process, may run on every allowed CPU ({format_cpulist(learner_cpus)})")
            return learner_cpus, learner_cpus
        if len(learner_cpus) > k:
            return learner_cpus[-k:], learner_cpus[:-k]
        self.note(f"the evaluator shares the learner's CPUs ({format_cpulist(learner_cpus)}): eval.cpus={k} would "
                  "leave the learner none")
        return learner_cpus, learner_cpus

    def note_idle_cpus(self, nodes: list, slices: list, learner_node: int, learner_cpus) -> None:
        used = {c for s in slices for c in s} | set(learner_cpus)
        for nid in sorted(set(nodes) | {learner_node}):
            idle = [c for c in self.topo.node(nid).cpus if c not in used]
            if idle:
                self.note(f"node {nid}: CPUs {format_cpulist(idle)} are used by no process")


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


def _thread_counts(method: str, topo: Topology, n: int, learner_cpu_sets: list, slices: list,
                   evaluator_cpus) -> ThreadCounts:
    """Each process's thread-pool size (ProcessPlan.threads). Binding off: every process may run
    on every allowed CPU, so the CPUs are shared out among all of them (more threads than CPUs
    in all is what stalls every process when anything else runs). Bound: the CPUs it owns; a
    learner gets the CPUs of its set no collector or other learner is pinned to (one when none
    are left: a second OpenMP thread would spin on a collector's core, measured: the learner's
    ingest took ~50% of a core instead of a few %), an evaluator sharing the learner's CPUs one."""
    learners = len(learner_cpu_sets)
    if method == "off":
        share = max(1, len(topo.allowed_cpus) // (learners + n + (evaluator_cpus is not None)))
        return ThreadCounts([share] * learners, [share] * n, share)
    pinned = {c for s in slices for c in s}
    own = [max(1, len(set(cpus) - pinned - {c for j, o in enumerate(learner_cpu_sets) if j != k for c in o}))
           for k, cpus in enumerate(learner_cpu_sets)]
    shares = evaluator_cpus is not None and set(evaluator_cpus) & set(learner_cpu_sets[0])
    evaluator = 1 if evaluator_cpus is None or shares else len(evaluator_cpus)
    return ThreadCounts(own, [max(1, len(s)) for s in slices], evaluator)


def _has_evaluator(cfg: Config) -> bool:
    """This machine runs the job's evaluator: async, eval.interval > 0, next to learner rank 0."""
    return cfg.eval.interval > 0 and cfg.trainer.asynchronous and cfg.distributed.node_rank == 0
