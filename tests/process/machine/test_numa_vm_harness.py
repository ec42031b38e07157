"""The NUMA VM harness's host-side pieces (tools/numa-vm/numa_vm.py), without booting anything.

Booting is tested by tests/process/machine/test_numa_vm.py; here: the newc archives the guest unpacks, the job
script that carries the command and environment into the guest, the kernel unpacking (a bzImage's
payload, a module's dependencies) and the static-binary check for busybox.
"""
from __future__ import annotations

import importlib.util
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest

NUMA_VM = Path(__file__).resolve().parents[3] / "tools" / "numa-vm" / "numa_vm.py"
spec = importlib.util.spec_from_file_location("numa_vm", NUMA_VM)
numa_vm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(numa_vm)


def read_newc(data: bytes) -> dict[str, tuple[int, bytes, tuple[int, int]]]:
    """{name: (mode, data, (rdev major, minor))} of a newc archive (an independent reader)."""
    out, pos = {}, 0
    while True:
        assert data[pos:pos + 6] == b"070701", f"bad magic at {pos}"
        f = [int(data[pos + 6 + 8 * i:pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rdev, namesize = f[1], f[6], (f[9], f[10]), f[11]
        name = data[pos + 110:pos + 110 + namesize - 1].decode()
        pos = (pos + 110 + namesize + 3) & ~3
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, data[pos:pos + size], rdev)
        pos = (pos + size + 3) & ~3


@pytest.mark.process
def test_cpio_is_newc_with_files_dirs_and_device_nodes_padded_for_concatenation():
    body = b"x" * 5
    data = numa_vm.cpio([("bin", 0o040755, b""), ("bin/tool", 0o100755, body), ("dev/console", 0o020600, b"5:1")])
    assert len(data) % 512 == 0   # the next archive appended to it starts aligned
    entries = read_newc(data)
    assert entries == {"bin": (0o040755, b"", (0, 0)), "bin/tool": (0o100755, body, (0, 0)),
                       "dev/console": (0o020600, b"", (5, 1))}


@pytest.mark.process
def test_job_script_carries_the_command_environment_and_directory(tmp_path, monkeypatch):
    tricky = "it's $HOME `x` \"q\"\nline 2"
    monkeypatch.setenv("NUMA_VM_TEST_VALUE", tricky)
    monkeypatch.setenv("TERM", "xterm")   # host-only variables stay behind
    data = numa_vm.job_archive(["sh", "-c", 'printf "%s|%s|%s|%s" "$NUMA_VM_TEST_VALUE" "$NUMA_VM_GUEST" '
                                            '"${TERM-unset}" "$(pwd)"; exit 3'], str(tmp_path))
    files = read_newc(data)
    assert files["job.conf"][1].decode() == f"WORKDIR={tmp_path}\n"
    proc = subprocess.run(["sh", "-c", files["job.sh"][1].decode()], capture_output=True, text=True, env={})
    assert proc.returncode == 3
    assert proc.stdout == f"{tricky}|1|unset|{tmp_path}"


def fake_bzimage(payload: bytes) -> bytes:
    """The boot-protocol fields _extract_vmlinux reads: HdrS, setup_sects, payload_offset/length."""
    setup_sects, offset = 3, 0x40
    image = bytearray((setup_sects + 1) * 512 + offset)
    image[0x1F1] = setup_sects
    image[0x202:0x206] = b"HdrS"
    image[0x248:0x24C] = offset.to_bytes(4, "little")
    image[0x24C:0x250] = len(payload).to_bytes(4, "little")
    return bytes(image) + payload + b"tail"


@pytest.mark.process
def test_vmlinux_is_the_decompressed_bzimage_payload():
    elf = b"\x7fELF" + os.urandom(3000)
    xz = lzma.compress(elf, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32) + len(elf).to_bytes(4, "little")
    assert numa_vm._extract_vmlinux(fake_bzimage(xz)) == elf
    assert numa_vm._extract_vmlinux(fake_bzimage(b"\x28\xb5\x2f\xfd" + b"zstd")) is None   # boots the bzImage
    assert numa_vm._extract_vmlinux(b"\0" * 4096) is None   # not a bzImage


@pytest.mark.process
def test_module_dependencies_come_from_modinfo():
    assert numa_vm._modinfo_depends(b"\x7fELF..\x00license=GPL\x00depends=9pnet,netfs,fscache\x00intree=Y\x00") \
        == ["9pnet", "netfs", "fscache"]
    assert numa_vm._modinfo_depends(b"\x00license=GPL\x00depends=\x00name=overlay\x00") == []


@pytest.mark.process
def test_static_busybox_check_reads_the_program_headers():
    assert not numa_vm._is_static_elf(sys.executable if not os.path.islink(sys.executable)
                                      else os.path.realpath(sys.executable))   # dynamically linked
    busybox = numa_vm.find_busybox()
    if busybox is None:
        pytest.skip("no static busybox here (scripts/test.sh installs busybox-static)")
    assert numa_vm._is_static_elf(busybox)
