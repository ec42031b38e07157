"""The fastsac package's import structure: no cycles, imports only down the layers, roles that never
import each other, torch-free layers, no function-level import without a stated reason, and small
modules and functions.

The cycle check reads the sources (ast), so it sees every import, also one inside a function:
such an import still runs, and a cycle through it works only as long as the callers happen to
run in a lucky order. Imports under `if TYPE_CHECKING:` never run and are left out.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.import_graph import find_cycles, import_graph, package_modules, package_of

REPO = Path(__file__).resolve().parents[3]


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


@pytest.mark.process
def test_fastsac_has_no_import_cycles():
    graph = import_graph(REPO, "fastsac")
    # the walker sees real edges (a broken walker would find no cycle in anything)
    assert "fastsac.config" in graph["fastsac.launch.cli"]
    assert "fastsac.shm_layout" in graph["fastsac.learner.loop"]
    assert "fastsac.shm_layout.common" in graph["fastsac.shm_layout.ring"]
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles)


# Packages the launcher, --plan, --status and the NUMA checks use: they never import torch.
TORCH_FREE_PACKAGES = ["common", "config", "shm_layout", "run_dir", "machine", "launch"]


def modules_of(packages: list[str]) -> list[str]:
    return sorted(m for m in package_modules(REPO, "fastsac")
                  if package_of(m) in packages and not m.endswith("__main__"))   # running those is a CLI


# Modules the launcher, --plan and the NUMA checks import: they must not pay for torch.
TORCH_FREE = [*modules_of(TORCH_FREE_PACKAGES), "fastsac.launcher", "fastsac.errors", "fastsac.envs.registry",
              "fastsac.evaluation.episodes"]

_IMPORT_WITHOUT_TORCH = """
import importlib, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} was imported (this import must not need torch)")
        return None

sys.meta_path.insert(0, NoTorch())
importlib.import_module(sys.argv[1])
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch in sys.modules"
print(" ".join(sorted(m for m in sys.modules if m.startswith("fastsac"))))
"""


def import_alone(module: str) -> set[str]:
    """Import `module` in a fresh interpreter that refuses torch; the fastsac modules it loaded."""
    res = subprocess.run([sys.executable, "-c", _IMPORT_WITHOUT_TORCH, module], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"import {module} without torch failed:\n{res.stderr}"
    return set(res.stdout.split())


@pytest.mark.process
@pytest.mark.parametrize("module", TORCH_FREE)
def test_imports_without_torch(module):
    assert module in import_alone(module)


@pytest.mark.process
def test_checkpoint_does_not_import_the_shared_memory_layout():
    # checkpoint retention only asks whether a pid is alive (fastsac.common.procs)
    loaded = import_alone("fastsac.run_dir.checkpoint")
    assert "fastsac.common.procs" in loaded and not any(m.startswith("fastsac.shm_layout") for m in loaded), loaded
