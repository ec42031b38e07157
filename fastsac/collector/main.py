"""A collector: steps one shard of the envs on its own CPUs and feeds its ring.

    python -m fastsac.collector_main --config JOB.yaml --collector-id I [key=value ...]

Started by the launcher (under `numactl --cpunodebind=N --membind=N` when binding is on),
or by hand against a running job, e.g. for a collector listed in
trainer.async_options.manual_collectors:

    numactl --cpunodebind=1 --membind=1 python -m fastsac.collector_main \\
        --config job.yaml --collector-id 1

`fastsac-launch job.yaml --plan` prints the exact command for every collector.

Loop (never waits for the learner except through its own full ring):
  wait for a free ring slot (backpressure: the env is not stepped while the ring is full)
  -> poll the weight snapshot every weight_poll_interval steps (non-blocking seqlock read)
  -> act (random before learning_starts, then the read-only policy copy)
  -> env.step -> write the transition straight into the slot -> commit.
"""
from __future__ import annotations

import argparse
import sys

from fastsac.common.command_line import UsageParser
from fastsac.process import setup as process_setup

ROLE = "collector"


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="python -m fastsac.collector_main",
        description="Run one fastsac collector against a running job (the launcher must have created the "
                    "job; attach by job_name from the config and --collector-id).",
        epilog="Example (by hand, on NUMA node 1): numactl --cpunodebind=1 --membind=1 "
               "python -m fastsac.collector_main --config job.yaml --collector-id 1",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--collector-id", type=int, required=True, help="which collector of the job this is (0-based)")
    process_setup.add_common_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return process_setup.run_role(ROLE, _run, argv)


def _run(argv: list[str] | None) -> int:
    ctx = process_setup.start(ROLE, build_parser(), argv)
    role = f"collector {ctx.args.collector_id}"
    # after start() bound this process: numpy, torch and the envs allocate on its node
    from fastsac.process.numa_check import run_collector_check
    if ctx.args.check_numa:
        return run_collector_check(ctx)
    # (the NUMA check runs without torch: it has to be quick in the emulated guest)
    from fastsac.collector.loop import Collector
    from fastsac.process.torch_runtime import configure_torch
    from fastsac.shm_layout import SegmentTaken   # numpy, like the loop: only once this process is bound
    configure_torch(process_setup.torch_threads(ctx))
    # its collector id already running (a second hand-started copy): exit 2, as any other mismatch
    # with the job, not the exit 1 of a segment that cannot be attached
    return process_setup.build_and_run(role, lambda stop: Collector(ctx, role, stop), usage_errors=(SegmentTaken,))


if __name__ == "__main__":
    sys.exit(main())
