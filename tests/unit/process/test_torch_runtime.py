"""The device a torch process opens: concrete, current before any other CUDA call, TF32 as
configured, and an error (never a CPU run) when torch cannot drive a visible GPU. On a CPU-only
torch with a recorded fake torch.cuda (tests/support/fake_cuda.py)."""
import pytest
import torch
from support.fake_cuda import FakeCuda
from support.fake_sysfs import two_gpus, two_nodes

from fastsac.errors import ConfigError
from fastsac.process import torch_runtime as rt


@pytest.fixture
def precision(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", seen.append)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    return seen


def test_open_device_makes_the_planned_gpu_current_first_and_turns_tf32_on(monkeypatch, precision):
    cuda = FakeCuda(monkeypatch, count=2).install()
    lines = []
    dev = rt.open_device("cuda:1", log=lines.append)
    assert dev == torch.device("cuda", 1)
    assert cuda.calls[0] == ("set_device", 1)
    assert precision == ["high"] and torch.backends.cudnn.allow_tf32 is True
    assert lines and lines[0].startswith("device cuda:1: NVIDIA Fake GPU (compute capability 9.0), torch ")
    assert "CUDA" in lines[0] and "driver" in lines[0] and lines[0].endswith("TF32 on")
    rt.open_device("cuda:0", tf32=False)
    assert precision[-1] == "highest" and torch.backends.cudnn.allow_tf32 is False


def test_an_index_less_cuda_is_cuda_0(monkeypatch, precision):
    cuda = FakeCuda(monkeypatch, count=1).install()
    assert rt.resolve_device("cuda") == torch.device("cuda", 0)
    rt.open_device("cuda")          # torch.cuda.set_device('cuda') would raise ValueError
    assert cuda.calls[0] == ("set_device", 0)


def test_a_cpu_device_touches_no_cuda(monkeypatch, precision):
    cuda = FakeCuda(monkeypatch, count=1).install()
    assert rt.open_device("cpu") == torch.device("cpu") and cuda.calls == [] and precision == []


def test_cuda_that_torch_cannot_use_names_the_build_driver_and_fix(monkeypatch, tmp_path):
    FakeCuda(monkeypatch, available=False).install()
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(rt.dv, "driver_version", lambda root="/sys": "570.86.15")
    with pytest.raises(ConfigError) as exc:
        rt.resolve_device("cuda:0", "trainer.async_options.collector_inference_device")
    assert str(exc.value) == (
        f"trainer.async_options.collector_inference_device: 'cuda:0' needs CUDA but torch {torch.__version__} "
        "(a CPU-only build) cannot use it (NVIDIA driver 570.86.15); install a torch that can: .venv/bin/pip "
        "install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128; or set "
        "trainer.async_options.collector_inference_device: cpu")


def test_auto_is_the_cpu_only_without_a_gpu(monkeypatch, tmp_path):
    FakeCuda(monkeypatch, available=False).install()
    monkeypatch.setenv("FASTSAC_SYSFS_ROOT", str(two_nodes(tmp_path / "none", gpu_node=None)))
    assert rt.resolve_device("auto") == torch.device("cpu")
    monkeypatch.setenv("FASTSAC_SYSFS_ROOT", str(two_gpus(tmp_path / "gpus")))
    with pytest.raises(ConfigError, match=r"device: 'auto' needs CUDA but torch .* cannot use it"):
        rt.resolve_device("auto")


def test_an_out_of_range_gpu_is_a_config_error(monkeypatch):
    FakeCuda(monkeypatch, count=2).install()
    with pytest.raises(ConfigError, match=r"device: 'cuda:2' but torch sees 2 GPUs \(cuda:0..cuda:1\)"):
        rt.resolve_device("cuda:2")


def test_configure_torch_numbers_gpus_in_pci_bus_order(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setattr(torch, "set_flush_denormal", lambda on: True)
    rt.configure_torch()
    import os
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
