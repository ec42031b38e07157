#!/usr/bin/env python3
"""numa-vm: run one command inside a throw-away QEMU guest that has 2 NUMA nodes.

    numa_vm.py prepare [--install]            make everything ready (see the exit codes below)
    numa_vm.py run [options] -- COMMAND ...   boot the guest, run COMMAND there, exit with its status

The guest boots Debian's stock kernel (CONFIG_NUMA=y) on QEMU's emulated NUMA topology
(one socket and one memory backend per node, ACPI SRAT/SLIT), so binding to a node and
first-touch placement behave as on a real multi-socket machine. The host's root file system
is shared read-only under a tmpfs overlay (every host program and Python install works
unchanged; writes are thrown away), the current directory is shared read-write at the same
path, /dev/shm is the guest's own. COMMAND runs as root in the current directory with the
caller's environment plus NUMA_VM_GUEST=1; its stdout and stderr stream to ours.

Only the Python standard library is used. Needs an x86_64 Linux host with the Debian packages
qemu-system-x86 and busybox-static (`prepare --install` apt-installs them as root) and apt,
which downloads Debian's kernel package linux-image-amd64 once; the few files the guest needs
are kept in the cache directory (~80 MB), the package itself is not installed.

Exit codes: `prepare`: 0 ready, 1 setup failed, 3 this host cannot run the guest (the reason is
printed: not x86_64 Linux, packages missing and not installable, no Debian kernel available).
`run`: COMMAND's own status, 124 boot or run timeout, 125 the guest could not be set up or
stopped without reporting a status (the message says why).
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import lzma
import os
import platform
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

TOOL_DIR = Path(__file__).resolve().parent
GUEST_INIT = TOOL_DIR / "guest-init.sh"
PACKAGES = ("qemu-system-x86", "busybox-static")   # Debian package names
QEMU = "qemu-system-x86_64"
KERNEL_METAPACKAGE = "linux-image-amd64"
GUEST_MODULES = ("virtio_pci", "virtio_console", "9pnet_virtio", "9p", "overlay")
EXIT_UNAVAILABLE, EXIT_TIMEOUT, EXIT_SETUP = 3, 124, 125
# host variables that mean nothing (or something wrong) inside the guest
ENV_SKIP = re.compile(r"^(PWD|OLDPWD|SHLVL|_|TERM|TERMCAP|COLUMNS|LINES|DISPLAY|WAYLAND_DISPLAY|XAUTHORITY"
                      r"|DBUS_SESSION_BUS_ADDRESS|XDG_RUNTIME_DIR|SSH_.*|BASH_FUNC_.*)$")


class Unavailable(Exception):
    """This host cannot run the guest (and cannot be made to): a reason to skip, not a failure."""


class SetupError(Exception):
    """Something that should have worked did not."""


def say(msg: str) -> None:
    print(f"numa-vm: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    if os.environ.get("NUMA_VM_CACHE"):
        return Path(os.environ["NUMA_VM_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/fastsac-numa-vm")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastsac-numa-vm"


# ------------------------------------------------------------------------------ packages

def _quiet(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, **kw)


def _tail(proc: subprocess.CompletedProcess, n: int = 8) -> str:
    return "\n".join("  | " + line for line in (proc.stdout + proc.stderr).strip().splitlines()[-n:])


def _apt(args: list[str], **kw) -> subprocess.CompletedProcess:
    """apt-get with retries; on failure once more after `apt-get update` (a fresh machine has no lists)."""
    cmd = ["apt-get", "-qq", "-o", "Acquire::Retries=3", "-o", "DPkg::Lock::Timeout=300", *args]
    proc = _quiet(cmd, **kw)
    if proc.returncode != 0 and os.geteuid() == 0:
        if _quiet(["apt-get", "-qq", "update"]).returncode == 0:
            proc = _quiet(cmd, **kw)
    return proc


def find_busybox() -> str | None:
    """A *static* busybox: the initramfs has no C library (Debian's plain busybox is dynamic)."""
    for path in ("/bin/busybox", "/usr/bin/busybox"):
        if os.path.isfile(path) and _is_static_elf(path):
            return path
    return None


def _is_static_elf(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:   # 64-bit ELF only (x86_64)
            return False
        phoff, phentsize, phnum = (int.from_bytes(head[0x20:0x28], "little"),
                                   int.from_bytes(head[0x36:0x38], "little"), int.from_bytes(head[0x38:0x3a], "little"))
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    # PT_INTERP (3) names the dynamic loader: a static binary has none
    return all(int.from_bytes(table[i:i + 4], "little") != 3 for i in range(0, len(table), phentsize))


def ensure_packages(install: bool) -> tuple[str, str]:
    """Paths of qemu-system-x86_64 and a static busybox; apt-installs them when asked (root)."""
    def missing() -> list[str]:
        return [p for p, ok in zip(PACKAGES, (shutil.which(QEMU), find_busybox())) if not ok]
    need = missing()
    if need and install and os.geteuid() == 0 and shutil.which("apt-get"):
        say(f"installing Debian packages: {' '.join(need)}")
        t0 = time.monotonic()
        proc = _apt(["install", "-y", "--no-install-recommends", *need])
        if proc.returncode != 0:
            raise Unavailable(f"`apt-get install {' '.join(need)}` failed (exit code {proc.returncode}):\n"
                              f"{_tail(proc)}")
        say(f"installed in {time.monotonic() - t0:.1f} s")
        need = missing()
    if need:
        how = "`numa_vm.py prepare --install` as root (or scripts/test.sh)" if shutil.which("apt-get") else \
            "your package manager"
        raise Unavailable(f"missing {QEMU} or a static busybox: install the Debian package(s) {' '.join(need)} "
                          f"with {how}")
    return shutil.which(QEMU), find_busybox()


# -------------------------------------------------------------------------------- kernel

def _modinfo_depends(ko: bytes) -> list[str]:
    """A module's dependencies, from its .modinfo section ("depends=a,b"; no kmod needed)."""
    m = re.search(rb"(?:^|\x00)depends=([^\x00]*)\x00", ko)
    return [d for d in m.group(1).decode().split(",") if d] if m else []


def _module_name(path: Path) -> str:
    return path.name.split(".ko")[0].replace("-", "_")


def fetch_kernel(cache: Path) -> Path:
    """Debian's current kernel: the image, its config and the guest's modules, in cache/kernel-<version>/.

    The package is downloaded (`apt-get download`, not installed) and unpacked into a temporary
    directory; only the files the guest needs are kept. A kernel already in the cache is reused.
    """
    ready = sorted(cache.glob("kernel-*/READY"))
    if ready:
        return ready[-1].parent
    if not (shutil.which("apt-get") and shutil.which("apt-cache") and shutil.which("dpkg-deb")):
        raise Unavailable("no Debian kernel in the cache and no apt-get/dpkg-deb to download one "
                          f"(package {KERNEL_METAPACKAGE})")
    pkg = _kernel_package()
    say(f"downloading Debian kernel package {pkg} (one time; cached in {cache})")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download.") as tmp:
        proc = _apt(["download", "-o", "APT::Sandbox::User=root", pkg], cwd=tmp)
        debs = list(Path(tmp).glob("*.deb"))
        if proc.returncode != 0 or not debs:
            raise Unavailable(f"`apt-get download {pkg}` failed (exit code {proc.returncode}):\n{_tail(proc)}")
        root = Path(tmp) / "root"
        proc = _quiet(["dpkg-deb", "-x", str(debs[0]), str(root)])
        if proc.returncode != 0:
            raise SetupError(f"`dpkg-deb -x {debs[0].name}` failed:\n{_tail(proc)}")
        images = sorted((root / "boot").glob("vmlinuz-*"))
        if not images:
            raise SetupError(f"{pkg} has no /boot/vmlinuz-*")
        version = images[0].name[len("vmlinuz-"):]
        modules = {_module_name(p): p for base in (root / "lib/modules", root / "usr/lib/modules")
                   for p in (base / version).rglob("*.ko*")}
        order: list[str] = []

        def add(name: str, wanted_by: str) -> None:   # dependencies first
            if name in order:
                return
            if name not in modules:
                raise SetupError(f"kernel {version} has no module {name} (needed by {wanted_by})")
            for dep in _modinfo_depends(_read_module(modules[name])):
                add(dep, name)
            order.append(name)
        for name in GUEST_MODULES:
            add(name, "the guest")

        dest = cache / f"kernel-{version}"
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "modules").mkdir(parents=True)
        shutil.copyfile(images[0], dest / "vmlinuz")
        shutil.copyfile(root / "boot" / f"config-{version}", dest / "config")
        for name in order:
            (dest / "modules" / f"{name}.ko").write_bytes(_read_module(modules[name]))
        (dest / "modules" / "order").write_text("\n".join(order) + "\n")
        config = (dest / "config").read_text()
        if "\nCONFIG_NUMA=y" not in config:
            raise SetupError(f"kernel {version} is built without CONFIG_NUMA")
        vmlinux = _extract_vmlinux((dest / "vmlinuz").read_bytes()) if "\nCONFIG_PVH=y" in config else None
        if vmlinux:   # boots directly (PVH entry): saves the guest ~7 s of decompressing itself under emulation
            (dest / "vmlinux").write_bytes(vmlinux)
        (dest / "READY").write_text(f"{pkg}\n")
    say(f"kernel {version} ready in {time.monotonic() - t0:.1f} s")
    return dest


def _kernel_package() -> str:
    """The versioned package behind linux-image-amd64 (e.g. linux-image-6.1.0-41-amd64)."""
    for attempt in range(2):
        proc = _quiet(["apt-cache", "depends", KERNEL_METAPACKAGE])
        m = re.search(r"Depends: (linux-image-\d\S*)", proc.stdout)
        if m:
            return m.group(1)
        if attempt == 0 and os.geteuid() == 0:
            _quiet(["apt-get", "-qq", "update"])
    raise Unavailable(f"apt knows no package {KERNEL_METAPACKAGE} (not a Debian host, or no package lists: "
                      "run `apt-get update` as root)")


def _read_module(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(data)
    if path.name.endswith(".ko.gz"):
        return zlib.decompress(data, 16 + zlib.MAX_WBITS)
    if path.name.endswith(".ko.zst"):
        return subprocess.run(["zstd", "-qdc", str(path)], capture_output=True, check=True).stdout
    return data


def _extract_vmlinux(bzimage: bytes) -> bytes | None:
    """The ELF kernel inside a bzImage (boot protocol >= 2.08: payload_offset/length), or None."""
    if bzimage[0x202:0x206] != b"HdrS":
        return None
    setup_sects = bzimage[0x1F1] or 4
    offset = int.from_bytes(bzimage[0x248:0x24C], "little")
    length = int.from_bytes(bzimage[0x24C:0x250], "little")
    payload = bzimage[(setup_sects + 1) * 512 + offset:][:length]
    if payload.startswith(b"\xfd7zXZ\x00"):
        decomp = lzma.LZMADecompressor(lzma.FORMAT_XZ)
    elif payload.startswith(b"\x1f\x8b"):
        decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    else:   # another compression: boot the bzImage itself (slower, still correct)
        return None
    elf = decomp.decompress(payload)   # stops at the end of the stream (a size field follows)
    return elf if elf[:4] == b"\x7fELF" else None


# ----------------------------------------------------------------------------- initramfs

def cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data); a char device's data is b'MAJOR:MINOR'.

    Linux unpacks several archives concatenated into one initramfs, so the per-run job files are
    a second small archive appended to the cached base one.
    """
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        rdev = (0, 0)
        if mode & 0o170000 == 0o020000:
            rdev, data = tuple(int(x) for x in data.split(b":")), b""
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, *rdev, len(raw), 0)
        out += b"070701" + "".join(f"{v:08x}" for v in fields).encode() + raw
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
    return bytes(out + b"\0" * (-len(out) % 512))


def base_initramfs(cache: Path, kernel: Path, busybox: str) -> Path:
    """busybox + guest-init.sh + the kernel's guest modules; rebuilt when any of them changes."""
    modules = kernel / "modules"
    order = (modules / "order").read_text().split()
    parts = [GUEST_INIT.read_bytes(), Path(busybox).read_bytes()] + [(modules / f"{m}.ko").read_bytes() for m in order]
    digest = hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).hexdigest()[:16]
    path = cache / f"initramfs-{kernel.name}-{digest}.cpio"
    if not path.exists():
        entries = [(d, 0o040755, b"") for d in ("bin", "dev", "proc", "sys", "mnt", "modules")]
        entries += [("dev/console", 0o020600, b"5:1"), ("init", 0o100755, parts[0]),
                    ("bin/busybox", 0o100755, parts[1]),
                    ("modules/order", 0o100644, "\n".join(order).encode() + b"\n")]
        entries += [(f"modules/{m}.ko", 0o100644, data) for m, data in zip(order, parts[2:])]
        tmp = path.with_name(path.name + f".{os.getpid()}")
        tmp.write_bytes(cpio(entries))
        os.replace(tmp, path)
        for old in cache.glob(f"initramfs-{kernel.name}-*.cpio"):   # built from an older init script
            if old != path:
                old.unlink(missing_ok=True)
    return path


# ------------------------------------------------------------------------------- prepare

class Guest:
    """What a run needs: the QEMU binary, the kernel to boot and the base initramfs."""

    def __init__(self, qemu: str, kernel: Path, initramfs: Path):
        self.qemu, self.initramfs = qemu, initramfs
        self.boot_image = kernel / "vmlinux" if (kernel / "vmlinux").exists() else kernel / "vmlinuz"
        self.version = kernel.name[len("kernel-"):]


def prepare(install: bool = False) -> Guest:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise Unavailable(f"needs an x86_64 Linux host, this is {platform.system()} {platform.machine()}")
    qemu, busybox = ensure_packages(install)
    cache = cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SetupError(f"cannot create the cache directory {cache}: {exc} (set NUMA_VM_CACHE)") from exc
    with open(cache / ".lock", "w") as lock:   # one preparer at a time; the others then find it ready
        fcntl.flock(lock, fcntl.LOCK_EX)
        kernel = fetch_kernel(cache)
        return Guest(qemu, kernel, base_initramfs(cache, kernel, busybox))


# ----------------------------------------------------------------------------------- run

def job_archive(command: list[str], workdir: str | None) -> bytes:
    env = [f"export {k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
           if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and not ENV_SKIP.match(k)]
    script = "\n".join(["# written by numa_vm.py", *env, "export NUMA_VM_GUEST=1",
                        f"cd {shlex.quote(workdir or '/')} || exit 125", "exec " + shlex.join(command), ""])
    conf = f"WORKDIR={shlex.quote(workdir or '')}\n"
    return cpio([("job.sh", 0o100644, script.encode()), ("job.conf", 0o100644, conf.encode())])


def kvm_usable() -> tuple[bool, str]:
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm is missing or not read-writable"
    if os.path.isdir("/sys/module/kvm_intel") or os.path.isdir("/sys/module/kvm_amd"):
        return True, ""
    # e.g. kvm_pvm (software nesting) serves /dev/kvm but boots only PVM-enabled guest kernels
    return False, "/dev/kvm is not served by kvm_intel or kvm_amd"


def qemu_args(guest: Guest, initrd: Path, run_dir: Path, workdir: str | None, nodes: int, cpus_per_node: int,
              mem_mib: int, accel: str, debug: bool, append: str) -> list[str]:
    def opt(path) -> str:   # QEMU option values escape a comma by doubling it
        return str(path).replace(",", ",,")
    kernel_args = ("console=ttyS0 rdinit=/init panic=-1 numa_balancing=disable mitigations=off random.trust_cpu=on"
                   + ("" if debug else " quiet loglevel=1") + (f" {append}" if append else ""))
    args = [guest.qemu, "-name", "numa-vm", "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
            "-machine", "q35", *(["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else
                                 ["-accel", "tcg,thread=multi", "-cpu", "max"]),
            "-smp", f"{nodes * cpus_per_node},sockets={nodes},cores={cpus_per_node},threads=1",
            "-m", f"{nodes * mem_mib}M",
            "-kernel", str(guest.boot_image), "-initrd", str(initrd), "-append", kernel_args]
    for n in range(nodes):   # one socket and one RAM backend per node: the guest's SRAT
        args += ["-object", f"memory-backend-ram,id=ram{n},size={mem_mib}M",
                 "-numa", f"node,nodeid={n},memdev=ram{n}", "-numa", f"cpu,node-id={n},socket-id={n}"]
    for a in range(nodes):
        for b in range(a + 1, nodes):
            args += ["-numa", f"dist,src={a},dst={b},val=20"]
    args += ["-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"]
    if workdir:
        args += ["-virtfs", f"local,path={opt(workdir)},mount_tag=work,security_model=none,multidevs=remap"]
    # ioeventfd=off: a port write is handed to the host before the guest's write() returns, so
    # nothing written just before power-off is lost. out/err (and with --debug the console) are
    # FIFOs that run() copies to our stdout/stderr.
    args += ["-device", "virtio-serial-pci,ioeventfd=off"]
    for port in ("out", "err", "status"):
        args += ["-chardev", f"file,id={port},path={opt(run_dir / port)}",
                 "-device", f"virtserialport,chardev={port},name=numavm.{port}"]
    return args + ["-chardev", f"file,id=console,path={opt(run_dir / 'console')}", "-serial", "chardev:console"]


def _die_with_parent() -> None:
    """In QEMU's child process before exec: SIGKILL it when we die, so no VM outlives a killed run."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


class Relay:
    """Copies the guest's FIFOs to our own stdout/stderr as data arrives.

    QEMU must not open our stdout itself: a new open of a log file gets its own file offset,
    and its writes and ours would overwrite each other. Each FIFO is opened read-write, so it
    always has a writer and reads never see end-of-file while QEMU has not opened it yet.
    """

    def __init__(self, run_dir: Path, debug: bool):
        self.fds: dict[int, int | None] = {}    # FIFO fd -> our fd to copy to (None: keep only)
        self.console = bytearray()              # the kernel console's tail, shown on failure
        for name, target in (("out", 1), ("err", 2), ("console", 2 if debug else None)):
            os.mkfifo(run_dir / name)
            fd = os.open(run_dir / name, os.O_RDWR | os.O_NONBLOCK)
            self.fds[fd] = target
            if name == "console":
                self.console_fd = fd

    def pump(self, wait: float) -> None:
        """Copy what is there, waiting up to `wait` seconds for something to arrive."""
        ready, _, _ = select.select(list(self.fds), [], [], wait)
        for fd in ready:
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if fd == self.console_fd:
                    self.console += data
                    del self.console[:-(1 << 16)]
                target = self.fds[fd]
                while target is not None and data:
                    data = data[os.write(target, data):]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _remove_dead_runs(cache: Path) -> None:
    """Run directories (initrd copy, FIFOs) of runs that were SIGKILLed before cleaning up."""
    for d in cache.glob("run.*.*"):
        try:
            os.kill(int(d.name.split(".")[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


def run(command: list[str], nodes: int = 2, cpus_per_node: int = 1, mem_mib: int = 1024, timeout: float = 900,
        boot_timeout: float = 120, accel: str = "auto", debug: bool = False, append: str = "") -> int:
    try:
        guest = prepare(install=False)
    except (Unavailable, SetupError) as exc:
        say(f"error: {exc}")
        return EXIT_SETUP
    if accel == "auto":
        ok, why = kvm_usable()
        accel = "kvm" if ok else "tcg"
        if not ok:
            say(f"KVM not usable ({why}): software emulation (TCG)")
    workdir = os.getcwd()
    workdir = None if workdir == "/" else workdir
    _remove_dead_runs(guest.initramfs.parent)
    with tempfile.TemporaryDirectory(prefix=f"run.{os.getpid()}.", dir=guest.initramfs.parent) as tmp:
        run_dir = Path(tmp)
        initrd = run_dir / "initrd.cpio"
        initrd.write_bytes(guest.initramfs.read_bytes() + job_archive(command, workdir))
        (run_dir / "status").touch()
        relay = Relay(run_dir, debug)
        args = qemu_args(guest, initrd, run_dir, workdir, nodes, cpus_per_node, mem_mib, accel, debug, append)
        say(f"booting {nodes}-node guest (kernel {guest.version}, {accel}, {nodes * cpus_per_node} vCPU, "
            f"{mem_mib} MiB per node)")
        t0 = time.monotonic()
        qemu = subprocess.Popen(args, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        up_at, status = None, ""
        try:
            while True:
                exited = qemu.poll() is not None
                relay.pump(0 if exited else 0.1)   # after QEMU exited: what is left in the FIFOs
                status = (run_dir / "status").read_text(errors="replace")
                elapsed = time.monotonic() - t0
                if up_at is None and "up\n" in status:
                    up_at = elapsed
                if exited:
                    break
                if up_at is None and elapsed > boot_timeout:
                    return _fail(relay, f"the guest did not come up within {boot_timeout:g} s ({accel})"
                                 + ("; try --accel tcg" if accel == "kvm" else ""), EXIT_TIMEOUT)
                if elapsed > timeout:
                    return _fail(relay, f"the run exceeded --timeout {timeout:g} s; VM killed", EXIT_TIMEOUT)
        finally:
            if qemu.poll() is None:   # timeout, Ctrl-C or SIGTERM: never leave the VM running
                qemu.kill()
                qemu.wait()
            relay.close()
        wall = time.monotonic() - t0
        m = re.search(r"^exit (\d+)$", status, re.M)
        if m:
            say(f"guest up after {up_at:.1f} s; command exit status {m.group(1)}; {wall:.1f} s in all")
            return int(m.group(1))
        err = re.search(r"^error (.*)$", status, re.M)
        why = f"guest setup failed: {err.group(1)}" if err else \
            f"QEMU exited (status {qemu.returncode}) " + ("before the guest came up" if up_at is None else
                                                           "without the command's exit status")
        return _fail(relay, why, EXIT_SETUP)


def _fail(relay: Relay, why: str, code: int) -> int:
    say(f"error: {why}")
    lines = relay.console.decode(errors="replace").splitlines()[-25:]
    if lines and relay.fds[relay.console_fd] is None:   # with --debug it was shown already
        say("last lines of the guest console:")
        print("\n".join("  | " + line for line in lines), file=sys.stderr, flush=True)
    return code


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)   # unwinds through run()'s finally, which kills QEMU


def _mem_mib(text: str) -> int:
    m = re.fullmatch(r"(\d+)([MG])", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: use a size like 512M or 2G")
    return int(m.group(1)) * (1024 if m.group(2) == "G" else 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="numa_vm.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="check or set up what the guest needs (cached); exit 3 = not possible here")
    p.add_argument("--install", action="store_true", help="apt-get install the missing packages (root)")
    r = sub.add_parser("run", help="boot the guest and run COMMAND in the current directory")
    r.add_argument("--nodes", type=int, default=2, help="NUMA nodes (default 2)")
    r.add_argument("--cpus-per-node", type=int, default=1, help="vCPUs per node (default 1)")
    r.add_argument("--mem-per-node", type=_mem_mib, default=1024, metavar="SIZE", help="RAM per node (default 1G)")
    r.add_argument("--timeout", type=float, default=900, help="seconds for the whole run, then the VM is killed "
                   "and the exit status is 124 (default 900)")
    r.add_argument("--boot-timeout", type=float, default=120, help="seconds until the guest is up (default 120)")
    r.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                   help="auto: KVM when kvm_intel/kvm_amd serve /dev/kvm, else software emulation")
    r.add_argument("--debug", action="store_true", help="stream the guest's kernel console to stderr")
    r.add_argument("--append", default="", help="extra guest kernel arguments")
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --)")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        try:
            guest = prepare(args.install)
        except Unavailable as exc:
            say(f"unavailable: {exc}")
            return EXIT_UNAVAILABLE
        except SetupError as exc:
            say(f"error: {exc}")
            return 1
        say(f"ready: {guest.qemu}, kernel {guest.version} ({guest.boot_image.name}), {guest.initramfs}")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("run: no command given")
    if args.nodes < 1 or args.cpus_per_node < 1 or args.mem_per_node < 128:
        ap.error("run: need >= 1 node, >= 1 vCPU per node and >= 128M per node")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return run(command, args.nodes, args.cpus_per_node, args.mem_per_node, args.timeout, args.boot_timeout,
                   args.accel, args.debug, args.append)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
