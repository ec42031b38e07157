"""Start-up shared by every role's process (learner, collector, evaluator), in the order that matters:

1. bind (only with `--bind-node/--bind-cpus`, i.e. numa_binding: inprocess) before any heavy
   import, so thread pools and first-touched pages land on the planned node;
2. load and validate the config (ConfigError -> exit 2);
3. recompute the job plan exactly as the launcher did, and refuse to run when the effective
   CPUs / memory policy differ from this process's entry in it (unless binding is off);
4. log the effective binding.

The plan is recomputed from the whole machine's CPUs, not this process's affinity: under
numactl our own affinity is already narrowed to one node. The launcher passes the CPUs it
planned with in FASTSAC_ALLOWED_CPUS so a container's limits are honoured identically.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from fastsac.common.stopping import StopSignal
from fastsac.config import Config, ConfigError, load_config
from fastsac.errors import EXIT_USAGE, FatalError, exit_code_for
from fastsac.machine import binding
from fastsac.machine.plan import CollectorPlan, JobPlan, ProcessPlan, plan_job
from fastsac.machine.topology import discover_topology, parse_cpulist

ALLOWED_CPUS_ENV = "FASTSAC_ALLOWED_CPUS"


@dataclass
class ProcessContext:
    args: argparse.Namespace
    cfg: Config
    plan: JobPlan
    me: ProcessPlan | CollectorPlan     # this process's entry in the plan
    effective: binding.EffectiveBinding


def log(role: str, message: str) -> None:
    print(f"[{role} pid {os.getpid()}] {message}", flush=True)


def run_role(role: str, main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """A role's entry point: main's exit code, or the exit code of the error that ended it, with
    its message under the process's role (`[collector 0 pid 123] error: ...`)."""
    try:
        return main(argv)
    except FatalError as exc:
        print(f"[{exc.role or role} pid {os.getpid()}] error: {exc}", file=sys.stderr, flush=True)
        return exit_code_for(exc)


def machine_topology():
    allowed = os.environ.get(ALLOWED_CPUS_ENV)
    if allowed:
        return discover_topology(allowed_cpus=parse_cpulist(allowed))
    whole = discover_topology(allowed_cpus=range(os.cpu_count() or 1))
    return discover_topology(allowed_cpus=[c for n in whole.nodes for c in n.cpus] or None)


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="the job's YAML config (the same file the launcher got)")
    p.add_argument("--bind-node", type=int, help="numa_binding inprocess: bind this process to node N first thing")
    p.add_argument("--bind-cpus", help="numa_binding inprocess: CPU list (e.g. 0-3,8) to run on")
    p.add_argument("--check-numa", action="store_true",
                   help="torch-free placement check: bind, create/attach and first-touch the segments, "
                        "print what /proc says, exit")
    p.add_argument("overrides", nargs="*", help="dotted key=value config overrides (as given to the launcher)")


def start(role: str, parser: argparse.ArgumentParser, argv: list[str] | None) -> ProcessContext:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        binding.bind_from_argv(argv)  # before anything heavy; no-op without --bind-node
    except binding.BindingError as exc:
        raise FatalError(f"binding failed: {exc}", role=role) from None
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        plan = plan_job(cfg, machine_topology(), args.config, args.overrides)
    except ConfigError as exc:
        raise FatalError(f"config error: {exc}", EXIT_USAGE, role) from None
    if role == "learner":
        index = getattr(args, "learner_index", 0)
        if not 0 <= index < len(plan.learners):
            raise FatalError(f"--learner-index {index} is not a learner of this job; valid indices are "
                             f"0..{len(plan.learners) - 1} (distributed.num_learners={len(plan.learners)})",
                             EXIT_USAGE)
        me = plan.learners[index]
    elif role == "evaluator":
        if plan.evaluator is None:
            raise FatalError("this job has no evaluator: eval.interval is 0 (or the trainer is synchronous)",
                             EXIT_USAGE)
        me = plan.evaluator
    else:
        if not 0 <= args.collector_id < len(plan.collectors):
            raise FatalError(f"--collector-id {args.collector_id} is not a collector of this job; valid ids are "
                             f"0..{len(plan.collectors) - 1} (trainer.async_options.num_collectors="
                             f"{len(plan.collectors)})", EXIT_USAGE)
        me = plan.collectors[args.collector_id]
    effective = binding.read_binding()
    if me.binding != "off":
        try:
            binding.verify_binding(me.node, me.cpus, effective=effective)
        except binding.BindingError as exc:
            raise FatalError(f"refusing to run: {exc}", role=role) from None
    log(role, f"binding {me.binding}: {effective.describe()}")
    return ProcessContext(args=args, cfg=cfg, plan=plan, me=me, effective=effective)


def build_and_run(role: str, build: Callable[[StopSignal], Any], usage_errors: tuple = (),
                  failure_errors: tuple = ()) -> int:
    """Construct a process's loop, run it until it stops, always close it.

    Construction errors end the process (FatalError): a ConfigError and `usage_errors` (e.g. an
    unusable checkpoint) with exit code 2, a ShmLayoutError (a segment that cannot be attached)
    and `failure_errors` with 1. The stop signals' handlers (stopping.STOP_SIGNALS) are installed
    before construction, so a stop during start-up counts; `build(stop)` may hand them back for a phase that holds nothing
    (stopping.ending_at_once).
    """
    from fastsac.shm_layout import ShmLayoutError   # numpy: only once start() has bound this process
    usage_errors, failure_errors = (ConfigError, *usage_errors), (ShmLayoutError, *failure_errors)
    stop = StopSignal().install()
    try:
        loop = build(stop)
    except usage_errors as exc:
        raise FatalError(f"config error: {exc}" if isinstance(exc, ConfigError) else str(exc), EXIT_USAGE,
                         role) from None
    except failure_errors as exc:
        raise FatalError(str(exc), role=role) from None
    try:
        return loop.run(stop)
    finally:
        loop.close()


def torch_threads(ctx: ProcessContext) -> int:
    """This process's thread-pool size, as its plan says (fastsac.machine.plan: the CPUs it owns,
    or with binding off its share of them)."""
    return ctx.me.threads
