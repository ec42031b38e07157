"""The learner: drains every collector's ring, trains FastSAC, broadcasts actor weights.

    python -m fastsac.learner_main --config JOB.yaml [--learner-index I] [key=value ...]

Started by the launcher on the GPU's NUMA node (which first creates the job's control
segment; the learner attaches to it by job_name). It owns the agent, the replay buffer,
TensorBoard logging and checkpoints; SIGTERM/SIGINT or the launcher's stop flag end it
gracefully with a final checkpoint.

Loop: drain up to max_ingest_per_iter slots from all rings (copy out through a reusable
staging buffer, pinned on CUDA, one host->device copy per ring, read cursor committed
after the copy) -> updates by utd_mode -> publish weights every weight_publish_interval
updates (flatten + device->host once, then a non-blocking seqlock write per collector).
"""
from __future__ import annotations

import argparse
import sys

from fastsac.common.command_line import UsageParser
from fastsac.process import setup as process_setup

ROLE = "learner"


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="python -m fastsac.learner_main",
        description="Run the fastsac learner of a job whose control segment the launcher created "
                    "(fastsac-launch starts it for you).")
    p.add_argument("--learner-index", type=int, default=0,
                   help="which of this machine's learners this is (0-based; distributed.num_learners > 1)")
    process_setup.add_common_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return process_setup.run_role(ROLE, _run, argv)


def _run(argv: list[str] | None) -> int:
    ctx = process_setup.start(ROLE, build_parser(), argv)
    # after start() bound this process: numpy, torch and the envs allocate on its node
    from fastsac.process.numa_check import run_learner_check
    if ctx.args.check_numa:
        return run_learner_check(ctx)
    # (the NUMA check runs without torch: it has to be quick in the emulated guest)
    from fastsac.machine.learner_plan import is_group
    from fastsac.process.torch_runtime import configure_torch
    from fastsac.run_dir.checkpoint import CheckpointError
    configure_torch(process_setup.torch_threads(ctx))
    # torch is imported from here on: after configure_torch set what it reads at import
    from fastsac.learner.coordination import SoloCoordination
    from fastsac.learner.loop import Learner
    failures: tuple = ()
    if is_group(ctx.cfg):
        # torch.distributed is imported only by a learner group (the single learner never loads it)
        from fastsac.learner.distributed import DistributedError
        from fastsac.learner.group_coordination import GroupCoordination
        coordination, failures = GroupCoordination(), (DistributedError,)
    else:
        coordination = SoloCoordination()
    return process_setup.build_and_run(ROLE, lambda stop: Learner(ctx, coordination), (CheckpointError,), failures)


if __name__ == "__main__":
    sys.exit(main())
