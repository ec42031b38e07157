"""GPU memory before spawning (fastsac.launch.gpu_memory): each GPU of the plan must hold its
learners' replay buffers, networks, staging and every CUDA context on it; exit 2 names the key
and, for the replay buffer, the largest value that fits. Fake 1- and 2-GPU machines, the torch
probe's numbers given."""
from types import SimpleNamespace

import pytest
from support.fake_sysfs import FakeGpu, build_sysfs, two_gpus
from support.learner_plans import NUMACTL, PY, cfg

from fastsac.config import ConfigError
from fastsac.launch import gpu_memory
from fastsac.machine import devices as dv
from fastsac.machine.plan import plan_job
from fastsac.machine.topology import discover_topology

HUMANOID = SimpleNamespace(obs_dim=348, critic_obs_dim=0, act_dim=17)
GIB = 1 << 30


def _plan(c, topo):
    return plan_job(c, topo, "job.yaml", [], python=PY, numactl_path=NUMACTL,
                    torch_build=dv.TorchBuild("2.13.0+cu128", "12.8"))


def _probe(monkeypatch, *free_gib):
    monkeypatch.setattr(gpu_memory, "torch_cuda_probe", lambda: {
        "version": "2.13.0+cu128", "cuda": "12.8",
        "gpus": [{"name": "NVIDIA H100", "free": int(f * GIB), "total": 80 * GIB} for f in free_gib]})


@pytest.fixture
def one_gpu(tmp_path):
    return discover_topology(build_sysfs(tmp_path / "s", {0: "0-7"}, gpus=[FakeGpu("0000:41:00.0", 0)]))


def _humanoid(**algo):
    c = cfg(num_collectors=1, num_envs=4096)
    for k, v in {"buffer_size": 1024, **algo}.items():
        setattr(c.algo, k, v)
    return c


def test_a_replay_buffer_too_big_for_the_gpu_names_the_largest_buffer_size_that_fits(monkeypatch, one_gpu):
    _probe(monkeypatch, 8)
    c = _humanoid()
    with pytest.raises(ConfigError) as exc:
        gpu_memory.check_gpu_memory(c, HUMANOID, _plan(c, one_gpu))
    msg = str(exc.value)
    assert msg.startswith("algo.buffer_size: 1024 slots per env for 4,096 env rows on cuda:0: the learner's GPU "
                          "memory would need ")
    assert "but cuda:0 (NVIDIA H100) has 8,589,934,592 bytes (8.00 GiB) free" in msg
    fits = int(msg.split("the largest algo.buffer_size that fits is ")[1].split(" ")[0].replace(",", ""))
    assert 0 < fits < 1024
    c.algo.buffer_size = fits
    gpu_memory.check_gpu_memory(c, HUMANOID, _plan(c, one_gpu))      # the named value fits ...
    c.algo.buffer_size = fits + 1
    with pytest.raises(ConfigError):
        gpu_memory.check_gpu_memory(c, HUMANOID, _plan(c, one_gpu))  # ... and one more does not


def test_collector_contexts_on_the_learners_gpu_count(monkeypatch, tmp_path):
    topo = discover_topology(two_gpus(tmp_path / "s"))
    c = cfg(num_collectors=6, num_envs=60)
    c.algo.buffer_size = 64
    _probe(monkeypatch, 3, 80)
    with pytest.raises(ConfigError, match=r"^trainer.async_options.collector_inference_device: cuda:0: the CUDA "
                                          r"contexts of 6 collectors and the learner on it need "):
        gpu_memory.check_gpu_memory(c, HUMANOID, _plan(c, topo))
    c.trainer.async_options.collector_inference_device = "cpu"
    gpu_memory.check_gpu_memory(c, HUMANOID, _plan(c, topo))


def test_a_cpu_job_asks_no_gpu(monkeypatch, one_gpu):
    monkeypatch.setattr(gpu_memory, "torch_cuda_probe", lambda: pytest.fail("no GPU planned: no probe"))
    c = _humanoid()
    c.device = "cpu"
    gpu_memory.check_gpu_memory(c, HUMANOID, _plan(c, one_gpu))
