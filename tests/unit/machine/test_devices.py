"""Every planned device is concrete (cpu or cuda:K) with its reason, on fake machines with 1, 2 and
8 GPUs over 1 and 2 nodes (fastsac.machine.devices, placement and --plan)."""
import json

import pytest
from support.fake_sysfs import FakeGpu, build_sysfs, two_gpus, two_nodes
from support.learner_plans import cfg, plan

from fastsac.config import ConfigError
from fastsac.machine import devices as dv
from fastsac.machine.plan_output import format_plan, plan_to_json
from fastsac.machine.topology import discover_topology

CU128 = dv.TorchBuild("2.13.0+cu128", "12.8")


def gpu_plan(c, topo, build=CU128):
    from fastsac.machine.plan import plan_job
    from support.learner_plans import NUMACTL, PY
    return plan_job(c, topo, "job.yaml", [], python=PY, numactl_path=NUMACTL, torch_build=build)


@pytest.fixture
def one_gpu_one_node(tmp_path):
    return discover_topology(build_sysfs(tmp_path / "s", {0: "0-7"}, gpus=[FakeGpu("0000:41:00.0", 0)]))


@pytest.fixture
def gpus2(tmp_path):
    """node 0: CPUs 0-3 with cuda:0, node 1: CPUs 4-7 with cuda:1 (PCI order: 41 before c1)."""
    return discover_topology(two_gpus(tmp_path / "s"))


@pytest.fixture
def gpus8(tmp_path):
    gpus = [FakeGpu(f"0000:{0x10 * (i + 1):02x}:00.0", 0 if i < 4 else 1) for i in range(8)]
    return discover_topology(build_sysfs(tmp_path / "s", {0: "0-15", 1: "16-31"}, gpus=gpus))


def test_auto_is_cuda_0_with_a_gpu_and_says_why(one_gpu_one_node):
    p = gpu_plan(cfg(num_collectors=1), one_gpu_one_node)
    assert p.learner.device == "cuda:0"
    assert p.learner.device_reason == "auto → cuda:0: 1 GPU visible, torch 2.13.0+cu128 (CUDA 12.8)"
    assert p.collectors[0].device == "cuda:0" and p.collectors[0].device_reason == \
        "auto → cuda:0: the GPU of the learner"
    text = format_plan(p)
    assert "devices:\n  learner:     cuda:0 (auto → cuda:0: 1 GPU visible, torch 2.13.0+cu128 (CUDA 12.8))" in text
    assert "  collector 0: cuda:0 (auto → cuda:0: the GPU of the learner)" in text
    assert plan_to_json(p)["learner"]["device_reason"].startswith("auto → cuda:0")


def test_auto_without_a_gpu_is_the_cpu_for_learner_and_collectors(tmp_path):
    p = gpu_plan(cfg(num_collectors=2), discover_topology(two_nodes(tmp_path / "s", gpu_node=None)))
    assert [x.device for x in p.processes] == ["cpu", "cpu", "cpu"]
    assert p.learner.device_reason == "auto → cpu: no NVIDIA GPU visible"
    assert p.collectors[1].device_reason == "auto → cpu: the learner trains on the CPU"


def test_a_cpu_learner_on_a_gpu_machine_keeps_its_collectors_off_the_gpu(gpus2):
    p = gpu_plan(cfg(num_collectors=2, device="cpu"), gpus2)
    assert [x.device for x in p.processes] == ["cpu", "cpu", "cpu"]


def test_two_machines_one_gpu_each_plan_a_concrete_device_per_learner(tmp_path):
    """nnodes 2, num_learners 1: a learner group of 2 whose learner device must carry an index
    (torch.cuda.set_device / init_process_group(device_id=...) refuse 'cuda')."""
    topo = discover_topology(two_nodes(tmp_path / "s", gpu_node=1))
    for rank in (0, 1):
        p = gpu_plan(cfg(num_collectors=2, dist={"nnodes": 2, "node_rank": rank}), topo)
        assert p.world_size == 2 and p.learner.global_rank == rank
        assert p.learner.device == "cuda:0" and [c.device for c in p.collectors] == ["cuda:0", "cuda:0"]
    explicit = gpu_plan(cfg(num_collectors=2, device="cuda", dist={"nnodes": 2, "node_rank": 0}), topo)
    assert explicit.learner.device == "cuda:0" and explicit.learner.device_reason == "device: cuda → cuda:0"


def test_collectors_infer_on_the_gpu_of_the_learner_they_feed(gpus2):
    p = gpu_plan(cfg(num_collectors=4, dist={"num_learners": 2}), gpus2)
    assert [x.device for x in p.learners] == ["cuda:0", "cuda:1"]
    assert [(c.node, c.learner_index, c.device) for c in p.collectors] == \
        [(0, 0, "cuda:0"), (1, 1, "cuda:1"), (0, 0, "cuda:0"), (1, 1, "cuda:1")]
    assert p.collectors[1].device_reason == "auto → cuda:1: the GPU of learner 1"
    cpu = gpu_plan(cfg(num_collectors=4, dist={"num_learners": 2}, collector_inference_device="cpu"), gpus2)
    assert {c.device for c in cpu.collectors} == {"cpu"}


def test_eight_gpus_two_nodes(gpus8):
    p = gpu_plan(cfg(num_collectors=8, num_envs=64, dist={"num_learners": 8}), gpus8)
    assert [x.device for x in p.learners] == [f"cuda:{k}" for k in range(8)]
    assert [x.node for x in p.learners] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert sorted({c.device for c in p.collectors}) == [f"cuda:{k}" for k in range(8)]
    assert all(c.device == p.learners[c.learner_index].device for c in p.collectors)


@pytest.mark.parametrize("devices, message", [
    (["cuda:1", "cuda:1"], "distributed.learner_devices[1]: 'cuda:1' is the GPU of learner 0 too; give every "
                           "learner its own GPU (or cpu)"),
    (["cuda:0", "cuda:2"], "distributed.learner_devices[1]: 'cuda:2' but this machine has 2 NVIDIA GPUs "
                           "(cuda:0..cuda:1); use one of them, cpu or auto"),
])
def test_duplicate_or_out_of_range_learner_devices_are_refused(gpus2, devices, message):
    with pytest.raises(ConfigError) as exc:
        gpu_plan(cfg(num_collectors=2, dist={"num_learners": 2, "learner_devices": devices}), gpus2)
    assert str(exc.value) == message


def test_more_auto_learners_than_gpus_is_refused(gpus2):
    with pytest.raises(ConfigError, match=r"distributed.num_learners: 3 learners on cuda need 3 GPUs but this "
                                          r"machine has 2"):
        gpu_plan(cfg(num_collectors=3, dist={"num_learners": 3}), gpus2)


def test_every_process_gets_pci_bus_order(gpus2):
    p = gpu_plan(cfg(num_collectors=2, dist={"num_learners": 2}), gpus2)
    assert all(x.env_dict["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for x in p.processes)
    assert json.loads(json.dumps(plan_to_json(p)))["collectors"][0]["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_cuda_learner_keeps_cpus_of_its_own_on_the_gpus_node(gpus2):
    p = gpu_plan(cfg(num_collectors=2), gpus2)
    assert p.learner.node == 0 and p.learner.cpus == (2, 3) and p.learner.threads == 2
    assert p.collectors[0].cpus == (0, 1) and p.collectors[1].cpus == (4, 5, 6, 7)
    assert "  learner      0     2-3" in format_plan(p)
    one = gpu_plan(cfg(num_collectors=2, learner_cpus=1), gpus2)
    assert one.learner.cpus == (3,) and one.collectors[0].cpus == (0, 1, 2)
    cpu = gpu_plan(cfg(num_collectors=2, device="cpu"), gpus2)   # a CPU learner: as before
    assert cpu.collectors[0].cpus == (0, 1, 2, 3)
    c = cfg(num_collectors=2)
    c.eval.interval = 5          # the evaluator's CPU comes out of the collectors' too, not the learner's two
    e = gpu_plan(c, gpus2)
    assert e.learner.cpus == (1, 2) and e.learner.threads == 2 and e.evaluator.cpus == (3,)
    assert e.collectors[0].cpus == (0,)


def test_installed_torch_and_driver_are_read_without_importing_torch(tmp_path, monkeypatch):
    import importlib.metadata
    import importlib.util
    import types
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "version.py").write_text("from typing import Optional\n__version__ = '2.13.0+cu128'\n"
                                    "cuda: Optional[str] = '12.8'\n")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cu128")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: types.SimpleNamespace(submodule_search_locations=[str(pkg)]))
    assert dv.installed_torch() == dv.TorchBuild("2.13.0+cu128", "12.8")
    root = tmp_path / "sys"
    assert dv.driver_version(str(root)) is None
    (root / "module" / "nvidia").mkdir(parents=True)
    (root / "module" / "nvidia" / "version").write_text("570.86.15\n")
    assert dv.driver_version(str(root)) == "570.86.15"


@pytest.mark.parametrize("driver, index", [("580.65.06", "cu130"), ("570.86.15", "cu128"), ("565.57.01", "cu126"),
                                           (None, "cu128")])
def test_install_hint_names_a_wheel_the_driver_runs(driver, index):
    assert dv.install_hint(driver).endswith(f"--index-url https://download.pytorch.org/whl/{index}")
    assert "update the driver" in dv.install_hint("535.104.05")
