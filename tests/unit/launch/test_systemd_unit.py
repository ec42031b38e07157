"""deploy/fastsac@.service: the settings that make `systemctl stop` graceful, restarts
sensible and /dev/shm shared; and `systemd-analyze verify` where it is installed."""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from fastsac.config import AsyncOptions
from fastsac.launch import cli as launcher
from fastsac.launch import supervisor

UNIT = Path(__file__).resolve().parents[3] / "deploy" / "fastsac@.service"
INSTALLED_LAUNCHER = "/opt/fastsac/.venv/bin/fastsac-launch"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd unit syntax: [Section], Key=Value (keys may repeat), #/; comments, '\\' continuation."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    pending = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        if line.startswith("["):
            assert line.endswith("]"), f"line {lineno}: bad section header {line!r}"
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"line {lineno}: {line!r} is not Key=Value in a section"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(span: str) -> float:
    """A systemd time span ('180', '3min', '2min 30s') in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "ms": 1e-3}
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span):
        total += float(num) * units[unit]
    return total


@pytest.fixture(scope="module")
def unit():
    return parse_unit(UNIT.read_text())


def one(unit, section: str, key: str) -> str:
    values = unit[section].get(key)
    assert values, f"[{section}] {key}= is missing"
    assert len(values) == 1, f"[{section}] {key}= is set {len(values)} times: {values}"
    return values[0]


def test_runs_the_instance_config_with_resume_auto(unit):
    assert one(unit, "Service", "ExecStart") == f"{INSTALLED_LAUNCHER} /etc/fastsac/%i.yaml resume=auto"
    assert one(unit, "Service", "Type") in ("exec", "simple")
    assert one(unit, "Service", "WorkingDirectory").startswith("/")
    assert one(unit, "Service", "EnvironmentFile") == "-/etc/fastsac/fastsac.env"   # optional ('-')
    assert one(unit, "Service", "User") and one(unit, "Service", "Group")
    assert "%i" in one(unit, "Unit", "Description")
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_stop_is_graceful_and_outlasts_the_launchers_escalation(unit):
    assert one(unit, "Service", "KillMode") == "mixed"        # SIGTERM to the launcher only
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert unit["Service"].get("SendSIGKILL", ["yes"]) == ["yes"]
    stop_timeout = seconds(one(unit, "Service", "TimeoutStopSec"))
    launcher_budget = AsyncOptions().stop_timeout_s + supervisor.KILL_GRACE_S
    assert stop_timeout >= launcher_budget + 30, (stop_timeout, launcher_budget)
    # a `systemctl stop` while the launcher starts ends it with 128 + SIGTERM: a stop, not a failure
    assert str(128 + signal.SIGTERM) in one(unit, "Service", "SuccessExitStatus").split()


def test_restarts_on_failure_but_not_on_a_bad_config(unit):
    assert one(unit, "Service", "Restart") == "on-failure"
    assert seconds(one(unit, "Service", "RestartSec")) >= 1
    prevented = one(unit, "Service", "RestartPreventExitStatus").split()
    assert str(launcher.EXIT_USAGE) in prevented                # 2: restarting cannot help
    assert str(launcher.EXIT_FAILURE) not in prevented          # 1: runtime failure -> restart + resume
    # rate limit belongs to [Unit] (systemd >= 230 ignores it in [Service] with a warning)
    assert seconds(one(unit, "Unit", "StartLimitIntervalSec")) > 0
    assert int(one(unit, "Unit", "StartLimitBurst")) >= 1
    assert one(unit, "Service", "OOMPolicy") == "continue"     # the launcher supervises its children


def test_resource_limits(unit):
    assert one(unit, "Service", "LimitMEMLOCK") == "infinity"  # pinned host memory
    assert int(one(unit, "Service", "LimitNOFILE")) >= 4096
    for key in ("CPUAffinity", "NUMAPolicy", "NUMAMask", "AllowedCPUs", "AllowedMemoryNodes"):
        assert key not in unit["Service"], f"{key}= would override the launcher's placement"


def test_dev_shm_stays_shared_and_segments_survive(unit):
    svc = unit["Service"]
    for key in ("PrivateTmp", "PrivateDevices", "PrivateIPC", "DynamicUser", "RemoveIPC"):
        assert svc.get(key, ["no"]) == ["no"], f"{key}= must be off: {svc.get(key)}"
    for key in ("TemporaryFileSystem", "InaccessiblePaths", "ReadOnlyPaths", "BindPaths", "BindReadOnlyPaths"):
        for value in svc.get(key, []):
            assert "/dev" not in value, f"{key}={value} hides or freezes /dev/shm"
    assert svc.get("ProtectSystem", ["no"]) != ["strict"]      # strict makes /dev/shm read-only
    assert "MemoryDenyWriteExecute" not in svc                  # torch JIT / CUDA need W+X pages


def test_parser_understands_systemd_syntax():
    parsed = parse_unit("# c\n[Service]\nEnvironment=A=1\nEnvironment=B=2 \\\n  C=3\n; c\n[Install]\nWantedBy=x\n")
    assert parsed == {"Service": {"Environment": ["A=1", "B=2 C=3"]}, "Install": {"WantedBy": ["x"]}}
    assert seconds("180") == 180 and seconds("3min") == 180 and seconds("2min 30s") == 150
