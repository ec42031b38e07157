"""Segments as files in /dev/shm."""
from __future__ import annotations

import os

from fastsac import shm_layout as L


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(L.SHM_DIR, name.lstrip("/")))
