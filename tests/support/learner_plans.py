"""Job plans of several learners on fake topologies (fastsac.machine.plan.plan_job)."""
from __future__ import annotations

from fastsac.config import config_from_dict
from fastsac.machine.plan import plan_job

PY = "/opt/py/bin/python3"
NUMACTL = "/usr/bin/numactl"


def cfg(num_collectors=2, num_envs=64, device="auto", dist=None, **ao):
    return config_from_dict({"device": device, "env": {"num_envs": num_envs},
                             "trainer": {"async_options": {"num_collectors": num_collectors, **ao}},
                             "distributed": dist or {}})


def plan(c, topo, numactl=NUMACTL):
    return plan_job(c, topo, "job.yaml", [], python=PY, numactl_path=numactl)
