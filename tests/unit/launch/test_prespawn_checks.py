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


def test_cuda_check_with_gpus_confirms_with_torch_in_a_subprocess(monkeypatch):
    from fastsac.config import ConfigError, config_from_dict
    monkeypatch.setattr(preflight, "visible_gpu_count", lambda: 2)
    monkeypatch.setattr(preflight, "_torch_cuda_device_count", lambda: 2)
    preflight.check_devices(config_from_dict({"device": "cuda:1"}))
    with pytest.raises(ConfigError, match=r"device: 'cuda:2' was requested but this machine has 2 GPUs \(cuda:0"):
        preflight.check_devices(config_from_dict({"device": "cuda:2"}))
    monkeypatch.setattr(preflight, "_torch_cuda_device_count", lambda: 0)  # e.g. a CPU-only torch build
    with pytest.raises(ConfigError, match="device: 'cuda' was requested but torch in this venv sees no CUDA device"):
        preflight.check_devices(config_from_dict({"device": "cuda"}))
    preflight.check_devices(config_from_dict({"device": "auto"}))   # auto falls back to the CPU by itself


def test_run_dir_on_a_pseudo_filesystem_is_refused_by_mount_type(monkeypatch, tmp_path):
    from fastsac.config import ConfigError, config_from_dict
    monkeypatch.setattr(preflight, "_fs_type", lambda path: "cgroup2")
    with pytest.raises(ConfigError, match="run_dir: .* is on a cgroup2 filesystem"):
        preflight.check_run_dir(config_from_dict({"run_dir": str(tmp_path / "r")}))
