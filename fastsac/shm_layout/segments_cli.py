"""python -m fastsac.shm_layout: a low-level tool to list a job's segments and remove stale ones.
What messages and docs recommend is `fastsac-launch --cleanup JOB` (common.cleanup_command)."""
from __future__ import annotations

import argparse
import sys

from fastsac.shm_layout.cleanup import _scan, find_stale_segments, format_stale_report, unlink_job_segments
from fastsac.shm_layout.common import ShmLayoutError
from fastsac.shm_layout.segment import _unlink_quiet


def main(argv: list[str] | None = None) -> int:
    """python -m fastsac.shm_layout list [--job J] | clean --job J [--force] | clean --all-stale"""
    p = argparse.ArgumentParser(prog="python -m fastsac.shm_layout", description=main.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="list fastsac segments and whether they are stale")
    ls.add_argument("--job")
    cl = sub.add_parser("clean", help="remove the segments of a dead job")
    cl.add_argument("--job")
    cl.add_argument("--all-stale", action="store_true", help="remove every stale segment of any job")
    cl.add_argument("--force", action="store_true", help="also if orphaned processes are still attached")
    args = p.parse_args(argv)
    try:
        if args.cmd == "list":
            stale = {s.name: s for s in find_stale_segments(args.job)}
            for f in _scan(args.job):
                s = stale.get(f.name)
                print(f"{f.name:48s} {'STALE: ' + s.reason if s else 'live'}")
            if stale:
                print(format_stale_report(list(stale.values())))
            return 0
        if args.all_stale:
            for s in find_stale_segments(args.job):
                if _unlink_quiet(s.name):
                    print(f"removed {s.name} ({s.reason})")
            return 0
        if not args.job:
            p.error("clean needs --job J or --all-stale")
        for name in unlink_job_segments(args.job, force=args.force):
            print(f"removed {name}")
        return 0
    except ShmLayoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
