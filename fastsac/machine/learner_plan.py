"""Where the learners of this machine run and which collectors feed each (torch-free): the rules
behind the learners of a JobPlan (`fastsac.machine.plan.LearnerPlan`).

Pure functions of the config and the discovered Topology, called by the job plan (the placement
decision of `fastsac.machine.placement`, the rendering of `fastsac.machine.plan.plan_job`):

  * devices     fastsac.machine.devices: distributed.learner_devices (each GPU at most once),
                else the first num_learners GPUs (cuda:0, cuda:1, ...) when the machine has GPUs
                (or `device` asks for cuda), cpu when it has none or `device` is cpu.
  * nodes       each learner on its GPU's NUMA node (learner_numa_node overrides; unknown or
                unusable GPU node: the lowest usable node), decided by the rules of fastsac.machine.placement.
  * collectors  distributed.collector_learners when given; else co-location: a collector goes
                to a learner on its own NUMA node (round-robin among several there), so no ring
                is read across a socket; a collector whose node has no learner (or with binding
                off) is dealt round-robin over all learners. Every learner must end up with at
                least one collector (ConfigError naming the key otherwise).
  * CPUs        the learners of one node share the node's CPUs left over by collectors in
                disjoint slices (or share them all when there are fewer CPUs than learners).

One learner and one machine: no --learner-index, no learners: section in --plan.
"""
from __future__ import annotations

from typing import Sequence

from fastsac.config import Config, ConfigError
from fastsac.machine.ranks import global_rank, world_size
from fastsac.machine.topology import Topology, format_cpulist

LEARNER_INDEX_ARG = "--learner-index"
_D = "distributed"


MACHINE_ENV_STRIDE = 1 << 24   # global env ids of machine r start at r x this (seeds; no machine has more envs)


def machine_env_offset(cfg: Config) -> int:
    """The first global env id of this machine: 0 on node_rank 0 (a one-machine job is unchanged)."""
    return cfg.distributed.node_rank * MACHINE_ENV_STRIDE


def is_group(cfg: Config) -> bool:
    """A learner group (torch.distributed) runs when the job has more than one learner."""
    return world_size(cfg) > 1


def assign_collectors(cfg: Config, learner_nodes: Sequence[int | None],
                      collector_nodes: Sequence[int | None]) -> list[int]:
    """The local learner index of every collector (see the module docstring)."""
    d, n = cfg.distributed, len(collector_nodes)
    if d.collector_learners:
        if len(d.collector_learners) != n:
            raise ConfigError(f"{_D}.collector_learners: {d.collector_learners} has {len(d.collector_learners)} "
                              f"entries but num_collectors is {n}; give one learner index per collector or leave it "
                              "empty")
        out = list(d.collector_learners)
        key = f"{_D}.collector_learners"
        for i, r in enumerate(out):
            if not 0 <= r < len(learner_nodes):
                raise ConfigError(f"{key}[{i}]: {r} is not a learner; valid learner indices are "
                                  f"0..{len(learner_nodes) - 1}")
    else:
        key = f"{_D}.num_learners"
        out, turn = [], {}
        for node in collector_nodes:
            here = [k for k, ln in enumerate(learner_nodes) if node is not None and ln == node]
            candidates = tuple(here or range(len(learner_nodes)))
            j = turn.get(candidates, 0)
            out.append(candidates[j % len(candidates)])
            turn[candidates] = j + 1
    idle = [k for k in range(len(learner_nodes)) if k not in out]
    if idle:
        k = idle[0]
        where = "" if learner_nodes[k] is None else f" on NUMA node {learner_nodes[k]}"
        raise ConfigError(f"{key}: learner {k}{where} has no collector (collector nodes: "
                          f"{', '.join('-' if x is None else str(x) for x in collector_nodes)}); every learner needs "
                          f"at least one collector of its own: add collectors, place them on its node "
                          f"(trainer.async_options.numa_nodes) or map them with {_D}.collector_learners")
    return out


def learner_cpu_slices(cpus: tuple[int, ...], k: int) -> list[tuple[int, ...]]:
    """k learners on one node: disjoint slices of `cpus` (in the given order), or all share when fewer."""
    if k <= 1 or len(cpus) < k:
        return [tuple(sorted(cpus))] * k
    out, start = [], 0
    for j in range(k):
        size = len(cpus) // k + (1 if j < len(cpus) % k else 0)
        out.append(tuple(sorted(cpus[start:start + size])))
        start += size
    return out


def ranks(cfg: Config) -> list[int]:
    return [global_rank(cfg, i) for i in range(cfg.distributed.num_learners)]


def describe_learner(rank: int, device: str, node_rank: int) -> str:
    """How messages name a learner: 'learner rank 1 (cuda:1, node_rank 0)'."""
    return f"learner rank {rank} ({device}, node_rank {node_rank})"


def format_learners(learners, collectors) -> list[str]:
    """--plan lines for a learner group: each learner with its rank, device, node, CPUs and collectors."""
    lines = ["learners:"]
    for p in learners:
        mine = [c.collector_id for c in collectors if c.learner_index == p.learner_index]
        lines.append(f"  learner {p.learner_index}: global rank {p.global_rank} (node_rank {p.node_rank}), device "
                     f"{p.device}, NUMA node {'-' if p.node is None else p.node}, CPUs "
                     f"{format_cpulist(p.cpus) or '-'}, collectors {', '.join(map(str, mine))}")
    return lines
