"""The tests' own layout: tests/unit is the fast, in-process tier, tests/process the tier that starts
processes (its folder gives every test there the `process` marker, tests/conftest.py), helpers in
tests/support. Test module names are unique across the folders, as pytest's default import mode needs
(no __init__.py in the test folders). Read from the files (ast), nothing collected or started."""
from __future__ import annotations

import ast
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parents[2]


def _process_marks(path: Path) -> list[int]:
    """Lines of every `pytest.mark.process` (also as `marks=` or `pytestmark`) in a module."""
    tree = ast.parse(path.read_text(), str(path))
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "process"
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"]


class _Item:
    """What the marking hook reads of a collected test: its file."""

    def __init__(self, path: Path):
        self.path, self.marks = path, []

    def add_marker(self, mark) -> None:
        self.marks.append(mark.name)


def test_the_folder_is_the_tier_and_no_test_under_tests_unit_is_marked_process():
    unit, process = sorted((TESTS / "unit").rglob("test_*.py")), sorted((TESTS / "process").rglob("test_*.py"))
    assert unit and process
    marked = [f"{p.relative_to(TESTS)}:{line}" for p in sorted((TESTS / "unit").rglob("*.py"))
              for line in _process_marks(p)]
    assert not marked, f"tests that start processes belong in tests/process: {marked}"
    # conftest's hook marks every test of a module under tests/process, and none under tests/unit,
    # before `-m` deselects by marker
    items = [_Item(p) for p in process + unit]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.path for i in items if i.marks != ["process"]] == unit
    assert conftest.pytest_collection_modifyitems.pytest_impl["tryfirst"]
    # every test module is in one of the two, under a name no other test module has
    modules = sorted(TESTS.rglob("test_*.py"))
    assert sorted(unit + process) == modules, sorted(set(modules) - set(unit + process))
    names = [p.name for p in modules]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    packages = [str(p.relative_to(TESTS)) for p in TESTS.rglob("__init__.py") if p.parent.name != "support"]
    assert not packages, f"test folders are not packages (pytest imports test modules by their name): {packages}"
