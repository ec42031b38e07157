"""The fastsac package has no import cycles, and its torch-free modules import without torch.

The cycle check reads the sources (ast), so it sees every import, also one inside a function:
such an import still runs, and a cycle through it works only as long as the callers happen to
run in a lucky order. Imports under `if TYPE_CHECKING:` never run and are left out.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def package_modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (source file, is a package __init__) of every module of `package`."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _is_type_checking_block(node: ast.AST) -> bool:
    t = getattr(node, "test", None)
    return isinstance(node, ast.If) and (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING"
                                         or isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, within `package`.

    Importing a.b.c runs a/__init__ and a/b/__init__ first, so it is an edge to each of them,
    except to the importer's own parent packages (always initialized before the importer).
    `from a.b import x` imports the submodule a.b.x when there is one, else a name of a.b.
    """
    modules = package_modules(root, package)
    graph = {}
    for name, (path, is_pkg) in modules.items():
        own_parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1 + is_pkg)}
        edges: dict[str, int] = {}

        def add(target: str, line: int) -> None:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                mod = ".".join(parts[:i])
                if mod in modules and mod not in own_parents and mod != name:
                    edges.setdefault(mod, line)

        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node.lineno)
                continue
            base = node.module or ""
            if node.level:  # relative: from the importer's package, one level up per extra dot
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base, node.lineno)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a path back to its start) per strongly connected component of >1 module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is a few dozen modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in components:  # walk inside the component until a module repeats
        path = [min(comp)]
        while True:
            nxt = min(w for w in graph[path[-1]] if w in comp)
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
                break
            path.append(nxt)
    return cycles


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_fastsac_has_no_import_cycles():
    graph = import_graph(REPO, "fastsac")
    # the walker sees real edges (a broken walker would find no cycle in anything)
    assert "fastsac.config" in graph["fastsac.launch.cli"]
    assert "fastsac.shm_layout" in graph["fastsac.learner.loop"]
    assert "fastsac.shm_layout.common" in graph["fastsac.shm_layout.ring"]
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles)


def test_cycle_finder_sees_cycles_through_functions_and_packages(tmp_path):
    """Negative control on a throw-away package: the shapes of cycle the check must catch."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from p.sub.b import g\n")   # inside a function
    (pkg / "sub" / "__init__.py").write_text("from p.sub import c\n")    # runs before p.sub.b
    (pkg / "sub" / "b.py").write_text("from . import c\n")               # relative, own package: no edge to it
    (pkg / "sub" / "c.py").write_text("from p import a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n")
    graph = import_graph(tmp_path, "p")
    assert graph["p.a"] == {"p.sub": 2, "p.sub.b": 2}
    assert graph["p.sub.b"] == {"p.sub.c": 1}
    assert graph["p.d"] == {}
    cycles = find_cycles(graph)
    assert len(cycles) == 1 and set(cycles[0]) == {"p.a", "p.sub", "p.sub.c"}, cycles


# Modules the launcher, --plan and the NUMA checks import: they must not pay for torch.
TORCH_FREE = ["fastsac.shm_layout", "fastsac.launcher", "fastsac.machine.topology", "fastsac.machine.plan",
              "fastsac.config", "fastsac.common.procs", "fastsac.errors", "fastsac.machine.ranks",
              "fastsac.run.eval_episodes"]

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


@pytest.mark.parametrize("module", TORCH_FREE)
def test_imports_without_torch(module):
    assert module in import_alone(module)


def test_checkpoint_does_not_import_the_shared_memory_layout():
    # checkpoint retention only asks whether a pid is alive (fastsac.common.procs)
    loaded = import_alone("fastsac.run.checkpoint")
    assert "fastsac.common.procs" in loaded and not any(m.startswith("fastsac.shm_layout") for m in loaded), loaded
