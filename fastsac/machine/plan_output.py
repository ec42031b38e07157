"""The job plan for people and programs: `fastsac-launch --plan` (a table, the notes, the exact
commands) and `--plan --json` (plain JSON types), from a fastsac.machine.plan.JobPlan."""
from __future__ import annotations

from fastsac.machine import learner_plan as lp
from fastsac.machine.plan import CollectorPlan, JobPlan, ProcessPlan
from fastsac.machine.topology import format_cpulist

def _env_range(p: ProcessPlan) -> str:
    if not isinstance(p, CollectorPlan):
        return "-"
    last = p.env_stop - 1
    ids = str(p.env_first) if p.env_count == 1 else f"{p.env_first}-{last}"
    return f"{ids} ({p.env_count})"


def format_plan(plan: JobPlan) -> str:
    """Human-readable plan: topology, one table row per process, then the exact commands."""
    nl = len(plan.learners)
    head = (f"job plan: {nl} learner{'s' if nl > 1 else ''} + {len(plan.collectors)} collector(s); "
            f"NUMA binding {plan.binding}"
            # 'auto' that binds nothing prints exactly what 'off' prints (the default job's plan)
            + (f" (requested {plan.requested_binding})"
               if plan.requested_binding != plan.binding and plan.binding != "off" else "")
            + (f", placement {plan.placement}" if plan.placement != "none" else ""))
    rows = [("process", "node", "CPUs", "envs", "seed", "device", "threads", "binding")]
    for p in plan.processes:
        rows.append((p.name + (" (manual)" if isinstance(p, CollectorPlan) and p.manual else ""),
                     "-" if p.node is None else str(p.node), p.cpulist or "-", _env_range(p),
                     str(p.seed),
                     p.device, p.env_dict.get("OMP_NUM_THREADS", "-"), p.binding))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head, plan.topology.describe(), ""]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("")
    lines.append("devices:")
    lines += [f"  {(p.name + ':').ljust(max(len(q.name) for q in plan.processes) + 1)} {p.device} ({p.device_reason})"
              for p in plan.processes]
    lines.append("")
    lines.append("commands:")
    label_w = max(len(p.name) for p in plan.processes) + 1
    for p in plan.processes:
        if isinstance(p, CollectorPlan) and p.manual:  # a person needs the thread env spelled out too
            lines.append(f"  {(p.name + ':').ljust(label_w)} start by hand: {p.shell_command}")
        else:
            lines.append(f"  {(p.name + ':').ljust(label_w)} {p.command}")
    lines.append("  (the launcher sets OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS, ... of each "
                 "process to its threads column)")
    if plan.world_size > 1:   # a one-learner job's plan reads as it always did
        lines += lp.format_learners(plan.learners, plan.collectors)
    notes = list(plan.notes) + list(plan.topology.notes)
    if notes:
        lines.append("notes:")
        lines += [f"  - {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _process_json(p: ProcessPlan) -> dict:
    d = {"name": p.name, "role": p.role, "node": p.node, "cpus": list(p.cpus), "cpulist": p.cpulist,
         "binding": p.binding, "device": p.device, "device_reason": p.device_reason, "seed": p.seed, "argv": list(p.argv),
         "command": p.command, "threads": p.threads, "env": p.env_dict}
    if isinstance(p, CollectorPlan):
        d.update(collector_id=p.collector_id, env_first=p.env_first, env_count=p.env_count, manual=p.manual)
    return d


def plan_to_json(plan: JobPlan) -> dict:
    """The plan as plain JSON types (json.dumps-able), for `--plan --json` and test fixtures."""
    t = plan.topology
    return {
        "binding": plan.binding,
        "requested_binding": plan.requested_binding,
        "placement": plan.placement,
        "numactl": plan.numactl,
        "config_path": plan.config_path,
        "topology": {
            "sysfs_root": t.sysfs_root, "numa_supported": t.numa_supported, "gpu_node": t.gpu_node,
            "allowed_cpus": format_cpulist(t.allowed_cpus),
            "nodes": [{"id": n.id, "cpus": format_cpulist(n.cpus), "all_cpus": format_cpulist(n.all_cpus),
                       "usable": n.usable, "unusable_reason": n.unusable_reason,
                       "mem_total_kb": n.mem_total_kb} for n in t.nodes],
            "gpus": [{"pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node} for g in t.gpus],
            "notes": list(t.notes),
        },
        "learner": _process_json(plan.learner),
        "collectors": [_process_json(c) for c in plan.collectors],
        "notes": list(plan.notes),
        **({"evaluator": _process_json(plan.evaluator)} if plan.evaluator else {}),
        **({"world_size": plan.world_size,
            "learners": [{**_process_json(p), "learner_index": p.learner_index, "global_rank": p.global_rank,
                          "node_rank": p.node_rank,
                          "collectors": [c.collector_id for c in plan.collectors
                                         if c.learner_index == p.learner_index]} for p in plan.learners],
            "collector_learners": [c.learner_index for c in plan.collectors]}
           if plan.world_size > 1 else {}),   # a one-learner job's JSON is what it always was
    }
