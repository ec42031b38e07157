"""Process-wide torch settings, each decided in this one place: which device, how many
threads, what happens to subnormal floats, and the CUDA settings (current device, TF32). Every
process that runs torch code (learner, collector, synchronous trainer) calls configure_torch
once at start and opens its device with open_device before any other CUDA call.
"""
from __future__ import annotations

import os
from typing import Callable

from fastsac.errors import ConfigError
from fastsac.machine import devices as dv
from fastsac.machine.topology import discover_topology


def _cuda_unusable(key: str, name: str) -> ConfigError:
    """The error for a CUDA device torch cannot drive: torch's CUDA, the driver, the install command."""
    import torch  # torch-free at import: configured after the process is bound
    driver = dv.driver_version()
    build = dv.TorchBuild(torch.__version__, torch.version.cuda).describe()
    return ConfigError(f"{key}: {name!r} needs CUDA but {build} cannot use it (NVIDIA driver "
                       f"{driver or 'not loaded'}); install a torch that can: {dv.install_hint(driver)}; or set "
                       f"{key}: cpu")


def resolve_device(name: str, key: str = "device"):
    """The concrete torch.device of a device name: 'cuda' is cuda:0; 'auto' is cuda:0 when torch
    can use a GPU, cpu when the machine has none, and an error (never the CPU) when a GPU is
    visible but torch cannot use it. A cuda device torch cannot use is a ConfigError naming why.
    The async processes get concrete names from their plan (fastsac.machine.devices)."""
    os.environ.setdefault(*dv.DEVICE_ORDER_ENV)   # before torch reads it (configure_torch says why)
    import torch  # torch-free at import: configured after the process is bound
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", 0)
        if not discover_topology().gpus:
            return torch.device("cpu")
        raise _cuda_unusable(key, "auto")
    if name == "cpu":
        return torch.device("cpu")
    index = dv.cuda_index(name)
    if index is None:
        raise ConfigError(f"{key}: {name!r} is not valid; expected auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise _cuda_unusable(key, name)
    if index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ConfigError(f"{key}: {name!r} but torch sees {count} GPU{'s' if count != 1 else ''} "
                          f"(cuda:0..cuda:{count - 1}); use one of them, cpu or auto")
    return torch.device("cuda", index)


def describe_device(device) -> str:
    """One line for a process's first log lines: torch, CUDA, driver, the GPU and its compute capability."""
    import torch  # torch-free at import: configured after the process is bound
    if device.type != "cuda":
        return f"device {device}: torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s)"
    major, minor = torch.cuda.get_device_capability(device)
    return (f"device {device}: {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}), torch "
            f"{torch.__version__}, CUDA {torch.version.cuda}, driver {dv.driver_version() or 'unknown'}")


def open_device(name: str, key: str = "device", tf32: bool = True, log: Callable[[str], None] | None = None):
    """Resolve this process's device and make it current; the first CUDA call of the process.

    torch.cuda.set_device first: without it every stream, event and context of the process
    starts on GPU 0 (an event recorded on cuda:0's stream never covers a copy on cuda:1, and a
    stray context takes ~0.5 GB of GPU 0). TF32 (algo.tf32): fp32 matmuls on the tensor cores,
    as the reference implementation runs them."""
    import torch  # torch-free at import: configured after the process is bound
    device = resolve_device(name, key)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = tf32
    if log is not None:
        log(describe_device(device) + (f", TF32 {'on' if tf32 else 'off'}" if device.type == "cuda" else ""))
    return device


def configure_torch(num_threads: int | None = None) -> None:
    """Flush subnormal floats to zero, and (when given) use num_threads intra-op threads.

    Subnormals (e.g. Adam's second moments of tiny early gradients) run ~100x slower on x86
    CPUs: measured 150 ms instead of 10 ms per update for the first hundred updates of the
    quick-start nets; flushing them to zero changes no result that matters. The thread count
    is the CPUs the process owns: oversubscription halves throughput. Both are process-wide.
    CUDA_DEVICE_ORDER before torch touches CUDA: cuda:N is then the N-th GPU in PCI bus order,
    the order of the plan's GPU -> NUMA node map (the launcher sets it in every child too).
    """
    os.environ.setdefault(*dv.DEVICE_ORDER_ENV)
    import torch  # torch-free at import: configured after the process is bound
    torch.set_flush_denormal(True)
    if num_threads is not None:
        torch.set_num_threads(max(1, num_threads))
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set (only allowed once, before any parallel work)
            pass
