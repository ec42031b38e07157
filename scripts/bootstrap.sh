#!/usr/bin/env bash
# Create/refresh the project venv (.venv) with the right torch build, then install fastsac.
#
#   CPU-only machine (no nvidia-smi): the CPU wheel torch==2.13.0, never a CUDA build.
#     It is taken from a local wheel when pip's configured find-links have one (installed
#     with --no-index --no-deps, then its dependencies), else from PyTorch's CPU wheel index.
#   Machine with an NVIDIA driver: torch==2.13.0 from PyPI (the CUDA build).
#   FASTSAC_TORCH_SPEC / FASTSAC_TORCH_INDEX override the spec and the index (see README).
#
# Then the Debian packages the extras need (scripts/setup_system.sh: with "video", EGL and OSMesa
# for MuJoCo's offscreen renderer), installed when run as root, else named with their apt command.
#
# Usage: scripts/bootstrap.sh [extra,extra]   (e.g. "test,mujoco"); idempotent and quick
# when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
venv=.venv
torch_spec="${FASTSAC_TORCH_SPEC:-torch==2.13.0}"

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --quiet)

stamp="$venv/.fastsac-installed"
want="$(cat pyproject.toml; echo "$extras $torch_spec ${FASTSAC_TORCH_INDEX:-}")"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  # the venv is current; system packages are checked every time (they are not in the venv)
  exec scripts/setup_system.sh "$venv/bin/python" "$extras"
fi

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if [ -n "${FASTSAC_TORCH_INDEX:-}" ]; then
    "${pip[@]}" install "$torch_spec" --index-url "$FASTSAC_TORCH_INDEX"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    echo "bootstrap: NVIDIA driver found: installing the CUDA build of $torch_spec" >&2
    "${pip[@]}" install "$torch_spec"
  else
    echo "bootstrap: no NVIDIA driver: installing the CPU build of $torch_spec" >&2
    if "${pip[@]}" install --no-index --no-deps "$torch_spec" 2>/dev/null; then
      # a CPU wheel that pip already has locally; now its dependencies (torch itself is satisfied)
      "${pip[@]}" install "$torch_spec"
    else
      "${pip[@]}" install "$torch_spec" --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi
# torch is already satisfied, so this step installs no other torch build.
"${pip[@]}" install -e ".${extras:+[$extras]}"
printf '%s' "$want" > "$stamp"
exec scripts/setup_system.sh "$venv/bin/python" "$extras"
