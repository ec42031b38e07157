"""The CPU update's kernels are compiled once per machine into the cache and loaded; without a
working compiler, or with FASTSAC_CPU_KERNELS=0, the update runs as torch ops and says why.
(`_library.__wrapped__`: a fresh build-and-load each time, as in a new process; it runs the compiler.)"""
from __future__ import annotations

import pytest

from fastsac.algo import cpu_kernels


def build(monkeypatch, tmp_path, **env) -> cpu_kernels._Library:
    monkeypatch.setenv("FASTSAC_KERNEL_CACHE", str(tmp_path / "cache"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return cpu_kernels._library.__wrapped__()


def test_the_kernels_are_compiled_into_the_cache_once_and_loaded(monkeypatch, tmp_path):
    first = build(monkeypatch, tmp_path)
    assert first.lib is not None and first.reason.startswith(f"C kernels ({tmp_path / 'cache'}"), first.reason
    built = sorted((tmp_path / "cache").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"
    mtime = built[0].stat().st_mtime_ns
    second = build(monkeypatch, tmp_path)                   # loaded, not rebuilt
    assert second.reason == first.reason and built[0].stat().st_mtime_ns == mtime


def test_an_unwritable_cache_falls_back_to_the_next_folder(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setattr(cpu_kernels, "_cache_dirs", lambda: [blocked / "cache", tmp_path / "second"])
    library = cpu_kernels._library.__wrapped__()
    assert library.lib is not None and str(tmp_path / "second") in library.reason


@pytest.mark.parametrize("env,why", [({"CC": "/nonexistent/cc"}, "no C compiler"),
                                     ({"CC": "false"}, "failed"),
                                     ({"FASTSAC_CPU_KERNELS": "0"}, "FASTSAC_CPU_KERNELS=0")])
def test_without_the_kernels_the_update_runs_torch_ops_and_says_why(monkeypatch, tmp_path, env, why):
    library = build(monkeypatch, tmp_path, **env)
    assert library.lib is None and library.reason.startswith("torch ops (") and why in library.reason
    monkeypatch.setattr(cpu_kernels, "_library", lambda: library)
    with pytest.warns(UserWarning, match="the CPU update's kernels run as torch ops"):
        assert cpu_kernels.kernels_in_use() == library.reason
