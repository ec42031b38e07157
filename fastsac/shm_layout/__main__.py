"""python -m fastsac.shm_layout list [--job J] | clean --job J [--force] | clean --all-stale"""
import sys

from fastsac.shm_layout.segments_cli import main

sys.exit(main())
