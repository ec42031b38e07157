"""Config loading: typed values, overrides, and precise errors (exit code 2, nothing created)."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.process
def test_cli_invalid_config_exits_2_and_creates_nothing(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(REPO / "configs/quickstart.yaml"),
                           f"run_dir={run_dir}", "algo.gama=0.9"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert "algo.gama: unknown key; did you mean 'algo.gamma'?" in proc.stderr
    assert not run_dir.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.process
def test_cli_unwritable_run_dir_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(REPO / "configs/quickstart.yaml"),
                           f"run_dir={blocker}/sub"], capture_output=True, text=True)
    assert proc.returncode == 2 and "run_dir" in proc.stderr and "not writable" in proc.stderr


# --------------------------------------------------------------------------- strict YAML

ALIAS_BOMB = "".join(
    f"{k}: &{k} [{', '.join(['*' + p] * 9 if p else ['lol'] * 9)}]\n"
    for p, k in zip(["", "a", "b", "c", "d", "e", "f", "g", "h"], "abcdefghi"))


@pytest.mark.process
@pytest.mark.parametrize("module", ["fastsac.launcher", "fastsac.collector_main", "fastsac.learner_main"])
@pytest.mark.parametrize("text, fragment", [
    ("", "line 1: no settings"),
    ("seed: 1\nseed: 2\n", "line 2: duplicate key 'seed' (first at line 1)"),
    ("a: &a [*a]\n", "line 1: alias *a"),
    (ALIAS_BOMB, "line 2: alias *a"),
])
def test_every_entry_point_loads_strictly(tmp_path, module, text, fragment):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    args = {"fastsac.launcher": [str(p), "--plan"], "fastsac.learner_main": ["--config", str(p)],
            "fastsac.collector_main": ["--config", str(p), "--collector-id", "0"]}[module]
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"config file '{p}', {fragment}" in proc.stderr
    assert list(tmp_path.iterdir()) == [p]
