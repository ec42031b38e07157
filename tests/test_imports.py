"""The fastsac package's import structure: no cycles, imports only down the layers, roles that never
import each other, torch-free layers, no function-level import without a stated reason, and small
modules and functions.

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


@pytest.mark.process
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


# The layers, bottom first (docs/architecture.md): a module imports only from its own package or
# from packages on a lower floor. Packages on one floor never import each other: the four roles
# (collector, learner, evaluation, sync) meet only in shared memory and the layers below them.
LAYERS = [
    ["errors"], ["common"], ["envs"], ["config"], ["shm_layout"], ["machine"], ["process"], ["algo"], ["run"],
    ["collector", "learner", "evaluation", "sync"], ["launch", "tools"],
    ["launcher", "collector_main", "learner_main", "evaluator_main"],     # the entry points users type
]
FLOOR = {pkg: floor for floor, pkgs in enumerate(LAYERS) for pkg in pkgs}
ROLES = LAYERS[9]
# Packages the launcher, --plan, --status and the NUMA checks use: they never import torch.
TORCH_FREE_PACKAGES = ["common", "config", "shm_layout", "machine", "launch"]


def package_of(module: str) -> str:
    """fastsac.learner.loop -> learner; fastsac.sync -> sync; fastsac -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_floor():
    tops = {package_of(m) for m in package_modules(REPO, "fastsac")} - {""}
    assert tops == set(FLOOR), f"packages without a floor: {tops - set(FLOOR)}; floors of no package: {set(FLOOR) - tops}"


def layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    bad = []
    for module, edges in sorted(graph.items()):
        mine = package_of(module)
        for target, line in sorted(edges.items()):
            theirs = package_of(target)
            if mine and theirs and theirs != mine and FLOOR[theirs] >= FLOOR[mine]:
                kind = "a peer" if FLOOR[theirs] == FLOOR[mine] else "a higher floor"
                bad.append(f"{module} (line {line}) imports {target}: {kind} ({mine} floor {FLOOR[mine]}, "
                           f"{theirs} floor {FLOOR[theirs]})")
    return bad


def test_imports_only_go_down_the_layers():
    bad = layer_violations(import_graph(REPO, "fastsac"))
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_layer_check_catches_upward_and_peer_imports():
    """Negative control on a made-up graph: an import up, one between two roles, one down."""
    graph = {"fastsac.config.schema": {"fastsac.run.state": 3},            # up
             "fastsac.collector.loop": {"fastsac.learner.feed": 7},          # between roles
             "fastsac.learner.loop": {"fastsac.algo.fastsac": 9}}            # down: fine
    bad = layer_violations(graph)
    assert len(bad) == 2 and "collector.loop" in bad[0] and "a peer" in bad[0], bad
    assert "config.schema" in bad[1] and "a higher floor" in bad[1], bad


def test_the_roles_never_import_each_other():
    graph = import_graph(REPO, "fastsac")
    crossings = [(m, t) for m, edges in graph.items() for t in edges
                 if package_of(m) in ROLES and package_of(t) in ROLES and package_of(m) != package_of(t)]
    assert not crossings, crossings


def _function_level_imports(path: Path):
    """(line number, text) of every import statement inside a function or class body."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    yield inner.lineno


def test_every_function_level_import_says_why():
    """An import inside a function defers a heavy or optional dependency (torch before the binding,
    mujoco, onnx, ...); it says so in a comment on its line or on the comment line that heads its
    group of imports. One without a reason belongs at the top of the module."""
    bare = []
    for path in sorted((REPO / "fastsac").rglob("*.py")):
        lines = path.read_text().splitlines()
        for lineno in sorted(set(_function_level_imports(path))):
            i = lineno - 1
            if "#" in lines[i]:
                continue
            j = i - 1   # up through the group of imports (and their continuation lines) to its head
            while j >= 0 and (lines[j].strip().startswith(("import ", "from ")) or lines[j].strip().endswith(",")
                              or lines[j].strip() in (")", "")):     # blank: isort's gap between groups
                j -= 1
            if j < 0 or not lines[j].strip().startswith("#"):
                bare.append(f"{path.relative_to(REPO)}:{lineno}: {lines[i].strip()}")
    assert not bare, "function-level imports without a reason:\n" + "\n".join(bare)


def modules_of(packages: list[str]) -> list[str]:
    return sorted(m for m in package_modules(REPO, "fastsac")
                  if package_of(m) in packages and not m.endswith("__main__"))   # running those is a CLI


# Modules the launcher, --plan and the NUMA checks import: they must not pay for torch.
TORCH_FREE = [*modules_of(TORCH_FREE_PACKAGES), "fastsac.launcher", "fastsac.errors", "fastsac.envs.registry",
              "fastsac.algo.policy_layout", "fastsac.run.eval_episodes", "fastsac.run.checkpoint"]

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
    loaded = import_alone("fastsac.run.checkpoint")
    assert "fastsac.common.procs" in loaded and not any(m.startswith("fastsac.shm_layout") for m in loaded), loaded


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def test_modules_and_functions_stay_small():
    """Small modules with one job, short functions: none over ~600 and ~80 lines."""
    big, long = [], []
    for path in sorted((REPO / "fastsac").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            big.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name}: {n} lines")
    assert not big and not long, big + long
