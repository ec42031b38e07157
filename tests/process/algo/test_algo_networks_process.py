"""Networks, the C51 projection, the flat policy layout and the collector's InferencePolicy."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # deterministic, and fast on 2 cores


@pytest.mark.process
def test_policy_layout_is_torch_free():
    code = ("import sys; import fastsac.algo, fastsac.shm_layout.policy_layout; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
