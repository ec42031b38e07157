"""`fastsac-launch CONFIG --check-numa`, the launcher's half: start the learner and every collector
with `--check-numa` under its real binding (fastsac.launch.supervisor spawns them), collect the
report each one writes (fastsac.process.numa_check, the processes' half) and print them beside the
plan. Torch-free.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time

from fastsac import shm_layout as shm
from fastsac.errors import EXIT_FAILURE, EXIT_OK
from fastsac.launch.supervisor import Supervisor
from fastsac.machine.plan_output import plan_to_json
from fastsac.process.numa_check import read_report, report_dir, report_path


def run_numa_check(cfg, plan, ctl: "shm.ControlBlock", timeout_s: float = 600.0) -> int:
    """Start every process with `--check-numa` under its real binding, collect their reports.

    Prints one JSON document {"plan": ..., "reports": [...], "failed": [...]} on stdout; exit 0
    when every process ran and reported (each one refuses to run on a binding that differs from
    the plan). Reports come from this check's own report directory (fastsac.process.numa_check), one per
    process started here, never from the logs, which earlier launches have appended to.
    """
    sup = Supervisor(cfg, plan, ctl)
    reports_at = report_dir(cfg.run_path, ctl.incarnation)
    reports_at.mkdir()   # new: the incarnation is this launch's own random 64-bit number
    children = [sup.learner, *[c for c in sup.collectors if not c.manual]]
    try:
        for child in children:
            child.plan = _with_extra_arg(child.plan, "--check-numa")
            # logs/numa-check.<incarnation>.<process>.log: the check trains nothing, so its logs are
            # no run's output (fastsac.run_dir.contents), and a fresh run may still use this run_dir
            child.log_path = reports_at.with_name(f"{reports_at.name}.{child.log_path.name}")
            sup.spawn(child)
        deadline = time.monotonic() + timeout_s
        failed, reports = [], []
        for child in children:
            try:
                rc = child.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                rc = child.proc.wait()
            path = report_path(cfg.run_path, ctl.incarnation, child.plan.role,
                               getattr(child.plan, "collector_id", None))
            report = read_report(path)
            if report is not None and report.get("pid") != child.proc.pid:
                failed.append(f"{child.name}: {path} was written by pid {report.get('pid')}, not by pid "
                              f"{child.proc.pid} started by this check")
                report = None
            if rc != 0:
                failed.append(f"{child.name} exited with code {rc}; see {child.log_path}")
            elif report is None:
                failed.append(f"{child.name} exited without writing its report {path}; see {child.log_path}")
            if report is not None:
                reports.append(report)
    finally:
        shutil.rmtree(reports_at, ignore_errors=True)
    print(json.dumps({"plan": plan_to_json(plan), "reports": reports, "failed": failed}, indent=1))
    for message in failed:
        print(f"fastsac-launch: error: {message}", file=sys.stderr)
    return EXIT_FAILURE if failed else EXIT_OK


def _with_extra_arg(process_plan, arg: str):
    return dataclasses.replace(process_plan, argv=(*process_plan.argv, arg))
