"""The evaluator process of an async job: `python -m fastsac.evaluator_main --config JOB.yaml
[key=value ...]` (fastsac.evaluation.evaluator has what it does). Its start-up binds the
process (process_setup.start) before anything that allocates is imported.
"""
from __future__ import annotations

import argparse
import sys

from fastsac.common.command_line import UsageParser
from fastsac.errors import EXIT_USAGE, FatalError
from fastsac.process import setup as process_setup

ROLE = "evaluator"


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="python -m fastsac.evaluator_main",
        description="Run the evaluator of a running fastsac job (started by fastsac-launch when eval.interval > 0).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    process_setup.add_common_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return process_setup.run_role(ROLE, _run, argv)


def _run(argv: list[str] | None) -> int:
    ctx = process_setup.start(ROLE, build_parser(), argv)
    if ctx.args.check_numa:
        raise FatalError("--check-numa checks the learner and the collectors; the evaluator has no segment "
                         "placement of its own to check", EXIT_USAGE)
    # after start() bound this process: numpy, torch and the envs allocate on its CPUs' node
    from fastsac.evaluation.evaluator import Evaluator
    from fastsac.process.torch_runtime import configure_torch
    configure_torch(process_setup.torch_threads(ctx))
    return process_setup.build_and_run(ROLE, lambda stop: Evaluator(ctx, ROLE))


if __name__ == "__main__":
    sys.exit(main())
