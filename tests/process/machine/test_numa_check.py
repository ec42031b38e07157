"""`fastsac-launch CONFIG --check-numa` on this host: every report comes from this check's processes.

The real multi-node placement is checked in the 2-node guest (tests/process/machine/test_numa_vm.py); here the
launch runs on the host's node(s): with numactl binding where numactl is installed, unbound
otherwise. The process logs under run_dir/logs are appended to across launches, so a check
that read its reports back from them would also list the processes of an earlier check.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest
from support.e2e_helpers import launch, tiny_config

from fastsac.run_dir.contents import run_outputs

NUM_COLLECTORS = 2


def check_numa(config) -> dict:
    proc = launch(config, "--check-numa", timeout=180)
    assert proc.returncode == 0, f"--check-numa failed (exit code {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def processes(doc: dict) -> dict[str, list[int]]:
    """{'learner' / 'collector <i>': [pids of its reports]}"""
    out: dict[str, list[int]] = {}
    for r in doc["reports"]:
        name = r["role"] if r["role"] == "learner" else f"collector {r['collector_id']}"
        out.setdefault(name, []).append(r["pid"])
    return out


@pytest.mark.process
def test_a_second_check_with_the_same_run_dir_reports_only_its_own_processes(tmp_path, job_name):
    binding = "numactl" if shutil.which("numactl") else "off"
    config = tiny_config(tmp_path, job_name, trainer={"async_options": {
        "num_collectors": NUM_COLLECTORS, "numa_binding": binding, "collector_inference_device": "cpu"}})
    want = sorted(["learner", *(f"collector {i}" for i in range(NUM_COLLECTORS))])

    first = processes(check_numa(config))
    assert sorted(first) == want and all(len(p) == 1 for p in first.values()), f"first check: {first}"
    second_doc = check_numa(config)   # same job_name and run_dir: the logs now hold the first check's lines too
    second = processes(second_doc)
    old = {pid for pids in first.values() for pid in pids}
    assert sorted(second) == want and all(len(p) == 1 for p in second.values()), \
        f"the second check must report each of its {len(want)} processes once, got {second} (first check: {first})"
    assert not old & {pid for pids in second.values() for pid in pids}, \
        f"the second check reports processes of the first one: first {first}, second {second}"
    assert not second_doc["failed"], second_doc["failed"]
    for r in second_doc["reports"]:
        assert r["binding"] == binding and r["planned_node"] == (0 if binding == "numactl" else None), r
    # nothing but each check's process logs stays (the report directories go), named as no run's
    # output (fastsac.run_dir.contents): a fresh run may still use this run_dir
    logs = tmp_path / "run" / "logs"
    names = sorted(p.name for p in logs.iterdir())
    assert len(names) == 2 * 3 and all(re.fullmatch(r"numa-check\.[0-9a-f]{16}\.(collector[01]|learner)\.log", n)
                                       for n in names), f"{logs}: {names}"
    assert run_outputs(tmp_path / "run") == []
