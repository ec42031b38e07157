"""Job plans on fake topologies: placement, CPU slices, env blocks, seeds, argv, every error."""
import json
import shlex

import pytest
from support.fake_sysfs import FakeGpu, build_sysfs, four_nodes_with_holes, smt_two_nodes, two_gpus, two_nodes

from fastsac.config import ConfigError, config_from_dict
from fastsac.machine.plan import CollectorPlan, JobPlan, plan_job, split_envs
from fastsac.machine.plan_output import format_plan, plan_to_json
from fastsac.machine.topology import discover_topology

PY = "/opt/py/bin/python3"
NUMACTL = "/usr/bin/numactl"
CFG = "job.yaml"


def cfg(num_envs=4096, seed=1, device="auto", **ao):
    return config_from_dict({"seed": seed, "device": device, "env": {"num_envs": num_envs},
                             "trainer": {"async_options": ao}})


def plan(c, topo, numactl=NUMACTL, overrides=()):
    p = plan_job(c, topo, CFG, list(overrides), python=PY, numactl_path=numactl)
    check_invariants(p, c)
    return p


def check_invariants(p: JobPlan, c) -> None:
    """The invariants promised in fastsac.machine.plan's docstring."""
    n = c.trainer.async_options.num_collectors
    assert [x.collector_id for x in p.collectors] == list(range(n))
    covered = [e for x in p.collectors for e in x.env_ids]
    assert covered == list(range(c.env.num_envs))
    counts = [x.env_count for x in p.collectors]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)
    assert [x.seed for x in p.collectors] == [c.seed + i for i in range(n)]
    if p.binding == "off":
        assert all(x.node is None and x.cpus == p.topology.allowed_cpus for x in p.processes)
    else:
        seen: set = set()
        for x in p.collectors:
            assert set(x.cpus) <= set(p.topology.node(x.node).cpus) and x.cpus
            assert not seen & set(x.cpus)
            seen |= set(x.cpus)
        assert set(p.learner.cpus) <= set(p.topology.node(p.learner.node).cpus)
    for x in p.processes:
        assert x.env_dict["OMP_NUM_THREADS"] == str(x.threads) and 1 <= x.threads <= len(x.cpus)
        assert x.command == shlex.join(x.argv)
    if p.binding == "off":   # every process may run anywhere: together never more threads than CPUs
        cpus = len(p.topology.allowed_cpus)
        assert sum(x.threads for x in p.processes) <= max(cpus, len(p.processes)), [x.threads for x in p.processes]
    else:
        assert all(x.threads == len(x.cpus) for x in p.collectors)


def collector_argv(i, *bind, prefix=(), overrides=()):
    return (*prefix, PY, "-m", "fastsac.collector_main", "--config", CFG, "--collector-id", str(i), *bind,
            *overrides)


def learner_argv(*bind, prefix=(), overrides=()):
    return (*prefix, PY, "-m", "fastsac.learner_main", "--config", CFG, *bind, *overrides)


@pytest.fixture
def two(tmp_path):
    return discover_topology(two_nodes(tmp_path / "two", gpu_node=1))


@pytest.fixture
def two_unknown_gpu(tmp_path):
    return discover_topology(two_nodes(tmp_path / "twou", gpu_node=-1))


# --------------------------------------------------------------------------- default config

@pytest.mark.parametrize("numactl", [None, NUMACTL])
def test_default_config_binds_nothing(two, numactl):
    c = config_from_dict({})
    p = plan(c, two, numactl=numactl, overrides=["seed=3"])
    assert p.binding == "off" and p.placement == "none" and p.numactl is None
    assert len(p.collectors) == 1
    col = p.collectors[0]
    assert col.node is None and col.cpus == tuple(range(8)) and col.binding == "off" and not col.manual
    assert (col.env_first, col.env_count, col.seed) == (0, 4096, 1)
    assert col.device == "cuda:0"     # 'auto' follows the learner, which 'auto' put on the GPU
    assert col.argv == collector_argv(0, overrides=["seed=3"])
    assert p.learner.argv == learner_argv(overrides=["seed=3"])
    assert p.learner.node is None and p.learner.cpus == tuple(range(8)) and p.learner.device == "cuda:0"
    assert not any("numactl" in a or a.startswith("--bind") for x in p.processes for a in x.argv)
    assert p.notes == ()


def test_default_config_on_this_host():
    t = discover_topology("/sys")
    p = plan_job(config_from_dict({}), t, CFG, [], python=PY, numactl_path=None)
    assert p.collectors[0].cpus == t.allowed_cpus and p.collectors[0].node is None


def test_default_numactl_path_is_looked_up_on_path(two, monkeypatch):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: "/found/numactl" if name == "numactl" else None)
    p = plan_job(cfg(num_collectors=2, numa_binding="auto"), two, CFG, [], python=PY)
    assert p.binding == "numactl" and p.collectors[0].argv[0] == "/found/numactl"


@pytest.mark.parametrize("key, value", [("numa_nodes", [1, 0]), ("cpus_per_collector", 1),
                                        ("learner_numa_node", 1), ("placement", "colocate")])
def test_binding_off_with_a_placement_key_is_a_contradiction(two, key, value):
    message = (f"trainer.async_options.{key}: {value!r} contradicts trainer.async_options.numa_binding: 'off' "
               f"(nothing is bound with 'off'); remove {key}, or set numa_binding to 'auto', 'numactl' or "
               "'inprocess'")
    with pytest.raises(ConfigError) as exc:   # config.py refuses it ...
        cfg(num_collectors=2, numa_binding="off", **{key: value})
    assert str(exc.value) == message
    with pytest.raises(ConfigError) as exc:   # ... and so does the plan, which must not trust its caller
        plan_job(_raw(num_collectors=2, numa_binding="off", **{key: value}), two, CFG, [], PY, NUMACTL)
    assert str(exc.value) == message


# --------------------------------------------------------------------------- numa_binding: auto (the default)

def test_auto_binds_several_collectors_on_several_nodes_without_a_second_switch(two):
    c = cfg(num_collectors=2)
    assert c.trainer.async_options.numa_binding == "auto"
    p = plan(c, two)
    assert (p.binding, p.requested_binding, p.placement) == ("numactl", "auto", "spread")
    assert [(x.node, x.cpus) for x in p.collectors] == [(0, (0, 1, 2, 3)), (1, (4, 5))]
    assert p.learner.node == 1 and p.learner.argv[:3] == (NUMACTL, "--physcpubind=6-7", "--membind=1")
    assert plan(cfg(num_collectors=2), two, numactl=None).binding == "inprocess"


@pytest.mark.parametrize("numactl", [None, NUMACTL])
def test_auto_with_one_collector_is_exactly_the_unbound_plan(two, numactl):
    auto, off = plan(cfg(), two, numactl=numactl), plan(cfg(numa_binding="off"), two, numactl=numactl)
    assert auto.binding == "off" and auto.requested_binding == "auto"
    assert auto.processes == off.processes and auto.notes == off.notes == ()
    assert format_plan(auto) == format_plan(off)   # byte-identical --plan output


def test_auto_on_one_node_binds_nothing_and_says_why(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, {0: "0-3"}))
    p = plan(cfg(num_collectors=2), t)
    assert p.binding == "off" and all(x.node is None for x in p.processes)
    assert p.notes == ("numa_binding 'auto' binds nothing: this process can use one NUMA node only; set "
                       "trainer.async_options.numa_binding to 'numactl' or 'inprocess' (or give cpus_per_collector) "
                       "to pin collectors to CPU slices of it",)


@pytest.mark.parametrize("key, value", [("numa_nodes", [0, 0]), ("cpus_per_collector", 2), ("learner_numa_node", 0),
                                        ("placement", "colocate")])
def test_auto_binds_when_a_placement_key_asks_for_it(tmp_path, key, value):
    t = discover_topology(build_sysfs(tmp_path, {0: "0-3"}))
    p = plan(cfg(num_collectors=2, **{key: value}), t)
    assert p.binding == "numactl" and [x.node for x in p.processes] == [0, 0, 0]
    assert plan(cfg(num_collectors=1, **({key: [0]} if key == "numa_nodes" else {key: value})), t).binding == "numactl"


def test_collectors_beyond_the_layout_maximum_are_refused(tmp_path):
    from fastsac.shm_layout import MAX_COLLECTORS
    t = discover_topology(build_sysfs(tmp_path, {0: "0-99", 1: "100-199"}))
    n = MAX_COLLECTORS + 1
    with pytest.raises(ConfigError) as exc:
        plan_job(cfg(num_envs=n, num_collectors=n), t, CFG, [], PY, NUMACTL)
    assert str(exc.value) == (f"trainer.async_options.num_collectors: {n} is out of range; a job has at most "
                              f"{MAX_COLLECTORS} collectors (the shared-memory layout's maximum)")
    assert len(plan(cfg(num_envs=n, num_collectors=MAX_COLLECTORS), t).collectors) == MAX_COLLECTORS


def test_unbound_collectors_need_a_cpu_each(two):
    with pytest.raises(ConfigError) as exc:
        plan_job(cfg(num_collectors=9, numa_binding="off"), two, CFG, [], PY, NUMACTL)
    assert str(exc.value) == ("trainer.async_options.num_collectors: 9 collectors but this process may use only 8 "
                              "CPUs (0-7); every collector needs its own CPU: use at most 8 collectors")
    assert len(plan(cfg(num_collectors=8, numa_binding="off"), two).collectors) == 8


# --------------------------------------------------------------------------- spread / colocate / explicit

def test_spread_one_collector_per_node_with_numactl(two):
    p = plan(cfg(num_collectors=2, numa_binding="numactl"), two)
    c0, c1 = p.collectors
    assert (p.binding, p.placement, p.numactl) == ("numactl", "spread", NUMACTL)
    assert (c0.node, c0.cpus, c1.node, c1.cpus) == (0, (0, 1, 2, 3), 1, (4, 5))
    assert c0.argv == collector_argv(0, prefix=(NUMACTL, "--cpunodebind=0", "--membind=0"))
    assert c1.argv == collector_argv(1, prefix=(NUMACTL, "--physcpubind=4-5", "--membind=1"))
    # the CUDA learner on the GPU's node keeps learner_cpus (2) of collector 1's node for itself
    assert p.learner.node == 1 and p.learner.cpus == (6, 7) and p.learner.threads == 2
    assert p.learner.argv == learner_argv(prefix=(NUMACTL, "--physcpubind=6-7", "--membind=1"))
    assert not any("learner shares" in n for n in p.notes)
    # learner_cpus 0: collector 1 takes the whole node and the learner shares it (and says so)
    p = plan(cfg(num_collectors=2, numa_binding="numactl", learner_cpus=0), two)
    assert p.collectors[1].cpus == (4, 5, 6, 7) and p.learner.cpus == (4, 5, 6, 7) and p.learner.threads == 1
    assert any("learner shares node 1's CPUs (4-7) with collector 1" in n for n in p.notes)


def test_spread_round_robin_slices_nodes(two):
    p = plan(cfg(num_collectors=4, numa_binding="numactl"), two)
    assert [x.node for x in p.collectors] == [0, 1, 0, 1]
    assert [x.cpus for x in p.collectors] == [(0, 1), (4,), (2, 3), (5,)]   # 6-7: the CUDA learner's
    # a slice of a node is enforced with --physcpubind: --cpunodebind would grant the whole node
    assert p.collectors[2].argv[:3] == (NUMACTL, "--physcpubind=2-3", "--membind=0")


def test_spread_over_four_nodes_with_holes(tmp_path):
    t = discover_topology(four_nodes_with_holes(tmp_path))
    p = plan(cfg(num_collectors=4, numa_binding="numactl", cpus_per_collector=2), t)
    assert [(x.node, x.cpulist) for x in p.collectors] == [(0, "0-1"), (1, "2-3"), (2, "4-5"), (3, "6-7")]
    assert p.learner.node == 0 and p.learner.cpulist == "8-9"   # GPU node unknown -> node 0
    assert p.collectors[1].argv[:3] == (NUMACTL, "--physcpubind=2-3", "--membind=1")


def test_spread_skips_unusable_nodes(tmp_path):
    t = discover_topology(four_nodes_with_holes(tmp_path), mems_allowed=[1, 3])
    p = plan(cfg(num_collectors=3, numa_binding="inprocess", learner_numa_node=3), t)
    assert [x.node for x in p.collectors] == [1, 3, 1]


def test_colocate_with_cpus_per_collector_leaves_the_rest_to_the_learner(two):
    p = plan(cfg(num_collectors=3, numa_binding="numactl", placement="colocate", cpus_per_collector=1), two)
    assert [(x.node, x.cpus) for x in p.collectors] == [(1, (4,)), (1, (5,)), (1, (6,))]
    assert p.learner.node == 1 and p.learner.cpus == (7,)
    assert p.learner.argv[:3] == (NUMACTL, "--physcpubind=7", "--membind=1")
    assert p.learner.env_dict["OMP_NUM_THREADS"] == "1"
    assert not any("shares" in n for n in p.notes)


def test_colocate_with_unknown_gpu_uses_node_0(two_unknown_gpu):
    p = plan(cfg(num_collectors=2, numa_binding="numactl", placement="colocate"), two_unknown_gpu)
    assert [x.node for x in p.processes] == [0, 0, 0]
    assert any("GPU's NUMA node is unknown" in n and "learner_numa_node" in n for n in p.notes)


def test_colocate_follows_an_explicit_learner_node(two_unknown_gpu):
    p = plan(cfg(num_collectors=2, numa_binding="numactl", placement="colocate", learner_numa_node=1,
                 cpus_per_collector=2), two_unknown_gpu)
    assert [x.node for x in p.processes] == [1, 1, 1]
    assert p.collectors[0].cpus == (4, 5) and p.collectors[1].cpus == (6, 7)
    assert p.learner.cpus == (4, 5, 6, 7) and any("learner shares" in n for n in p.notes)


def test_explicit_numa_nodes_win_over_placement(two):
    p = plan(cfg(num_collectors=3, numa_binding="numactl", placement="colocate", numa_nodes=[1, 0, 1]), two)
    assert p.placement == "explicit"
    assert [(x.node, x.cpus) for x in p.collectors] == [(1, (4,)), (0, (0, 1, 2, 3)), (1, (5,))]


def test_cpus_divided_evenly_first_collectors_get_the_extra(two):
    p = plan(cfg(num_collectors=3, numa_binding="inprocess", numa_nodes=[0, 0, 0], learner_numa_node=1), two)
    assert [x.cpus for x in p.collectors] == [(0, 1), (2,), (3,)]
    assert p.learner.cpus == (4, 5, 6, 7)


def test_idle_cpus_are_reported(two):
    p = plan(cfg(num_collectors=2, numa_binding="numactl", cpus_per_collector=1, learner_numa_node=1), two)
    assert p.learner.cpus == (5, 6, 7)
    assert "node 0: CPUs 1-3 are used by no process" in p.notes


def test_smt_slices_keep_siblings_together(tmp_path):
    t = discover_topology(smt_two_nodes(tmp_path, gpu_node=0))
    p = plan(cfg(num_collectors=2, numa_binding="numactl", placement="colocate", cpus_per_collector=4), t)
    assert [x.cpulist for x in p.collectors] == ["0-1,8-9", "2-3,10-11"]
    assert p.learner.cpulist == "0-3,8-11"  # nothing left on node 0: the learner shares it
    p = plan(cfg(num_collectors=3, numa_binding="numactl", placement="colocate", cpus_per_collector=2), t)
    assert [x.cpulist for x in p.collectors] == ["0,8", "1,9", "2,10"] and p.learner.cpulist == "3,11"


def test_learner_follows_the_learner_device_gpu(tmp_path):
    t = discover_topology(two_gpus(tmp_path))
    assert plan(cfg(numa_binding="numactl", device="cuda:1"), t).learner.node == 1
    assert plan(cfg(numa_binding="numactl", device="cuda"), t).learner.node == 0


def test_learner_on_cpu_device_notes_it(two):
    p = plan(cfg(numa_binding="numactl", device="cpu"), two)
    assert p.learner.node == 0 and any("learner device is 'cpu'" in n for n in p.notes)


def test_gpu_on_unusable_node_falls_back_with_a_note(tmp_path):
    t = discover_topology(two_nodes(tmp_path, gpu_node=1), allowed_cpus=[0, 1, 2, 3])
    p = plan(cfg(num_collectors=2, numa_binding="numactl"), t)
    assert p.learner.node == 0 and [x.node for x in p.collectors] == [0, 0]
    assert any("the GPU is on node 1, but none of its CPUs" in n for n in p.notes)


def test_partially_allowed_node_uses_cpunodebind_for_its_allowed_cpus(tmp_path):
    t = discover_topology(two_nodes(tmp_path), allowed_cpus=[2, 3, 4, 5, 6, 7])
    p = plan(cfg(num_collectors=2, numa_binding="numactl"), t)
    assert p.collectors[0].cpus == (2, 3)
    assert p.collectors[0].argv[:3] == (NUMACTL, "--cpunodebind=0", "--membind=0")  # kernel ANDs with the cpuset


# --------------------------------------------------------------------------- binding methods

def test_auto_without_numactl_binds_in_process(two):
    p = plan(cfg(num_collectors=2, numa_binding="auto", cpus_per_collector=2), two, numactl=None)
    assert p.binding == "inprocess" and p.requested_binding == "auto" and p.numactl is None
    assert p.collectors[1].argv == collector_argv(1, "--bind-node", "1", "--bind-cpus", "4-5")
    assert p.learner.argv == learner_argv("--bind-node", "1", "--bind-cpus", "6-7")
    assert any("'auto' -> 'inprocess': numactl is not on PATH" in n for n in p.notes)


def test_auto_with_numactl_uses_it(two):
    p = plan(cfg(num_collectors=2, numa_binding="auto"), two)
    assert p.binding == "numactl" and p.collectors[0].argv[0] == NUMACTL


def test_auto_on_a_kernel_without_numa_binds_in_process(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, None, cpu_online="0-3"))
    p = plan(cfg(num_collectors=2, numa_binding="auto", cpus_per_collector=2), t)
    assert p.binding == "inprocess" and [x.cpus for x in p.collectors] == [(0, 1), (2, 3)]
    assert any("kernel exposes no NUMA nodes" in n for n in p.notes)


def test_inprocess_argv_and_overrides_come_last(two):
    p = plan(cfg(num_collectors=2, numa_binding="inprocess"), two, overrides=["seed=3", "env.num_envs=8"])
    assert p.collectors[0].argv == collector_argv(0, "--bind-node", "0", "--bind-cpus", "0-3",
                                                  overrides=["seed=3", "env.num_envs=8"])


# --------------------------------------------------------------------------- envs, seeds, manual

@pytest.mark.parametrize("num_envs, n, blocks", [
    (10, 3, ((0, 4), (4, 3), (7, 3))), (8, 4, ((0, 2), (2, 2), (4, 2), (6, 2))), (3, 3, ((0, 1), (1, 1), (2, 1))),
    (4097, 2, ((0, 2049), (2049, 2048))), (5, 1, ((0, 5),)),
])
def test_split_envs(num_envs, n, blocks):
    assert split_envs(num_envs, n) == blocks


def test_uneven_envs_and_seeds_in_the_plan(two):
    p = plan(cfg(num_envs=10, seed=7, num_collectors=3, numa_binding="numactl"), two)
    assert [(x.env_first, x.env_count, x.seed) for x in p.collectors] == [(0, 4, 7), (4, 3, 8), (7, 3, 9)]
    assert p.learner.seed == 7


def test_manual_collectors_are_planned_and_printed_as_start_by_hand(two):
    p = plan(cfg(num_collectors=3, numa_binding="numactl", manual_collectors=[1]), two)
    assert [x.manual for x in p.collectors] == [False, True, False]
    assert p.manual_collectors == (p.collectors[1],)
    text = format_plan(p)
    assert f"collector 1: start by hand: {p.collectors[1].shell_command}" in text
    assert p.collectors[1].shell_command.startswith("BLIS_NUM_THREADS=2 CUDA_DEVICE_ORDER=PCI_BUS_ID "
                                                    "MKL_NUM_THREADS=2 ")
    assert p.collectors[1].shell_command.endswith(" " + p.collectors[1].command)
    assert "collector 1 (manual)" in text
    assert "collector 1 must be started by hand with the command shown; the launcher waits for it" in text


# --------------------------------------------------------------------------- output

def test_format_plan_shows_every_process_and_quoted_commands(tmp_path):
    t = discover_topology(two_nodes(tmp_path))
    c = cfg(num_envs=10, num_collectors=2, numa_binding="numactl", cpus_per_collector=2,
            collector_inference_device="cpu")
    p = plan_job(c, t, "my job.yaml", ["run_dir=/tmp/a b"], python=PY, numactl_path=NUMACTL)
    text = format_plan(p)
    assert "NUMA binding numactl, placement spread" in text
    lines = text.splitlines()
    row = next(line for line in lines if line.strip().startswith("collector 1 "))
    assert row.split() == ["collector", "1", "1", "4-5", "5-9", "(5)", "2", "cpu", "2", "numactl"]
    learner_row = next(line for line in lines if line.strip().startswith("learner "))
    assert learner_row.split() == ["learner", "1", "6-7", "-", "1", "cuda:0", "2", "numactl"]
    assert ("collector 0: /usr/bin/numactl --physcpubind=0-1 --membind=0 /opt/py/bin/python3 -m "
            "fastsac.collector_main --config 'my job.yaml' --collector-id 0 'run_dir=/tmp/a b'") in text
    assert "node 0: CPUs 0-3" in text and "GPU 0000:41:00.0 on node 1" in text
    assert "notes:" in text and "node 0: CPUs 2-3 are used by no process" in text


def test_plan_to_json_is_json_and_complete(two):
    p = plan(cfg(num_envs=10, num_collectors=2, numa_binding="numactl", manual_collectors=[0]), two)
    d = json.loads(json.dumps(plan_to_json(p)))
    assert d["binding"] == "numactl" and d["requested_binding"] == "numactl" and d["numactl"] == NUMACTL
    assert d["topology"]["gpu_node"] == 1 and d["topology"]["nodes"][1]["cpus"] == "4-7"
    c0 = d["collectors"][0]
    assert c0["argv"] == list(p.collectors[0].argv) and c0["cpulist"] == "0-3" and c0["cpus"] == [0, 1, 2, 3]
    assert (c0["collector_id"], c0["env_first"], c0["env_count"], c0["seed"], c0["manual"]) == (0, 0, 5, 1, True)
    assert c0["env"]["OMP_NUM_THREADS"] == "4" and c0["command"] == p.collectors[0].command
    assert d["learner"]["role"] == "learner" and "collector_id" not in d["learner"]
    assert d["notes"] == list(p.notes)


def test_plan_dataclasses_are_frozen(two):
    import dataclasses
    p = plan(cfg(), two)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.collectors[0].node = 3
    assert isinstance(p.collectors[0], CollectorPlan)


# --------------------------------------------------------------------------- every validation error

def _raw(**ao):
    """A config that bypasses config.py's checks, to prove the plan guards on its own."""
    c = cfg(num_envs=ao.pop("num_envs", 4096))
    for k, v in ao.items():
        setattr(c.trainer.async_options, k, v)
    return c


ERRORS = [
    ("numactl missing", dict(numa_binding="numactl"), None,
     "trainer.async_options.numa_binding: 'numactl' but no numactl executable was found on PATH; install it "
     "(Debian/Ubuntu: apt-get install numactl; RHEL: dnf install numactl) or use 'inprocess' (each process "
     "binds itself), 'auto' or 'off'"),
    ("numa_nodes negative", dict(numa_binding="numactl", num_collectors=2, numa_nodes=[0, -1]), NUMACTL,
     "trainer.async_options.numa_nodes[1]: -1 is not a NUMA node id; node ids are >= 0 (usable nodes: 0, 1)"),
    ("numa_nodes missing node", dict(numa_binding="numactl", num_collectors=2, numa_nodes=[0, 5]), NUMACTL,
     "trainer.async_options.numa_nodes[1]: node 5 does not exist; this machine has node(s) 0, 1 (usable: 0, 1)"),
    ("learner node missing", dict(numa_binding="inprocess", learner_numa_node=2), None,
     "trainer.async_options.learner_numa_node: node 2 does not exist; this machine has node(s) 0, 1 (usable: 0, 1)"),
    ("cpus_per_collector too big", dict(numa_binding="numactl", cpus_per_collector=5), NUMACTL,
     "trainer.async_options.cpus_per_collector: 5 is more than node 0 has (4 usable CPUs: 0-3)"),
    ("cpus_per_collector x k too big", dict(numa_binding="numactl", num_collectors=3, placement="colocate",
                                            cpus_per_collector=2), NUMACTL,
     "trainer.async_options.cpus_per_collector: 2 x 3 collectors on node 1 (collectors 0, 1, 2) needs 6 CPUs but "
     "node 1 has 4 usable CPUs (4-7); lower cpus_per_collector to at most 1, or place fewer collectors there"),
    ("more collectors than CPUs", dict(numa_binding="numactl", num_collectors=5, numa_nodes=[0, 0, 0, 0, 0]),
     NUMACTL,
     "trainer.async_options.num_collectors: 5 collectors on node 0 (collectors 0, 1, 2, 3, 4) but node 0 has only "
     "4 usable CPUs (0-3); every collector needs its own CPU: use fewer collectors or spread them "
     "(trainer.async_options.placement / numa_nodes)"),
]


@pytest.mark.parametrize("name, ao, numactl, message", ERRORS, ids=[e[0] for e in ERRORS])
def test_validation_errors(two, name, ao, numactl, message):
    with pytest.raises(ConfigError) as exc:
        plan_job(cfg(**ao), two, CFG, [], python=PY, numactl_path=numactl)
    assert str(exc.value) == message


RAW_ERRORS = [
    ("numa_nodes length", dict(numa_binding="numactl", num_collectors=2, numa_nodes=[0]),
     "trainer.async_options.numa_nodes: [0] has 1 entries but num_collectors is 2; give one node per collector "
     "or leave it empty"),
    ("learner node < -1", dict(numa_binding="numactl", learner_numa_node=-2),
     "trainer.async_options.learner_numa_node: -2 is not valid; expected -1 (the GPU's node) or a node id (0, 1)"),
    ("zero collectors", dict(num_collectors=0),
     "trainer.async_options.num_collectors: 0 is out of range; expected a value >= 1"),
    ("fewer envs than collectors", dict(num_collectors=5, num_envs=4),
     "env.num_envs: 4 is fewer than trainer.async_options.num_collectors (5); every collector needs at "
     "least one env"),
    ("manual id", dict(num_collectors=2, manual_collectors=[2]),
     "trainer.async_options.manual_collectors[0]: 2 is not a collector id; valid ids are 0..1"),
    ("negative cpus_per_collector", dict(numa_binding="numactl", cpus_per_collector=-1),
     "trainer.async_options.cpus_per_collector: -1 is out of range; expected a value >= 0 (0 = the node's CPUs "
     "shared evenly)"),
    ("bad binding", dict(numa_binding="yes"),
     "trainer.async_options.numa_binding: 'yes' is not valid; expected one of 'off', 'auto', 'numactl', 'inprocess'"),
    ("bad placement", dict(numa_binding="numactl", placement="pack"),
     "trainer.async_options.placement: 'pack' is not valid; expected one of 'spread', 'colocate'"),
]


@pytest.mark.parametrize("name, ao, message", RAW_ERRORS, ids=[e[0] for e in RAW_ERRORS])
def test_validation_errors_the_config_would_catch_first(two, name, ao, message):
    with pytest.raises(ConfigError) as exc:
        plan_job(_raw(**ao), two, CFG, [], python=PY, numactl_path=NUMACTL)
    assert str(exc.value) == message


def test_error_unusable_explicit_node(tmp_path):
    t = discover_topology(two_nodes(tmp_path), mems_allowed=[0])
    with pytest.raises(ConfigError) as exc:
        plan_job(cfg(num_collectors=2, numa_binding="numactl", numa_nodes=[0, 1]), t, CFG, [], PY, NUMACTL)
    assert str(exc.value) == ("trainer.async_options.numa_nodes[1]: node 1 is not usable by this process: it is "
                              "not in this process's Mems_allowed_list (cpuset); usable nodes: 0")


def test_error_unusable_learner_node(tmp_path):
    t = discover_topology(two_nodes(tmp_path), allowed_cpus=[4, 5, 6, 7])
    with pytest.raises(ConfigError) as exc:
        plan_job(cfg(numa_binding="numactl", learner_numa_node=0), t, CFG, [], PY, NUMACTL)
    assert str(exc.value) == ("trainer.async_options.learner_numa_node: node 0 is not usable by this process: none "
                              "of its CPUs (0-3) are in this process's allowed CPUs (cpuset/affinity); usable "
                              "nodes: 1")


def test_error_no_usable_node_at_all(tmp_path):
    t = discover_topology(two_nodes(tmp_path), mems_allowed=[])
    with pytest.raises(ConfigError) as exc:
        plan_job(cfg(numa_binding="inprocess"), t, CFG, [], PY, NUMACTL)
    assert str(exc.value).startswith("trainer.async_options.numa_binding: 'inprocess' needs a usable NUMA node but "
                                     "this process can use none: node 0: it is not in this process's "
                                     "Mems_allowed_list")
    assert str(exc.value).endswith("; fix the cpuset/affinity or set numa_binding: off")
    plan_job(cfg(numa_binding="off"), t, CFG, [], PY, NUMACTL)   # off still works there
    assert plan_job(cfg(num_collectors=2), t, CFG, [], PY, NUMACTL).binding == "off"   # and auto binds nothing


def test_error_numactl_on_a_kernel_without_numa(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, None, cpu_online="0-3"))
    with pytest.raises(ConfigError) as exc:
        plan_job(cfg(numa_binding="numactl"), t, CFG, [], PY, NUMACTL)
    assert str(exc.value) == (f"trainer.async_options.numa_binding: 'numactl' but this kernel exposes no NUMA nodes "
                              f"(no {tmp_path}/devices/system/node), where numactl refuses to run; use 'inprocess', "
                              "'auto' or 'off'")


def test_memoryless_gpu_node_is_not_used_for_the_learner(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, has_memory="0",
                                      gpus=[FakeGpu("0000:41:00.0", 1)]))
    p = plan(cfg(numa_binding="numactl"), t)
    assert p.learner.node == 0 and any("memory-less" in n for n in p.notes)
