#!/usr/bin/env bash
# Set everything up, then train: scripts/train.sh [CONFIG.yaml] [key=value ...]
# Default: configs/quickstart.yaml (built-in pendulum; TensorBoard logs + checkpoints in runs/quickstart).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
config="${1:-configs/quickstart.yaml}"
[ $# -gt 0 ] && shift
exec .venv/bin/fastsac-launch "$config" "$@"
