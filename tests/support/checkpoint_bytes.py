"""Where a torch zip checkpoint keeps its tensor bytes, and corrupting them on purpose.

A byte at a fixed file offset may land in the zip's alignment padding, which no checksum covers:
tests that corrupt a checkpoint corrupt a tensor storage instead.
"""
from __future__ import annotations

import struct
import zipfile
from pathlib import Path


def tensor_records(path: Path) -> list[tuple[int, int]]:
    """(file offset, size) of every tensor storage in a torch zip checkpoint, largest first."""
    out = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if "/data/" in info.filename and info.file_size > 0:
                f.seek(info.header_offset)
                name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
                out.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
    return sorted(out, key=lambda r: -r[1])


def flip_tensor_bytes(path: Path, count: int = 1) -> None:
    """Invert `count` bytes in the middle of the largest tensor storage."""
    offset, size = tensor_records(path)[0]
    with open(path, "r+b") as f:
        f.seek(offset + size // 2)
        data = f.read(count)
        f.seek(offset + size // 2)
        f.write(bytes(b ^ 0xFF for b in data))
