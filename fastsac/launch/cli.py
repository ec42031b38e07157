"""`fastsac-launch CONFIG.yaml [key=value ...]`: the job supervisor and CLI entry point.

Torch-free: it validates the config, plans placement, creates the job's control
segment, starts the learner and the collectors as separate processes (each under
numactl when binding is on), supervises them and cleans up. The synchronous trainer
(`trainer.asynchronous: false`) runs in this process instead.

Exit codes: 0 finished (or stopped gracefully by SIGTERM/SIGINT/SIGHUP after the final
checkpoint), 1 runtime failure, 2 invalid config or usage.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from fastsac import shm_layout as shm
from fastsac.common.command_line import EXIT_CODES_HELP, UsageParser, quiet_broken_pipe
from fastsac.common.stopping import interrupt_deferred
from fastsac.config import Config, ConfigError, config_to_yaml, load_config
from fastsac.envs.registry import env_spec
from fastsac.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from fastsac.launch import gpu_memory, memory_check, preflight
from fastsac.launch.numa_check import run_numa_check
from fastsac.launch.status import main as status_main
from fastsac.launch.supervisor import Supervisor
from fastsac.machine.plan import plan_job
from fastsac.machine.plan_output import format_plan, plan_to_json
from fastsac.machine.topology import discover_topology, format_cpulist
from fastsac.run_dir.checkpoint import CheckpointError  # torch-free
from fastsac.run_dir.contents import check_run_dir_lineage  # torch-free
from fastsac.run_dir.lock import RunDirLock
from fastsac.shm_layout import job_is_alive
from fastsac.shm_layout.job_settings import job_settings

LAUNCH_HELP = f"""keys most runs set (as key=value after the config, or in it):
  run_dir=runs/NAME             where logs, TensorBoard files and checkpoints go
  resume=auto | resume=PATH     continue from the newest checkpoint in run_dir, or from a file
  seed=N                        the job's seed (every other seed derives from it)
  device=auto | cpu | cuda:N    the learner's device
  env.num_envs=N                parallel envs in all (split across collectors)
  trainer.num_iterations=N      run length in env-step batches
every key: docs/configuration.md (or fastsac-launch CONFIG --print-config for the resolved values)

{EXIT_CODES_HELP}"""


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="fastsac-launch",
        description="Train FastSAC from a YAML job config. Overrides: dotted key=value pairs, "
                    "e.g. trainer.num_iterations=200 seed=3.",
        epilog=LAUNCH_HELP)
    p.add_argument("config", nargs="?", help="job config YAML (see configs/)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--plan", action="store_true",
                   help="print the placement of every process (node, CPUs, envs, seed, device, exact command) "
                        "without starting anything")
    p.add_argument("--json", action="store_true", help="with --plan: print it as JSON")
    p.add_argument("--status", metavar="JOB", help="show a running job's processes and progress (read-only)")
    p.add_argument("--watch", action="store_true", help="with --status: refresh every 2 s until Ctrl-C")
    p.add_argument("--cleanup", metavar="JOB",
                   help="remove the shared-memory segments of a dead job (refused while it is alive)")
    p.add_argument("--force", action="store_true",
                   help="with --cleanup: also while orphaned learner/collector processes of the dead job are "
                        "still attached (they keep their own mapping and exit on their own)")
    p.add_argument("--check-numa", action="store_true",
                   help="torch-free placement check: start every process with its real binding, let each "
                        "create/attach and first-touch its segments, print what /proc says (JSON), exit")
    return p


def check_before_spawn(cfg: Config, plan, spec, *, uses_segments: bool, trains: bool = True) -> None:
    """Every check that can run before a process is spawned or a file is created; ConfigError = exit 2.

    A launch, `--plan` and `--check-numa` all pass through here, so a plan that prints is a job that
    starts. config.py has already checked what the config alone decides and plan_job what the
    topology decides (nodes, CPUs per collector, the collector maximum); these need the machine
    as it is now. New pre-spawn checks belong in this function.
    """
    preflight.check_run_dir(cfg)
    preflight.check_resume(cfg)
    preflight.check_extras(cfg)
    # One run per run_dir (fastsac.run_dir.contents); --plan and --check-numa train nothing and write no
    # checkpoint, so an earlier run's files are no reason to refuse them (--plan names them).
    # (A second launch of a running job is told exactly that, later.)
    if trains and not job_is_alive(cfg.job_name) and (refusals := launch_refusals(cfg)):
        raise ConfigError(refusals[0])
    preflight.check_devices(cfg, [p.device for p in plan.learners] if plan is not None else ())
    preflight.check_master_port(cfg)
    memory_check.check_memory(cfg, spec, plan)
    gpu_memory.check_gpu_memory(cfg, spec, plan)   # the GPU's share of the same estimate (it builds on memory_check)
    if uses_segments:
        preflight.check_shared_memory(cfg, plan, spec)


def already_running(job: str) -> str:
    return (f"job {job!r} is already running (another launcher holds {shm.ctl_name(job)}); stop it first or choose "
            "another job_name")


def launch_refusals(cfg: Config) -> list[str]:
    """Why a launch of cfg would be refused now (exit 2) by what is already there: a running job of
    its job_name, another job holding its run_dir (named before anything else about it), or
    another run's output in the run_dir. A launch stops at the first; --plan, which trains
    nothing, prints them after the plan."""
    if job_is_alive(cfg.job_name):
        return [already_running(cfg.job_name)]
    try:
        RunDirLock.check_free(cfg.run_path)
        check_run_dir_lineage(cfg.run_path, cfg.resume)
    except ConfigError as exc:
        return [str(exc)]
    return []


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    if args.status or args.cleanup:
        return job_tool(args)
    try:
        if args.config is None:
            raise ConfigError("no config file given; usage: fastsac-launch CONFIG.yaml [key=value ...]")
        cfg = load_config(args.config, args.overrides)
        if args.print_config:
            return print_config(cfg)
        spec = env_spec(cfg.env.name, cfg.env.max_episode_steps)  # unknown gymnasium id / missing extra -> exit 2
        plan = None
        if cfg.trainer.asynchronous or args.plan or args.check_numa:
            plan = plan_job(cfg, discover_topology(), os.path.abspath(args.config), args.overrides)
        check_before_spawn(cfg, plan, spec, uses_segments=cfg.trainer.asynchronous or args.check_numa,
                           trains=not (args.plan or args.check_numa))
        if args.plan:
            code = print_plan(plan, args.json) if cfg.trainer.asynchronous else print_sync_plan(cfg, plan, args)
            for reason in launch_refusals(cfg):   # the plan stands (exit 0); starting it now would not
                print(f"fastsac-launch: note: a launch of this job now would be refused (exit 2): {reason}",
                      file=sys.stderr)
            return code
    except ConfigError as exc:
        print(f"fastsac-launch: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.check_numa:
        return run_async(cfg, plan, check_numa=True)
    if not cfg.trainer.asynchronous:
        return run_sync(cfg)
    return run_async(cfg, plan)


@quiet_broken_pipe     # the read-only outputs may go into `| head`
def print_config(cfg: Config) -> int:
    print(config_to_yaml(cfg), end="")
    return EXIT_OK


@quiet_broken_pipe
def job_tool(args) -> int:
    """--status / --cleanup: act on a job by name; no config needed."""
    if args.status:
        return status_main(args.status, args.watch)
    try:
        removed = shm.unlink_job_segments(args.cleanup, force=args.force)
    except shm.ShmLayoutError as exc:
        print(f"fastsac-launch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for name in removed:
        print(f"removed {name}")
    if not removed:
        print(f"no segments of job {args.cleanup!r} in {shm.SHM_DIR}")
    return EXIT_OK


@quiet_broken_pipe
def print_plan(plan, as_json: bool) -> int:
    if as_json:
        print(json.dumps(plan_to_json(plan), indent=2))
    else:
        print(format_plan(plan))
    return EXIT_OK


@quiet_broken_pipe
def print_sync_plan(cfg: Config, plan, args) -> int:
    """--plan of the synchronous trainer: the one process it is (the launcher itself steps the envs
    and trains, on every CPU it may use), not the async layout of collectors and a learner."""
    cpus = plan.topology.allowed_cpus
    command = shlex.join([sys.executable, "-m", "fastsac.launcher", os.path.abspath(args.config), *args.overrides])
    me = {"role": "trainer", "process": "the launcher itself", "cpus": format_cpulist(cpus),
          "envs": f"0-{cfg.env.num_envs - 1} ({cfg.env.num_envs})", "seed": cfg.seed,
          "device": plan.learners[0].device, "threads": len(cpus), "binding": "off", "command": command,
          "eval": f"inline, every {cfg.eval.interval} iterations" if cfg.eval.interval > 0 else "off"}
    if args.json:
        print(json.dumps({"trainer": "synchronous", "processes": [me], "segments": [],
                          "topology": plan_to_json(plan)["topology"]}, indent=2))
        return EXIT_OK
    columns = ("process", "CPUs", "envs", "seed", "device", "threads")
    values = ("trainer", me["cpus"], me["envs"], str(me["seed"]), me["device"], str(me["threads"]))
    widths = [max(len(c), len(v)) for c, v in zip(columns, values)]
    print("job plan: the synchronous trainer (trainer.asynchronous: false): one process, the launcher itself; "
          "no learner, collector or evaluator processes, no shared-memory segments\n")
    for row in (columns, values):
        print("  " + "  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip())
    print(f"  (stepping and updates alternate on every allowed CPU; evaluation: {me['eval']})\n\n"
          f"command:\n  {command}")
    return EXIT_OK


def run_async(cfg: Config, plan, check_numa: bool = False) -> int:
    job = cfg.job_name
    if shm.job_is_alive(job):
        print(f"fastsac-launch: {already_running(job)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        # the check trains nothing: it takes no run_dir lock (it only writes its reports to logs/)
        lock = None if check_numa else RunDirLock.acquire(cfg.run_path, job)
    except ConfigError as exc:   # another job's run_dir
        print(f"fastsac-launch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return supervise_job(cfg, plan, check_numa)
    finally:
        if lock is not None:
            lock.release()


def supervise_job(cfg: Config, plan, check_numa: bool) -> int:
    """Create the job's control segment, run it (or the NUMA check), and unlink every segment."""
    job = cfg.job_name
    try:
        stale = shm.find_stale_segments(job)
        if stale:  # their creator is provably dead (lock released / pid gone / other boot)
            print(f"fastsac-launch: removing stale segments of an earlier launch:\n{shm.format_stale_report(stale)}",
                  file=sys.stderr)
        ctl = shm.ControlBlock.create(job, cfg.trainer.async_options.num_collectors, job_settings(cfg, plan),
                                      num_learners=len(plan.learners))
    except shm.LaunchLockError as exc:   # someone else's launch holds the job: not a failure to retry
        print(f"fastsac-launch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except shm.ShmLayoutError as exc:
        print(f"fastsac-launch: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        if check_numa:
            return run_numa_check(cfg, plan, ctl)
        return Supervisor(cfg, plan, ctl).run()
    finally:
        ctl.unlink(include_collectors=True)
        ctl.close()


def run_sync(cfg: Config) -> int:
    # a Ctrl-C while torch imports surfaces after the import, where it unwinds (train_sync then
    # installs its own handling first)
    with interrupt_deferred():
        # torch: only the synchronous trainer brings it in (the launcher itself is torch-free)
        from fastsac.sync import train_sync
    try:
        with RunDirLock.acquire(cfg.run_path, cfg.job_name):
            return train_sync(cfg)
    except (CheckpointError, ConfigError) as exc:  # bad input, e.g. a corrupt checkpoint to resume from
        print(f"fastsac-launch: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
