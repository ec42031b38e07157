"""Several learners per machine and several machines: plans, config checks, the status view.

End-to-end runs of learner groups are in tests/process/learner/test_distributed_e2e.py.
"""
import os

import pytest
from support.fake_sysfs import two_gpus, two_nodes
from support.learner_plans import NUMACTL, cfg, plan

from fastsac import shm_layout as shm
from fastsac.config import ConfigError
from fastsac.launch.status import format_status, take_snapshot
from fastsac.machine.plan_output import format_plan, plan_to_json
from fastsac.machine.topology import discover_topology
from fastsac.shm_layout.job_settings import job_settings


@pytest.fixture
def gpus2(tmp_path):
    """node 0: CPUs 0-3 with cuda:0, node 1: CPUs 4-7 with cuda:1."""
    return discover_topology(two_gpus(tmp_path / "sys"))


def test_each_learner_on_its_gpus_node_with_the_collectors_of_that_node(gpus2):
    p = plan(cfg(dist={"num_learners": 2}, cpus_per_collector=2), gpus2)
    assert [(x.device, x.node, x.global_rank, x.name) for x in p.learners] == \
        [("cuda:0", 0, 0, "learner 0"), ("cuda:1", 1, 1, "learner 1")]
    assert [(c.node, c.learner_index) for c in p.collectors] == [(0, 0), (1, 1)]  # no ring crosses a socket
    for x in p.learners:
        assert x.argv[0] == NUMACTL and x.argv[2] == f"--membind={x.node}"
        assert x.argv[x.argv.index("--learner-index") + 1] == str(x.learner_index)
        assert set(x.cpus) <= set(gpus2.node(x.node).cpus)
        assert not set(x.cpus) & {cpu for c in p.collectors for cpu in c.cpus}
    assert p.learner is p.learners[0]
    text = format_plan(p)
    assert "job plan: 2 learners + 2 collector(s)" in text
    assert "learner 1: global rank 1 (node_rank 0), device cuda:1, NUMA node 1, CPUs" in text
    assert text.rstrip().count("collectors 1") == 1
    js = plan_to_json(p)
    assert js["world_size"] == 2 and js["collector_learners"] == [0, 1]
    assert [(x["global_rank"], x["collectors"]) for x in js["learners"]] == [(0, [0]), (1, [1])]


def test_two_learners_on_one_node_share_its_left_over_cpus_disjointly(tmp_path):
    topo = discover_topology(two_nodes(tmp_path / "sys", gpu_node=0))
    p = plan(cfg(num_collectors=2, dist={"num_learners": 2, "learner_devices": ["cpu", "cpu"]},
                 numa_nodes=[0, 0], cpus_per_collector=1), topo)
    assert [x.node for x in p.learners] == [0, 0]
    assert [x.cpus for x in p.learners] == [(2,), (3,)]
    assert [c.learner_index for c in p.collectors] == [0, 1]   # round-robin among the node's learners


def test_unbound_collectors_are_dealt_round_robin_and_an_explicit_mapping_wins(tmp_path):
    topo = discover_topology(two_nodes(tmp_path / "sys", gpu_node=None))
    p = plan(cfg(num_collectors=4, dist={"num_learners": 2}, numa_binding="off"), topo)
    assert [x.device for x in p.learners] == ["cpu", "cpu"]     # no GPU: cpu learners
    assert [c.learner_index for c in p.collectors] == [0, 1, 0, 1]
    p = plan(cfg(num_collectors=4, dist={"num_learners": 2, "collector_learners": [1, 1, 0, 1]},
                 numa_binding="off"), topo)
    assert [c.learner_index for c in p.collectors] == [1, 1, 0, 1]
    assert job_settings(p_cfg := cfg(num_collectors=4, dist={"num_learners": 2}, numa_binding="off"),
                        plan(p_cfg, topo))["learner per collector"] == [0, 1, 0, 1]


def test_a_learner_without_collectors_in_the_default_mapping_is_refused(gpus2):
    # colocate puts both collectors on learner 0's node: learner 1 (node 1) would get nothing
    with pytest.raises(ConfigError, match=r"distributed.num_learners: learner 1 on NUMA node 1 has no collector"):
        plan(cfg(dist={"num_learners": 2}, placement="colocate"), gpus2)


def test_second_machine_learners_have_global_ranks_after_the_first_machines(gpus2):
    p = plan(cfg(num_collectors=2, dist={"num_learners": 2, "nnodes": 2, "node_rank": 1}), gpus2)
    assert [x.global_rank for x in p.learners] == [2, 3] and p.world_size == 4
    one = plan(cfg(num_collectors=1, dist={"nnodes": 2, "node_rank": 1}), gpus2)
    assert one.learner.global_rank == 1 and one.learner.name == "learner"
    assert "--learner-index" not in one.learner.argv     # one learner per machine: today's command
    assert "learner 0: global rank 1 (node_rank 1)" in format_plan(one)


def test_status_shows_every_learner_with_rank_device_and_collectors(job_name):
    settings = {"learner per collector": [1, 0, 1]}
    ctl = shm.ControlBlock.create(job_name, 3, settings, num_learners=2)
    lrn = [shm.ControlBlock.attach(job_name, "learner", learner_index=k, ingest_ids=[]) for k in (0, 1)]
    try:
        lrn[1].learner.update(pid=os.getpid(), state=int(shm.ProcState.RUNNING), global_rank=3, device="cuda:1",
                              env_steps=1234, num_updates=56, updates_per_s=7.5, learn_pct=42.0)
        text = format_status(take_snapshot(ctl))
        assert "learner 0 rank 0 - | not started yet (EMPTY) | collectors 1" in text
        line = next(x for x in text.splitlines() if x.startswith("learner 1 rank 3 cuda:1"))
        for part in ("RUNNING", "env_steps 1,234", "updates 56", "7.5 upd/s", "learn 42%", "collectors 0, 2"):
            assert part in line, line
    finally:
        for h in lrn:
            h.close()
        ctl.unlink()
        ctl.close()


def test_a_process_with_another_collector_to_learner_mapping_is_refused(job_name, tmp_path):
    from fastsac.shm_layout.job_settings import check_against_job
    topo = discover_topology(two_nodes(tmp_path / "sys", gpu_node=None))
    job_cfg = cfg(num_collectors=2, dist={"num_learners": 2}, numa_binding="off")
    job_plan = plan(job_cfg, topo)
    ctl = shm.ControlBlock.create(job_name, 2, job_settings(job_cfg, job_plan), num_learners=2)
    try:
        check_against_job(ctl, job_cfg, job_plan, "collector 1")   # the job's own mapping: accepted
        other = cfg(num_collectors=2, dist={"num_learners": 2, "collector_learners": [1, 0]}, numa_binding="off")
        with pytest.raises(ConfigError, match=r"learner per collector: \[0, 1\] in the running job, \[1, 0\] here"):
            check_against_job(ctl, other, plan(other, topo), "collector 1")
    finally:
        ctl.unlink()
        ctl.close()
