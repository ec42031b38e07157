"""Everything that can be checked before a process is spawned is checked before, through the real CLI:
exit code 2, a message that names the key path and what is valid, and nothing created (no run_dir,
no logs, no segments in /dev/shm). `--plan` applies the same checks."""
from __future__ import annotations

import pytest

from fastsac.launch import memory_check, preflight


# --------------------------------------------------------------------------- the checks as functions

def test_replay_buffer_bytes_match_the_real_buffer():
    torch = pytest.importorskip("torch")
    from fastsac.algo.replay_buffer import ReplayBuffer
    for E, S, od, cd, ad, n in [(8, 64, 3, 0, 1, 3), (5, 10, 17, 4, 6, 1), (3, 7, 2, 0, 2, 4)]:
        buf = ReplayBuffer(num_envs=E, buffer_size=S, obs_dim=od, critic_obs_dim=cd, act_dim=ad, n_steps=n,
                           gamma=0.99, device="cpu")
        real = sum(v.nbytes for v in vars(buf).values() if isinstance(v, torch.Tensor))
        assert memory_check.replay_buffer_nbytes(E, S, od, cd, ad, n) == real, (E, S, od, cd, ad, n)


def test_gpu_count_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setattr(preflight, "_driver_gpu_count", lambda: 4)
    for value, count in [(None, 4), ("", 0), ("-1", 0), ("0,1", 2), ("3", 1), ("0,7,1", 1), ("GPU-abc", 1)]:
        if value is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert preflight.visible_gpu_count() == count, value


def _probe(n, version="2.13.0+cu128", cuda="12.8"):
    return lambda: {"version": version, "cuda": cuda,
                    "gpus": [{"name": "NVIDIA H100", "free": 80 << 30, "total": 80 << 30}] * n}


def test_cuda_check_with_gpus_confirms_with_torch_in_a_subprocess(monkeypatch):
    from fastsac.config import ConfigError, config_from_dict
    monkeypatch.setattr(preflight, "visible_gpu_count", lambda: 2)
    monkeypatch.setattr(preflight, "torch_cuda_probe", _probe(2))
    preflight.check_devices(config_from_dict({"device": "cuda:1"}))
    with pytest.raises(ConfigError, match=r"device: 'cuda:2' was requested but this machine has 2 GPUs \(cuda:0"):
        preflight.check_devices(config_from_dict({"device": "cuda:2"}))
    monkeypatch.setattr(preflight, "torch_cuda_probe", _probe(0, "2.13.0+cpu", None))  # a CPU-only torch build
    with pytest.raises(ConfigError, match=r"device: 'cuda' → cuda:0 \(2 NVIDIA GPUs visible, driver .*\) but torch "
                                          r"2.13.0\+cpu \(a CPU-only build\) in this venv cannot use it"):
        preflight.check_devices(config_from_dict({"device": "cuda"}))


def test_auto_on_a_gpu_machine_with_a_cpu_torch_is_exit_2_not_a_cpu_run(monkeypatch, tmp_path):
    """A visible GPU and a torch that cannot use it: the plan's 'auto' is cuda:0, and the check names
    torch's build, the driver and the command that installs a matching torch."""
    from support.fake_sysfs import two_gpus
    from fastsac.config import ConfigError, config_from_dict
    root = two_gpus(tmp_path / "sys")
    (root / "module" / "nvidia").mkdir(parents=True)
    (root / "module" / "nvidia" / "version").write_text("570.86.15\n")
    monkeypatch.setenv("FASTSAC_SYSFS_ROOT", str(root))
    monkeypatch.setattr(preflight, "torch_cuda_probe", _probe(0, "2.13.0+cpu", None))
    with pytest.raises(ConfigError) as exc:
        preflight.check_devices(config_from_dict({"device": "auto"}))   # the synchronous trainer: no plan
    assert str(exc.value) == (
        "device: 'auto' → cuda:0 (2 NVIDIA GPUs visible, driver 570.86.15) but torch 2.13.0+cpu (a CPU-only build) "
        "in this venv cannot use it; install a torch that can: .venv/bin/pip install --force-reinstall torch "
        "--index-url https://download.pytorch.org/whl/cu128; or set device: cpu")
    with pytest.raises(ConfigError, match=r"distributed.num_learners: 'auto' → cuda:0 .* cannot use it"):
        preflight.check_devices(config_from_dict({"device": "auto"}), ["cuda:0", "cuda:1"])
    monkeypatch.setattr(preflight, "torch_cuda_probe", _probe(2))
    preflight.check_devices(config_from_dict({"device": "auto"}))
    preflight.check_devices(config_from_dict({"device": "cpu"}))       # never asks torch


def test_run_dir_on_a_pseudo_filesystem_is_refused_by_mount_type(monkeypatch, tmp_path):
    from fastsac.config import ConfigError, config_from_dict
    monkeypatch.setattr(preflight, "_fs_type", lambda path: "cgroup2")
    with pytest.raises(ConfigError, match="run_dir: .* is on a cgroup2 filesystem"):
        preflight.check_run_dir(config_from_dict({"run_dir": str(tmp_path / "r")}))
