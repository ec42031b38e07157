#!/usr/bin/env bash
# Set everything up (venv, CPU torch, test + mujoco + envpool + export + video + bench + wandb extras, numactl where possible), then run the tests.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh "test,mujoco,envpool,export,video,bench,wandb"
# FASTSAC_NO_SYSTEM_PACKAGES=1: no apt-get and no kernel download (the tests that need them skip, saying why)
no_system="${FASTSAC_NO_SYSTEM_PACKAGES:-}"
if [ "$no_system" != 1 ] && ! command -v numactl >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # Optional: with numactl the launcher's numactl binding path is tested too.
  (apt-get install -y -qq numactl >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq numactl >/dev/null 2>&1; }) \
    || echo "test.sh: numactl could not be installed; its tests will be skipped" >&2
fi
# The 2-node NUMA guest of tests/process/machine/test_numa_vm.py: QEMU and a static busybox (apt, as root) and
# Debian's kernel (downloaded once into a cache). Where that is impossible the test skips, saying why.
if [ "$no_system" != 1 ]; then
  .venv/bin/python tools/numa-vm/numa_vm.py prepare --install \
    || echo "test.sh: the NUMA VM is not ready (reason above); tests/process/machine/test_numa_vm.py will say why it skips or fails" >&2
fi
# Two pytest workers (pytest-xdist; a file's tests stay on one worker): the process tests spend
# much of their time waiting on the processes they start. FASTSAC_TEST_WORKERS=1: one process.
workers="${FASTSAC_TEST_WORKERS:-2}"
if [ "$workers" -gt 1 ]; then
  exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest "$@"
