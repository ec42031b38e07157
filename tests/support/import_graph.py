"""The fastsac package's import graph, read from the sources (ast): every import, also one inside a
function; imports under `if TYPE_CHECKING:` never run and are left out."""
from __future__ import annotations

import ast
from pathlib import Path


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


def package_of(module: str) -> str:
    """fastsac.learner.loop -> learner; fastsac.sync -> sync; fastsac -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""
