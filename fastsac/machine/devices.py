"""Which device every process of the job uses, and why (torch-free).

The launcher, `--plan` and every child resolve devices here, from the config, the discovered
Topology and what torch build is installed, so a planned device is always concrete (`cpu` or
`cuda:K`) and the same in every process:

  * learner  `device: auto` is cuda:0 when an NVIDIA GPU is visible, cpu otherwise; `cuda` is
             cuda:0. Whether the installed torch can drive that GPU is not assumed: the launcher's
             preflight asks torch (in a child interpreter) and stops with exit 2 when it cannot,
             so `auto` never falls back to the CPU silently on a GPU machine.
  * collector inference `auto` (and `cuda`) follows the learner the collector feeds: that
             learner's GPU when it trains on CUDA, the CPU when it trains on the CPU. Collectors
             are never all sent to GPU 0.

Facts about the CUDA stack are read without importing torch: the torch version from its package
metadata, its CUDA version from torch/version.py, the driver from sysfs (module/nvidia/version).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from fastsac.config import Config, ConfigError

# CUDA numbers GPUs fastest-first by default; sysfs (and so the topology's GPU -> NUMA node map)
# lists them in PCI bus order. Every child gets this so that cuda:N is the N-th GPU of the plan.
DEVICE_ORDER_ENV = ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
_CUDA_RE = re.compile(r"cuda(?::(\d+))?$")
_AO = "trainer.async_options"
# The oldest Linux driver of each CUDA release torch publishes wheels for (NVIDIA's CUDA
# toolkit release notes, table 3), newest first: which --index-url fits a driver.
_WHEEL_FOR_DRIVER = ((580, "cu130"), (570, "cu128"), (560, "cu126"))
TORCH_INDEX = "https://download.pytorch.org/whl/"


@dataclass(frozen=True)
class TorchBuild:
    """The installed torch, as its files say: version ('2.13.0+cu128') and CUDA version ('12.8',
    None for a CPU-only build); version None when torch is not installed."""
    version: str | None
    cuda: str | None

    def describe(self) -> str:
        if self.version is None:
            return "torch not installed"
        return f"torch {self.version}" + (f" (CUDA {self.cuda})" if self.cuda else " (a CPU-only build)")


def installed_torch() -> TorchBuild:
    """The torch of this interpreter, without importing it (the launcher never imports torch)."""
    try:
        version = importlib.metadata.version("torch")
        spec = importlib.util.find_spec("torch")
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return TorchBuild(None, None)
    cuda = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = (Path(folder) / "version.py").read_text()
        except OSError:
            continue
        m = re.search(r"^cuda(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        cuda = m.group(1) if m else None
        break
    return TorchBuild(version, cuda)


def driver_version(sysfs_root: str = "/sys") -> str | None:
    """The NVIDIA kernel driver's version ('570.86.15'), None when no driver is loaded."""
    try:
        return (Path(sysfs_root) / "module" / "nvidia" / "version").read_text().strip() or None
    except OSError:
        pass
    if Path(sysfs_root) != Path("/sys"):
        return None          # a fake machine's tree is the whole machine
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return m.group(1) if m else None


def install_hint(driver: str | None) -> str:
    """The command that installs a torch this driver can run."""
    major = int(driver.split(".")[0]) if driver and driver.split(".")[0].isdigit() else None
    tag = next((t for d, t in _WHEEL_FOR_DRIVER if major is not None and major >= d), None)
    if major is not None and tag is None:
        return (f"the NVIDIA driver {driver} is older than any CUDA build of torch supports: update the driver "
                f"(>= {_WHEEL_FOR_DRIVER[-1][0]}), then .venv/bin/pip install --force-reinstall torch "
                f"--index-url {TORCH_INDEX}{_WHEEL_FOR_DRIVER[-1][1]}")
    return f".venv/bin/pip install --force-reinstall torch --index-url {TORCH_INDEX}{tag or 'cu128'}"


def cuda_index(device: str) -> int | None:
    m = _CUDA_RE.match(device)
    return None if m is None else int(m.group(1) or 0)


@dataclass(frozen=True)
class DeviceChoice:
    device: str    # concrete: 'cpu' or 'cuda:K'
    reason: str    # why, for --plan: "auto → cuda:0: 2 GPUs visible, torch 2.13.0+cu128"


def _gpus(topo) -> str:
    n = len(topo.gpus)
    return f"{n} GPU{'s' if n != 1 else ''} visible"


def _explicit(key: str, value: str, topo) -> DeviceChoice:
    if value == "cpu":
        return DeviceChoice("cpu", f"{key}: cpu")
    k = cuda_index(value)
    if k is None:
        raise ConfigError(f"{key}: {value!r} is not valid; expected auto, cpu, cuda or cuda:N")
    if topo.gpus and k >= len(topo.gpus):
        raise ConfigError(f"{key}: {value!r} but this machine has {len(topo.gpus)} NVIDIA GPU"
                          f"{'s' if len(topo.gpus) != 1 else ''} (cuda:0..cuda:{len(topo.gpus) - 1}); use one of "
                          "them, cpu or auto")
    return DeviceChoice(f"cuda:{k}", f"{key}: {value}" if value != "cuda" else f"{key}: cuda → cuda:0")


def learner_device_choices(cfg: Config, topo, torch_build: TorchBuild) -> list[DeviceChoice]:
    """The concrete device of each learner of this machine, with the reason (module docstring)."""
    d = cfg.distributed
    if d.learner_devices:
        if len(d.learner_devices) != d.num_learners:  # config.py checks it too; the plan must not trust it
            raise ConfigError(f"distributed.learner_devices: {d.learner_devices} has {len(d.learner_devices)} "
                              f"entries but num_learners is {d.num_learners}; give one device per learner or leave "
                              "it empty")
        out = [_explicit(f"distributed.learner_devices[{i}]", v, topo) for i, v in enumerate(d.learner_devices)]
        seen: dict[str, int] = {}
        for i, c in enumerate(out):
            if c.device != "cpu" and c.device in seen:
                raise ConfigError(f"distributed.learner_devices[{i}]: {d.learner_devices[i]!r} is the GPU of "
                                  f"learner {seen[c.device]} too; give every learner its own GPU (or cpu)")
            seen.setdefault(c.device, i)
        return out
    n = d.num_learners
    if cfg.device == "auto":
        if not topo.gpus:
            return [DeviceChoice("cpu", "auto → cpu: no NVIDIA GPU visible")] * n
        if n > len(topo.gpus):
            raise ConfigError(f"distributed.num_learners: {n} learners on cuda need {n} GPUs but this machine has "
                              f"{len(topo.gpus)}; use at most {len(topo.gpus)} learners per machine, device: cpu, "
                              "or give distributed.learner_devices")
        why = f"{_gpus(topo)}, {torch_build.describe()}"
        return [DeviceChoice(f"cuda:{k}", f"auto → cuda:{k}: {why}") for k in range(n)]
    if n == 1:
        return [_explicit("device", cfg.device, topo)]
    if cfg.device == "cpu":
        return [DeviceChoice("cpu", "device: cpu")] * n
    return [_explicit("distributed.num_learners", f"cuda:{k}", topo) for k in range(n)]


def collector_device_choice(value: str, learner: str, learner_index: int, several: bool, topo) -> DeviceChoice:
    """collector_inference_device for a collector that feeds the learner on `learner`."""
    key = f"{_AO}.collector_inference_device"
    who = f"learner {learner_index}" if several else "the learner"
    if value == "auto":
        if learner == "cpu":
            return DeviceChoice("cpu", f"auto → cpu: {who} trains on the CPU")
        return DeviceChoice(learner, f"auto → {learner}: the GPU of {who}")
    if value == "cuda":
        if learner != "cpu":
            return DeviceChoice(learner, f"cuda → {learner}: the GPU of {who}")
        return _explicit(key, "cuda:0", topo)
    return _explicit(key, value, topo)
