"""Checks that need the machine, run by the launcher before it spawns a process or creates a file.

Each raises ConfigError (exit code 2) naming the key, the value and what would be valid:
  run_dir        not inside /proc or /sys (nor on another kernel pseudo-filesystem), a directory
                 or creatable, writable;
  resume         an explicit checkpoint path exists and is a readable file;
  devices        every planned cuda device (`auto` on a GPU machine included) exists: cheaply from
                 the driver's device nodes, then confirmed by torch in a subprocess, so a CPU-only
                 torch build is exit 2, never a silent CPU run. The launcher never imports torch;
  memory         the whole job (processes, training and eval envs, a CPU learner's replay buffer
                 and networks): fastsac.launch.memory_check;
  shared memory  every ring and weight snapshot of the job (plus its control block) fits the free
                 space of /dev/shm.
Torch-free; numpy only through fastsac.shm_layout, imported by the shared-memory check alone.
"""
from __future__ import annotations

import errno
import importlib.util
import json
import netrc
import os
import re
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

from fastsac import shm_layout as shm
from fastsac.config import Config, ConfigError
from fastsac.machine import devices as dv
from fastsac.machine.topology import discover_topology
from fastsac.run_dir.contents import resolved
from fastsac.shm_layout.policy_layout import policy_flat_numel

AO = "trainer.async_options"
# Kernel interfaces that look like directories but store nothing (mkdir fails there, or worse:
# under /sys/fs/cgroup it creates a cgroup).
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "devtmpfs", "devpts", "debugfs", "tracefs", "securityfs", "configfs",
    "pstore", "bpf", "efivarfs", "fusectl", "mqueue", "binfmt_misc", "nsfs", "selinuxfs", "rpc_pipefs", "autofs",
})
_KERNEL_TREES = ("/proc", "/sys")
# the longest relative path a run writes below run_dir: checkpoints/ckpt_<32 hex>-<6>_<14>.pt is
# 74 bytes, a TensorBoard file's name carries the host name (up to 64) and a timestamp
RUN_DIR_HEADROOM = 256
TORCH_PROBE_TIMEOUT_S = 300  # importing torch + CUDA init; minutes only on a cold, slow disk


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


# --------------------------------------------------------------------------- run_dir

def _fs_type(path: str) -> str | None:
    """Filesystem type of the mount holding `path` (an existing, resolved path), from mountinfo."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best, fstype = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040 = space
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):  # the last of equal mount points is the visible one
            best, fstype = mount, right.split()[0]
    return fstype


def _nearest_existing(path: str) -> str:
    probe = Path(path)
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    return str(probe)


def check_path_fits(key: str, value: str, headroom: int = 0) -> None:
    """A path the filesystem can name: no component longer than its NAME_MAX, the whole (plus
    `headroom`, the longest name the run adds below it) within PATH_MAX. Without this check
    the first stat() of it fails with ENAMETOOLONG, as a traceback. A symbolic link loop (ELOOP)
    is refused by name here too, before anything looks at the path."""
    resolved(key, value)
    base = _nearest_existing(os.path.abspath(value))
    name_max, path_max = os.pathconf(base, "PC_NAME_MAX"), os.pathconf(base, "PC_PATH_MAX")
    for part in Path(value).parts:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(f"{key}: the path component {part[:40]!r}... is {len(os.fsencode(part))} bytes long; "
                              f"this filesystem allows names of at most {name_max} bytes; choose a shorter {key}")
    length = len(os.fsencode(os.path.abspath(value)))
    if length + headroom >= path_max:
        extra = f" (plus {headroom} for the files the run writes inside it)" if headroom else ""
        raise ConfigError(f"{key}: the path is {length} bytes long{extra}; paths may be at most {path_max - 1} bytes "
                          f"here; choose a shorter {key}")


def check_run_dir(cfg: Config) -> None:
    """run_dir must be (or become) a writable directory on storage. Creates nothing."""
    path = cfg.run_path
    shown = str(path)
    check_path_fits("run_dir", shown, RUN_DIR_HEADROOM)
    real = os.path.realpath(path)  # symlinks resolved: a link into /proc is /proc
    for tree in _KERNEL_TREES:
        if real == tree or real.startswith(tree + "/"):
            raise ConfigError(f"run_dir: {shown!r} is inside {tree}, a kernel interface that stores no files; choose "
                              "a directory on a real filesystem (e.g. runs/<job_name> or /var/lib/fastsac/runs/<job>)")
    probe = Path(real)
    while not probe.exists():
        probe = probe.parent
    fstype = _fs_type(str(probe))
    if fstype in PSEUDO_FILESYSTEMS:
        raise ConfigError(f"run_dir: {shown!r} is on a {fstype} filesystem ({str(probe)!r}), a kernel interface that "
                          "stores no files; choose a directory on a real filesystem")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run_dir: {shown!r} exists and is not a directory; choose another run_dir")
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        what = "it" if probe == Path(real) else f"its nearest existing parent {str(probe)!r}"
        raise ConfigError(f"run_dir: {shown!r} is not writable ({what} is not a writable directory); choose "
                          "another run_dir")


# --------------------------------------------------------------------------- optional extras

def check_extras(cfg: Config) -> None:
    """A feature the config turns on whose optional extra is not installed, or W&B online without
    credentials: exit 2 now, not a learner that fails after the job started."""
    if cfg.logging.wandb.enabled and importlib.util.find_spec("wandb") is None:
        raise ConfigError("logging.wandb.enabled: true needs Weights & Biases, which is not installed; install it "
                          "with pip install 'fastsac[wandb]', or set logging.wandb.enabled=false")
    if cfg.logging.wandb.enabled and (why := missing_wandb_credentials(cfg.logging.wandb.mode)):
        raise ConfigError(f"logging.wandb.mode: 'online' needs W&B credentials, and {why}; run `wandb login` (or set "
                          "WANDB_API_KEY) as the job's user, or set logging.wandb.mode=offline (or "
                          "logging.wandb.enabled=false)")


WANDB_OFFLINE_MODES = ("offline", "dryrun", "disabled")   # WANDB_MODE values that never contact a server


def missing_wandb_credentials(mode: str) -> str | None:
    """Why an online W&B run would fail to log in (None: it has what wandb.init reads: WANDB_API_KEY,
    or the server's entry in ~/.netrc that `wandb login` writes), without importing wandb."""
    if mode != "online" or os.environ.get("WANDB_MODE", "").lower() in WANDB_OFFLINE_MODES \
            or os.environ.get("WANDB_API_KEY"):
        return None
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        if netrc.netrc(path).authenticators(host):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    return f"this user has none (no WANDB_API_KEY, WANDB_MODE is not offline, no {host} entry in {path})"


# --------------------------------------------------------------------------- resume

def check_resume(cfg: Config) -> None:
    value = cfg.resume
    if value in ("", "auto"):
        return
    valid = "expected '' (fresh start), 'auto' (the newest valid checkpoint in run_dir) or the path of a checkpoint file"
    check_path_fits("resume", value)
    p = Path(value)
    if not p.exists():
        raise ConfigError(f"resume: {value!r} does not exist; {valid}")
    if not p.is_file():
        raise ConfigError(f"resume: {value!r} is not a file; {valid}")
    if not os.access(p, os.R_OK):
        raise ConfigError(f"resume: {value!r} is not readable by this user; {valid}")


# --------------------------------------------------------------------------- devices

def _driver_gpu_count() -> int:
    """NVIDIA GPUs the driver shows this process: its /dev/nvidia<N> nodes (a container gets only
    the ones passed to it), else /proc/driver/nvidia/gpus (nodes can be created on first use)."""
    try:
        nodes = [n for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)]
    except OSError:
        nodes = []
    if nodes:
        return len(nodes)
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def visible_gpu_count() -> int:
    """GPUs CUDA will see: the driver's GPUs filtered by CUDA_VISIBLE_DEVICES the way the CUDA
    runtime reads it (indices in range, UUIDs; parsing stops at the first invalid entry)."""
    count = _driver_gpu_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count
    picked = 0
    for tok in (t.strip() for t in visible.split(",")):
        if (tok.isdigit() and int(tok) < count) or tok.upper().startswith(("GPU-", "MIG-")):
            picked += 1
            continue
        break
    return min(picked, count)


_TORCH_PROBE = """
import json, torch
ok = torch.cuda.is_available()
n = torch.cuda.device_count() if ok else 0
gpus = []
for i in range(n):
    free, total = torch.cuda.mem_get_info(i)
    gpus.append({"name": torch.cuda.get_device_name(i), "free": free, "total": total})
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus}))
"""
_probed: dict = {}


def torch_cuda_probe() -> dict | None:
    """What torch in this venv makes of the GPUs, from a child interpreter (the launcher must not
    import torch): {"version", "cuda", "gpus": [{"name", "free", "total"}]}; None when the probe
    itself fails (then the learner reports the problem). Run at most once per launch."""
    if "result" not in _probed:
        try:
            out = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True,
                                 timeout=TORCH_PROBE_TIMEOUT_S, check=True).stdout
            _probed["result"] = json.loads(out.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            _probed["result"] = None
    return _probed["result"]


def machine_gpu_count(topo) -> int:
    """GPUs this process may use: the driver's device nodes on the real machine; on a fake
    machine (FASTSAC_SYSFS_ROOT) its tree is the whole machine, GPUs included."""
    return visible_gpu_count() if topo.sysfs_root == "/sys" else len(topo.gpus)


def _device_keys(cfg: Config, learner_devices) -> list[tuple[str, str, str]]:
    """(key, value as configured, planned device) of every device the job asks for."""
    d = cfg.distributed
    if not learner_devices:   # the synchronous trainer: no plan, the learner's device alone
        learner_devices = [dv.learner_device_choices(cfg, discover_topology(), dv.installed_torch())[0].device]
    if d.learner_devices:
        out = [(f"distributed.learner_devices[{i}]", v, dev) for i, (v, dev) in
               enumerate(zip(d.learner_devices, learner_devices))]
    elif len(learner_devices) > 1:
        out = [("distributed.num_learners", cfg.device, dev) for dev in learner_devices]
    else:
        out = [("device", cfg.device, learner_devices[0])]
    ci = cfg.trainer.async_options.collector_inference_device
    if ci.startswith("cuda"):   # 'auto' follows its learner, checked above
        out.append((f"{AO}.collector_inference_device", ci, ci if ":" in ci else "cuda:0"))
    return out


def check_devices(cfg: Config, learner_devices=()) -> None:
    """Every planned cuda device must exist and torch must be able to use it: `auto` too, which
    the plan puts on the GPU whenever one is visible (fastsac.machine.devices), so a CPU-only
    torch (or one built for a newer CUDA than the driver) on a GPU machine is exit 2 naming
    torch's CUDA, the driver and the command that installs a matching torch, never a silent
    CPU run. learner_devices: the plan's device of each learner of this machine (empty: the
    synchronous trainer's, resolved here)."""
    wanted = [(k, v, dev) for k, v, dev in _device_keys(cfg, list(learner_devices)) if dev.startswith("cuda")]
    if not wanted:
        return
    topo = discover_topology()
    have, driver = machine_gpu_count(topo), dv.driver_version(topo.sysfs_root)
    for key, value, dev in wanted:
        index = dv.cuda_index(dev) or 0
        if have == 0:
            env = os.environ.get("CUDA_VISIBLE_DEVICES")
            why = f"CUDA_VISIBLE_DEVICES={env!r} hides every GPU" if env is not None and _driver_gpu_count() else \
                "no /dev/nvidia<N>, no /proc/driver/nvidia/gpus"
            raise ConfigError(f"{key}: {value!r} was requested but this machine shows no NVIDIA GPU ({why}); "
                              "use cpu or auto")
        probe = torch_cuda_probe()
        if probe is not None and not probe["gpus"]:
            build = dv.TorchBuild(probe["version"], probe["cuda"]).describe()
            planned = f" → {dev}" if value != dev else ""
            raise ConfigError(f"{key}: {value!r}{planned} ({have} NVIDIA GPU{'s' if have != 1 else ''} visible, driver "
                              f"{driver or 'unknown'}) but {build} in this venv cannot use it; install a torch that "
                              f"can: {dv.install_hint(driver)}; or set {key.split('[')[0]}: cpu")
        count = min(have, len(probe["gpus"]) if probe else have)
        if index >= count and key == "distributed.num_learners":
            raise ConfigError(f"{key}: {cfg.distributed.num_learners} learners on cuda need "
                              f"{cfg.distributed.num_learners} GPUs but this machine has {count} (cuda:0..cuda:"
                              f"{count - 1}); use at most {count} learners per machine or give "
                              "distributed.learner_devices")
        if index >= count:
            raise ConfigError(f"{key}: {value!r} was requested but this machine has {count} GPU"
                              f"{'s' if count != 1 else ''} (cuda:0..cuda:{count - 1}); use one of them, cpu or auto")


def check_master_port(cfg: Config) -> None:
    """node_rank 0 of a learner group hosts the rendezvous at master_addr:master_port: when that
    address is this machine's, the port must be free now (else every learner would wait timeout_s
    for a rendezvous that cannot start). Another machine's address is not checked here."""
    d = cfg.distributed
    if d.nnodes * d.num_learners <= 1 or d.node_rank != 0:
        return
    try:
        infos = socket.getaddrinfo(d.master_addr, d.master_port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"distributed.master_addr: {d.master_addr!r} does not resolve ({exc}); give the address "
                          "of node_rank 0") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a TIME_WAIT leftover is no conflict
        try:
            sock.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return   # not an address of this machine: node_rank 0 runs elsewhere
            raise ConfigError(f"distributed.master_port: {d.master_port} on {d.master_addr} is already in use "
                              f"({exc.strerror}); node_rank 0 hosts the learners' rendezvous there: choose a free "
                              "port (distributed.master_port or $MASTER_PORT) or stop what holds it") from None


# --------------------------------------------------------------------------- /dev/shm

def _job_segment_bytes(shm, job: str) -> int:
    """Bytes held by segments already named after this job: a launch replaces stale ones (and a
    running job is refused), so their space counts as free."""
    total = 0
    try:
        names = [n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"{shm.PREFIX}.{job}.")]
    except OSError:
        return 0
    for n in names:
        try:
            total += os.stat(os.path.join(shm.SHM_DIR, n)).st_blocks * 512
        except OSError:
            pass
    return total


def check_shared_memory(cfg: Config, plan, spec) -> None:
    """Every collector's ring and weight snapshot plus the control block must fit /dev/shm now:
    otherwise a collector fails on its own, after the learner and the others have started."""
    ao = cfg.trainer.async_options
    cap, n = ao.ring_capacity, len(plan.collectors)
    free = shm.shm_free_bytes() + _job_segment_bytes(shm, cfg.job_name)
    # A lower bound in Python ints first: RingSpec sizes fields with int64 numpy products, which
    # would wrap around for absurd sizes instead of failing.
    rings = cfg.env.num_envs * (spec.obs_dim + spec.act_dim) * 4 * cap
    numel = policy_flat_numel(spec.obs_dim, spec.act_dim, cfg.algo)
    snapshots = 2 * 4 * numel * n
    exact = rings + snapshots <= free
    if exact:
        rings = sum(shm.job_ring_spec(cfg, spec, c.env_count).segment_nbytes for c in plan.collectors)
        snapshots = n * shm.snapshot_nbytes(numel)
    need = rings + snapshots + shm.CTL_NBYTES
    if need <= free:
        return
    at_least = "" if exact else "at least "
    sizes = f"{at_least}{need:,} bytes ({gib(need)}: rings {gib(rings)}, weight snapshots {gib(snapshots)})"
    if rings >= snapshots:
        head = f"{AO}.ring_capacity: {cap} slots per ring"
        fix = f"lower {AO}.ring_capacity (or env.num_envs)"
    else:
        head = f"algo.actor_hidden_dim: {cfg.algo.actor_hidden_dim}"
        fix = "shrink the actor (algo.actor_hidden_dim, algo.actor_num_layers)"
    raise ConfigError(f"{head}: the shared-memory segments of {n} collector(s) need {sizes} but {shm.SHM_DIR} has "
                      f"{free:,} bytes ({gib(free)}) free; {fix}, free space in {shm.SHM_DIR}, or give the "
                      "container more (docker run --shm-size=...)")
