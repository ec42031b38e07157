"""deploy/fastsac@.service: the settings that make `systemctl stop` graceful, restarts
sensible and /dev/shm shared; and `systemd-analyze verify` where it is installed."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[3] / "deploy" / "fastsac@.service"
INSTALLED_LAUNCHER = "/opt/fastsac/.venv/bin/fastsac-launch"


def _verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.process
def test_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian/Ubuntu package 'systemd'); the unit was only "
                    "checked by the parser tests")
    exe = Path(sys.executable).parent / "fastsac-launch"
    if not exe.exists():
        exe = Path(shutil.which("fastsac-launch") or "")
    if not exe.is_file():
        pytest.skip("no fastsac-launch executable to point ExecStart at (pip install -e . first)")
    # verify checks that the ExecStart binary exists: point it at this checkout's launcher, and
    # verify an instance (a bare template name cannot be loaded).
    text = UNIT.read_text()
    assert INSTALLED_LAUNCHER in text
    instance = tmp_path / "fastsac@ci.service"
    instance.write_text(text.replace(INSTALLED_LAUNCHER, str(exe)))
    res = _verify(instance)
    ours = [line for line in (res.stdout + res.stderr).splitlines() if "fastsac@" in line]
    assert res.returncode == 0 and not ours, f"systemd-analyze verify (rc {res.returncode}):\n{res.stdout}{res.stderr}"
    # negative control: verify does complain about a broken copy, so the silence above means something
    broken = tmp_path / "fastsac@broken.service"
    broken.write_text(instance.read_text().replace("KillMode=mixed", "KillMode=bogus"))
    res = _verify(broken)
    assert "kill mode" in (res.stdout + res.stderr).lower(), res
