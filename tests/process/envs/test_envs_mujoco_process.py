"""Batched MuJoCo tasks (humanoid, ant, halfcheetah) against Gymnasium's v5 envs.

The batched env makes exactly Gymnasium's MuJoCo calls on one MjData per env, so states
are bit-identical and observations/rewards agree to float32 rounding.
"""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.process
def test_registry_and_module_import_do_not_import_mujoco():
    code = ("import sys, fastsac.envs.registry, fastsac.envs.mujoco_tasks, fastsac.envs.gymnasium_adapter; "
            "from fastsac.config import load_config; "
            "assert 'mujoco' not in sys.modules and 'gymnasium' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
