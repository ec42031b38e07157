"""Torch-free placement check (`fastsac-launch CONFIG --check-numa`).

The launcher starts the real learner and collector processes with their real binding
(numactl or in-process) and `--check-numa`. Each one binds, verifies its binding against
the plan (process_setup), attaches/creates and first-touches its segments exactly as in
training, then reports what the kernel says (effective CPUs, memory policy, and on which
nodes the pages of its segments are, from /proc/self/numa_maps, with each segment's size so
a check can tell that every page was placed) and exits.
No torch import: this runs in the slow emulated NUMA guest used by the tests.

Each report is a JSON file in a directory of this check alone, named after the launch's job
incarnation (the launcher creates it fresh and removes it after reading): the process logs
are appended to across launches, so reports read back from them would include the processes
of an earlier check with the same run_dir. The report also goes to the process's log, for people.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from fastsac import shm_layout as shm
from fastsac.envs.registry import make_env
from fastsac.machine.binding import numa_maps_pages, read_binding
from fastsac.run_dir.contents import LOGS_DIR, NUMA_CHECK_PREFIX
from fastsac.shm_layout.policy_layout import policy_flat_numel

REPORT_PREFIX = "NUMA-CHECK "


def report_dir(run_path: Path, incarnation: int) -> Path:
    """The directory of one check's reports: run_dir/logs/numa-check.<incarnation, hex>."""
    return Path(run_path) / LOGS_DIR / f"{NUMA_CHECK_PREFIX}{incarnation & (2**64 - 1):016x}"


def report_path(run_path: Path, incarnation: int, role: str, collector_id: int | None = None) -> Path:
    name = "learner" if role == "learner" else f"collector{collector_id}"
    return report_dir(run_path, incarnation) / f"{name}.json"


def _report(ctx, ctl: "shm.ControlBlock", extra: dict) -> int:
    eff = read_binding()
    me = ctx.me
    report = {"role": me.role, "pid": os.getpid(), "planned_node": me.node, "planned_cpus": list(me.cpus),
              "binding": me.binding, "cpus": list(eff.cpus), "mempolicy": eff.mempolicy,
              "mem_nodes": list(eff.mem_nodes), **extra}
    path = report_path(ctx.cfg.run_path, ctl.incarnation, me.role, getattr(me, "collector_id", None))
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(report))   # the launcher's directory: a missing one is an error (exit 1)
    os.replace(tmp, path)                # whole or absent, never half-written
    print(REPORT_PREFIX + json.dumps(report), flush=True)
    return 0


def read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def run_learner_check(ctx) -> int:
    ctl = shm.ControlBlock.attach(ctx.cfg.job_name, role="observer")
    try:
        return _report(ctx, ctl, {})
    finally:
        ctl.close()


def run_collector_check(ctx) -> int:
    cfg, me = ctx.cfg, ctx.me
    ctl = shm.ControlBlock.attach(cfg.job_name, role="observer")
    env = make_env(cfg.env.name, me.env_count, seed=cfg.seed, first_env_id=me.env_first,
                   max_episode_steps=cfg.env.max_episode_steps, num_threads=len(me.cpus))
    spec = shm.job_ring_spec(cfg, env, me.env_count)
    ring = shm.TransitionRing.create_or_attach(cfg.job_name, me.collector_id, spec, ctl.incarnation)
    snap = shm.WeightSnapshot.create_or_attach(cfg.job_name, me.collector_id,
                                               policy_flat_numel(env.obs_dim, env.act_dim, cfg.algo), ctl.incarnation)
    try:
        pages, sizes = {}, {}
        for name in (shm.ring_name(cfg.job_name, me.collector_id), shm.wts_name(cfg.job_name, me.collector_id)):
            pages[name] = {str(k): v for k, v in numa_maps_pages(None, "/dev/shm" + name).items()}
            sizes[name] = os.stat("/dev/shm" + name).st_size   # lets a check prove *every* page was placed
        return _report(ctx, ctl, {"collector_id": me.collector_id, "env_first": me.env_first,
                             "env_count": me.env_count, "segment_pages": pages, "segment_bytes": sizes,
                             "page_size": os.sysconf("SC_PAGE_SIZE")})
    finally:
        ring.close()
        snap.close()
        ctl.close()
        env.close()
