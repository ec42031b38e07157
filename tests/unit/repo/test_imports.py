"""The fastsac package's import structure: no cycles, imports only down the layers, roles that never
import each other, torch-free layers, no function-level import without a stated reason, and small
modules and functions.

The cycle check reads the sources (ast), so it sees every import, also one inside a function:
such an import still runs, and a cycle through it works only as long as the callers happen to
run in a lucky order. Imports under `if TYPE_CHECKING:` never run and are left out.
"""
from __future__ import annotations

import ast
from pathlib import Path

from support.import_graph import find_cycles, import_graph, package_modules, package_of

REPO = Path(__file__).resolve().parents[3]


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


# The layers, bottom first (docs/design.md): a module imports only from its own package or
# from packages on a lower floor. Packages on one floor never import each other: the three training
# roles (collector, learner, sync) meet only in shared memory and the layers below them; the
# evaluator's process (evaluation/) sits below them, as the trainers run its episodes too.
LAYERS = [
    ["errors"], ["common"], ["envs"], ["config"], ["shm_layout", "run_dir"], ["machine"], ["process"], ["algo"],
    ["evaluation"], ["training"], ["collector", "learner", "sync"], ["launch", "tools"],
    ["launcher", "collector_main", "learner_main", "evaluator_main"],     # the entry points users type
]
FLOOR = {pkg: floor for floor, pkgs in enumerate(LAYERS) for pkg in pkgs}
ROLES = LAYERS[10]


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
    graph = {"fastsac.config.schema": {"fastsac.training.state": 3},       # up
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


def test_only_its_entry_point_imports_the_evaluator_process():
    """The evaluator's process meets the trainers in shared memory only, like the roles: the trainers
    import evaluation's episodes, result and watch, never the evaluator's loop or start-up."""
    graph = import_graph(REPO, "fastsac")
    process = {"fastsac.evaluation.evaluator", "fastsac.evaluation.main"}
    importers = sorted(m for m, edges in graph.items() for t in edges
                       if t in process and m not in process and m != "fastsac.evaluator_main")
    assert not importers, importers


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
