"""Acceptance of multiple collectors, measured side by side in one command: 1 collector vs N.

Four criteria, each a row of one table with a pass/fail word:
  1. perf/env_steps_per_s: N collectors (one per NUMA node) reach >= 1.8x one collector;
  2. perf/learn_pct rises with N collectors (the learner waits less for data);
  3. perf/updates_per_s does not drop (N vs 1 >= 0.95x);
  4. strict-mode final returns with 1 and with N collectors lie inside the synchronous
     trainer's run-to-run band (mean +- 2 sd over the same seeds).

Everything runs the real CLI (`python -m fastsac.launcher CONFIG ...`) on the given config and
its own env.num_envs (the same total for every run). The two setups compared:
  1 collector:  numa_binding off, default placement: the unbound single collector, the baseline
                (--baseline slice: bound to the CPUs collector 0 of the N gets instead);
  N collectors: placement spread, binding on (numactl, else in-process), one collector per
                NUMA node. With fewer usable nodes than collectors (a 1-node machine) the
                collectors share nodes on disjoint CPU slices (cpus_per_collector; 0 = the
                node's CPUs split evenly) and the output says that one-per-node was not tested.
The node count comes from the launcher's own plan (fastsac/machine/topology.py via `--plan --json`).

Throughput (criteria 1-3): paired rounds, 1-collector run then N-collector run, each run
stopped with SIGTERM --seconds after its first progress line, logging every
--log-interval-s. A run's steady value is the median of its TensorBoard points after the
first third (start-up, learning_starts, buffer filling) without the last one (written while
stopping); criteria use the medians over rounds of those values and of the round-by-round
ratios (as benchmarks/bench_envs.py pairs its cells). Learning (criterion 4): per seed the
synchronous trainer, 1 collector and N collectors, each to --learn-iterations env-step
batches, all with utd_mode strict; final return = mean of the last three logged
rollout/mean_return values (as benchmarks/bench_learning.py).

    python benchmarks/bench_acceptance.py                          # quick start, 2 collectors, ~8 min here
    python benchmarks/bench_acceptance.py configs/humanoid.yaml --learn-iterations 2000   # a 2-node GPU server
    python benchmarks/bench_acceptance.py configs/humanoid.yaml device=cpu env.num_envs=256 \\
        --updates 0 --phases perf                                  # collection only (no learner training)
    python benchmarks/bench_acceptance.py --phases learning --seeds 1 2 3   # the learning band only

Extra key=value arguments go to every run. The last line sums up: `acceptance: K of 4 criteria
met`, naming the failed and skipped ones and why. Exit code 0 when every run completed (whatever
the criteria say), 1 when a run failed, 2 for invalid arguments or a config the launcher refuses.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_group import CHILDREN  # noqa: E402

AO = "trainer.async_options"
DEFAULT_CONFIG = "configs/quickstart.yaml"
ENV_RATIO_TARGET = 1.8      # criterion 1: N collectors vs 1, perf/env_steps_per_s
UPDATES_RATIO_MIN = 0.95    # criterion 3: "does not drop", with 5% for run-to-run noise
BAND_SD = 2.0               # criterion 4: the sync band is mean +- BAND_SD sd
NO_PERF, NO_LEARNING = "no throughput phase, --phases", "no learning phase, --phases"
PROGRESS_LINE = re.compile(r"^\[\d+/\d+\] ", re.M)   # the learner's console progress line
SMOKE = {"rounds": 1, "seconds": 2.0, "log_interval_s": 0.5, "seeds": [1, 2], "learn_iterations": 40}
SMOKE_OVERRIDES = ["env.max_episode_steps=10", "logging.interval=5"]   # episodes end inside a short run


class RunFailed(RuntimeError):
    pass


@dataclass
class Setup:
    """One way to run the job: its label, its overrides and what the launcher planned for it."""
    label: str
    overrides: list[str]
    plan: dict | None = None
    runs: list[dict] = field(default_factory=list)       # one per round / seed
    returns: list[float] = field(default_factory=list)

    def describe(self) -> str:
        if self.plan is None:
            return "the synchronous trainer (trainer.asynchronous=false), one process"
        p = self.plan
        if p["binding"] == "off":
            return (f"numa_binding off (unbound), {len(p['collectors'])} collector; every process may run on "
                    f"CPUs {p['learner']['cpulist']}")
        cols = "; ".join(f"c{c['collector_id']} node {c['node']} CPUs {c['cpulist']}" for c in p["collectors"])
        return (f"numa_binding {p['binding']}, placement {p['placement']}: {cols}; learner "
                f"node {p['learner']['node']} CPUs {p['learner']['cpulist']}")


def launcher_cmd(config: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "fastsac.launcher", config, *overrides]


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def plan(config: str, overrides: list[str]) -> dict:
    """The launcher's plan for these overrides; exit 2 with its message when it refuses them."""
    proc = CHILDREN.run([*launcher_cmd(config, overrides), "--plan", "--json"], timeout=600, env=child_env(), cwd=REPO)
    if proc.returncode != 0:
        print(f"bench_acceptance: the launcher refuses {' '.join(overrides)}:\n{proc.stderr.strip()}",
              file=sys.stderr)
        raise SystemExit(2 if proc.returncode == 2 else 1)
    return json.loads(proc.stdout)


def run_job(config: str, overrides: list[str], run_dir: Path, job: str, timeout: float,
            stop_after_s: float | None = None) -> dict[str, list[float]]:
    """Run one job to its end (or SIGTERM it stop_after_s after its first progress line);
    returns its log points (run_dir/metrics.jsonl rows with the progress scalars), in order."""
    run_dir.mkdir(parents=True)
    out_path = run_dir / "launcher.out"
    cmd = launcher_cmd(config, [*overrides, f"run_dir={run_dir}", f"job_name={job}"])
    with open(out_path, "w") as out:
        proc = CHILDREN.start(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO)
    deadline = time.monotonic() + timeout
    try:
        if stop_after_s is not None:
            learner_log = run_dir / "logs" / "learner.log"
            while not (learner_log.is_file() and PROGRESS_LINE.search(learner_log.read_text(errors="replace"))):
                if proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(cmd, timeout)
                time.sleep(0.2)
            if proc.poll() is None:
                time.sleep(stop_after_s)
                proc.send_signal(signal.SIGTERM)  # graceful: collectors stop, the learner logs and saves
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        CHILDREN.forget(proc)
    except subprocess.TimeoutExpired:
        CHILDREN.stop(proc, signal.SIGKILL)
        raise RunFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd)}\n{out_path.read_text()[-3000:]}")
    if proc.returncode != 0:
        raise RunFailed(f"exit {proc.returncode}: {' '.join(cmd)}\n{out_path.read_text()[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "perf/env_steps_per_s" in r]


def steady(rows: list[dict], name: str) -> float:
    """The rate over the steady part of a run (the log points after the first third, without
    the last: the stop's window): each window's rate weighted by its length, i.e. the steps
    counted over the elapsed time. (A median of per-window rates moves in whole env-step
    batches: 4,093 / 5,102 / 8,185 at 512 envs per batch and 1 s windows.)"""
    points = [(r["wall_time"], r[name]) for r in rows if name in r and math.isfinite(r[name])]
    if len(points) >= 5:
        points = points[len(points) // 3 - 1:-1]   # one more in front: the first window's start
    spans = [(t1 - t0, v) for (t0, _), (t1, v) in zip(points, points[1:]) if t1 > t0]
    total = sum(dt for dt, _ in spans)
    return sum(dt * v for dt, v in spans) / total if total > 0 else math.nan


def perf_of(rows: list[dict], n: int) -> dict:
    return {"env": steady(rows, "perf/env_steps_per_s"),
            "per": [steady(rows, f"collector{i}/env_steps_per_s") for i in range(n)],
            "learn": steady(rows, "perf/learn_pct"),
            "updates": steady(rows, "perf/updates_per_s")}


def final_return(rows: list[dict]) -> float:
    last = [r["rollout/mean_return"] for r in rows if "rollout/mean_return" in r][-3:]
    return statistics.fmean(last) if last else math.nan


def ratios(many: list[float], one: list[float]) -> list[float]:
    return [m / o for m, o in zip(many, one) if o > 0 and math.isfinite(m) and math.isfinite(o)]


def fmt_ratio(r: list[float]) -> str:
    return f"{statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]" if r else "n/a"


def fmt_num(x: float, spec: str = ",.0f") -> str:
    return "n/a" if not math.isfinite(x) else format(x, spec)


def med(values: list[float]) -> float:
    values = [v for v in values if math.isfinite(v)]
    return statistics.median(values) if values else math.nan


def row(name: str, one: str, many: str, ratio: str, target: str, result: str) -> str:
    return f"{name:<28} {one:>18} {many:>18} {ratio:>20}  {target:<16} {result}"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default=DEFAULT_CONFIG)
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    p.add_argument("--collectors", type=int, default=2, help="N, compared with 1 collector (>= 2)")
    p.add_argument("--cpus-per-collector", type=int, default=0,
                   help="CPUs per collector when collectors share a node (0 = the node's CPUs split evenly)")
    p.add_argument("--updates", type=int, default=None,
                   help="algo.num_updates for the throughput runs (default: the config's; 0 = collection "
                        "only: learn_pct and updates/s are then skipped)")
    p.add_argument("--baseline", choices=["unbound", "slice"], default="unbound",
                   help="the 1-collector run: unbound (the acceptance baseline) or bound to the CPUs collector 0 "
                        "of the N gets (scaling per CPU slice; on a 1-node machine the unbound collector "
                        "already uses every core)")
    p.add_argument("--phases", nargs="+", choices=["perf", "learning"], default=["perf", "learning"])
    p.add_argument("--rounds", type=int, default=3, help="paired throughput rounds")
    p.add_argument("--seconds", type=float, default=20.0, help="logging time per throughput run")
    p.add_argument("--log-interval-s", type=float, default=1.0, help="logging.interval_s of the throughput runs")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds of the learning band")
    p.add_argument("--learn-iterations", type=int, default=1500,
                   help="env-step batches per learning run (default 1500: half the quick start's budget; "
                        "its returns have levelled off by then)")
    p.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    p.add_argument("--smoke", action="store_true", help="smallest size, for the smoke test: rows, not numbers")
    args = p.parse_args(argv)
    if "=" in args.config and not Path(args.config).is_file():   # overrides only: the default config
        args.overrides, args.config = [args.config, *args.overrides], DEFAULT_CONFIG
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"overrides: {bad[0]!r} is not a key=value pair")
    if args.collectors < 2:
        p.error(f"--collectors: {args.collectors} is not valid; the comparison needs N >= 2")
    for name in ("rounds", "seconds", "log_interval_s", "learn_iterations", "timeout"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)} is not valid; expected a positive value")
    if args.updates is not None and args.updates < 0:
        p.error(f"--updates: {args.updates} is not valid; expected >= 0")
    if args.cpus_per_collector < 0:
        p.error(f"--cpus-per-collector: {args.cpus_per_collector} is not valid; expected >= 0")
    if not Path(args.config).is_file():
        p.error(f"config: {args.config!r} does not exist")
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
        args.overrides = [*SMOKE_OVERRIDES, *args.overrides]
    return args


def binding_on(topo: dict) -> str:
    """Binding explicitly on: numactl where it can run, else each process binds itself."""
    return "numactl" if shutil.which("numactl") and topo["numa_supported"] else "inprocess"


def build_setups(args) -> tuple[Setup, Setup, Setup, str | None]:
    """(sync, 1 collector, N collectors, why one-per-node could not be tested or None)."""
    n = args.collectors
    common = ["trainer.asynchronous=true", f"{AO}.utd_mode=strict"]
    one = Setup("1 collector", [*common, f"{AO}.num_collectors=1", f"{AO}.numa_binding=off"])
    probe = plan(args.config, [*args.overrides, *one.overrides])
    topo = probe["topology"]
    usable = [nd for nd in topo["nodes"] if nd["usable"]]
    many = Setup(f"{n} collectors", [*common, f"{AO}.num_collectors={n}", f"{AO}.placement=spread",
                                     f"{AO}.numa_binding={binding_on(topo)}",
                                     f"{AO}.cpus_per_collector={args.cpus_per_collector}"])
    one.plan, many.plan = probe, plan(args.config, [*args.overrides, *many.overrides])
    if args.baseline == "slice":   # the single collector bound to the CPUs of collector 0 of the N
        c0 = many.plan["collectors"][0]
        one.overrides = [*common, f"{AO}.num_collectors=1", f"{AO}.numa_binding={binding_on(topo)}",
                         f"{AO}.numa_nodes=[{c0['node']}]", f"{AO}.cpus_per_collector={len(c0['cpus'])}"]
        one.plan = plan(args.config, [*args.overrides, *one.overrides])
    untested = None
    if len(usable) < n:
        untested = (f"one collector per NUMA node not tested: {len(usable)} usable NUMA node(s) for {n} "
                    f"collectors, so they ran on disjoint CPU slices of "
                    f"node{'s' if len(usable) > 1 else ''} {', '.join(str(nd['id']) for nd in usable)}")
    sync = Setup("sync", ["trainer.asynchronous=false"])
    return sync, one, many, untested


def perf_phase(args, one: Setup, many: Setup, tmp: Path) -> None:
    extra = [f"logging.interval_s={args.log_interval_s}", "logging.interval=1000000000",
             "trainer.num_iterations=1000000000", "checkpoint.interval=0"]   # ended by SIGTERM
    if args.updates is not None:
        extra.append(f"algo.num_updates={args.updates}")
    for r in range(1, args.rounds + 1):
        for s in (one, many):  # paired: both see the same machine within a round
            n = len(s.plan["collectors"])
            rows = run_job(args.config, [*args.overrides, *s.overrides, *extra], tmp / f"perf_r{r}_c{n}",
                           f"acc{os.getpid()}_p{r}_{n}", args.timeout, stop_after_s=args.seconds)
            v = perf_of(rows, n)
            s.runs.append(v)
            print(f"round {r}  {s.label:<13}: {fmt_num(v['env']):>9} env-steps/s (per collector "
                  + ", ".join(fmt_num(x) for x in v["per"]) + f") | learn {fmt_num(v['learn'], '.1f')}% | "
                  f"{fmt_num(v['updates'], '.1f')} updates/s", flush=True)


def learning_phase(args, setups: list[Setup], tmp: Path) -> None:
    extra = [f"trainer.num_iterations={args.learn_iterations}", "checkpoint.interval=0"]
    for seed in args.seeds:
        for s in setups:  # interleaved: machine noise hits every setup alike
            t0 = time.time()
            rows = run_job(args.config, [*args.overrides, *s.overrides, *extra, f"seed={seed}"],
                           tmp / f"learn_{s.label.replace(' ', '_')}_s{seed}", f"acc{os.getpid()}_l{seed}_{s.label[0]}",
                           args.timeout)
            s.returns.append(final_return(rows))
            print(f"seed {seed}  {s.label:<13}: final return {fmt_num(s.returns[-1], '.1f'):>8}  "
                  f"(wall {time.time() - t0:.0f} s)", flush=True)


def cpu_bound(one: Setup, many: Setup) -> float:
    """CPUs of the N collectors over the single collector's: what bound collection can gain."""
    return sum(len(c["cpus"]) for c in many.plan["collectors"]) / len(one.plan["collectors"][0]["cpus"])


def report(args, sync: Setup, one: Setup, many: Setup, untested: str | None) -> list[str]:
    """Print the criteria table; returns the summary's parts."""
    n = args.collectors
    results: dict[str, tuple[str, str]] = {}   # criterion -> (pass/FAIL/skipped, why)
    print()
    print(row("criterion", "1 collector", f"{n} collectors", f"{n} vs 1", "target", "result"))
    print("-" * 112)
    perf = "perf" in args.phases
    if perf:
        env1, envn = [r["env"] for r in one.runs], [r["env"] for r in many.runs]
        rr = ratios(envn, env1)
        ok = bool(rr) and statistics.median(rr) >= ENV_RATIO_TARGET
        results["env_steps_per_s"] = ("pass" if ok else "FAIL", "")
        print(row("perf/env_steps_per_s", fmt_num(med(env1)), fmt_num(med(envn)), fmt_ratio(rr),
                  f">= {ENV_RATIO_TARGET:.2f}x", results["env_steps_per_s"][0]))
    else:
        results["env_steps_per_s"] = ("skipped", NO_PERF)
        print(row("perf/env_steps_per_s", "-", "-", "-", f">= {ENV_RATIO_TARGET:.2f}x", f"skipped: {NO_PERF}"))
    if perf and args.updates != 0:
        l1, ln = med([r["learn"] for r in one.runs]), med([r["learn"] for r in many.runs])
        results["learn_pct"] = ("pass" if ln > l1 else "FAIL", "")
        print(row("perf/learn_pct", fmt_num(l1, ".1f") + "%", fmt_num(ln, ".1f") + "%", "-", "rises",
                  results["learn_pct"][0]))
        u1, un = [r["updates"] for r in one.runs], [r["updates"] for r in many.runs]
        ur = ratios(un, u1)
        ok = bool(ur) and statistics.median(ur) >= UPDATES_RATIO_MIN
        results["updates_per_s"] = ("pass" if ok else "FAIL", "")
        print(row("perf/updates_per_s", fmt_num(med(u1), ".1f"), fmt_num(med(un), ".1f"), fmt_ratio(ur),
                  f">= {UPDATES_RATIO_MIN:.2f}x", results["updates_per_s"][0]))
    else:
        why = "collection only, --updates 0" if perf else NO_PERF
        for name in ("learn_pct", "updates_per_s"):
            results[name] = ("skipped", why)
            print(row(f"perf/{name}", "-", "-", "-", "rises" if name == "learn_pct" else
                      f">= {UPDATES_RATIO_MIN:.2f}x", f"skipped: {why}"))
    results["returns"] = returns_rows(args, sync, one, many)
    met = [k for k, (w, _) in results.items() if w == "pass"]
    failed = [k for k, (w, _) in results.items() if w == "FAIL"]
    skipped = [f"{k} ({why})" for k, (w, why) in results.items() if w == "skipped"]
    parts = [f"acceptance: {len(met)} of 4 criteria met" + (f" ({', '.join(met)})" if met else "")]
    if failed:
        parts.append(f"failed: {', '.join(failed)}")
    if skipped:
        parts.append(f"skipped: {', '.join(skipped)}")
    if untested and perf:
        parts.append(untested)
    return parts


def returns_rows(args, sync: Setup, one: Setup, many: Setup) -> tuple[str, str]:
    k = len(args.seeds)
    label = f"returns (strict, {k} seed{'s' if k > 1 else ''})"
    if "learning" not in args.phases:
        print(row(label, "-", "-", "-", "in sync band", f"skipped: {NO_LEARNING}"))
        return "skipped", NO_LEARNING
    finite = [v for v in sync.returns if math.isfinite(v)]
    if len(finite) < 2:
        print(row(label, "-", "-", "-", "in sync band", "skipped: the band needs >= 2 seeds"))
        return "skipped", "the sync band needs >= 2 seeds"
    mean, sd = statistics.fmean(finite), statistics.stdev(finite)
    lo, hi = mean - BAND_SD * sd, mean + BAND_SD * sd
    print(row("returns sync (band)", "", f"{mean:.1f} ± {sd:.1f}", "", f"[{lo:.1f}, {hi:.1f}]", "(band)"))
    words = []
    for s in (one, many):
        vals = [v for v in s.returns if math.isfinite(v)]
        m = statistics.fmean(vals) if vals else math.nan
        sd_s = statistics.stdev(vals) if len(vals) > 1 else 0.0
        inside = len(vals) == len(s.returns) and lo <= m <= hi
        words.append(inside)
        print(row(f"returns {s.label}", "", f"{fmt_num(m, '.1f')} ± {sd_s:.1f}", "", "in sync band",
                  "pass" if inside else "FAIL"))
    return ("pass" if all(words) else "FAIL"), ""


def main(argv=None) -> int:
    args = parse_args(argv)
    sync, one, many, untested = build_setups(args)
    topo = one.plan["topology"]
    nodes = [nd["id"] for nd in topo["nodes"] if nd["usable"]]
    print(f"# bench_acceptance: {args.config} {' '.join(args.overrides)}".rstrip())
    print(f"# machine: nproc {os.cpu_count()}, usable NUMA nodes {nodes}, GPUs {len(topo['gpus'])}, "
          f"learner device {one.plan['learner']['device']}, load average {os.getloadavg()[0]:.2f}")
    print(f"# {one.label}: {one.describe()}")
    print(f"# {many.label}: {many.describe()}")
    if untested:
        print(f"# NOTE: {untested}")
    if args.baseline == "slice":
        print(f"# physical bound of env-steps/s {args.collectors} vs 1 (collection on bound CPUs): "
              f"{cpu_bound(one, many):.2f}x, the {args.collectors} collectors' CPUs over the one's")
    if "perf" in args.phases:
        upd = "config's" if args.updates is None else str(args.updates)
        print(f"# throughput: {args.rounds} paired round(s) (1 collector, then {args.collectors}), "
              f"{args.seconds:g} s of logging per run every {args.log_interval_s:g} s, algo.num_updates "
              f"{upd}{' (collection only)' if args.updates == 0 else ''}; per run the median of its log points "
              "after the first third (last point dropped); ratios: median [range] over rounds")
    if "learning" in args.phases:
        print(f"# learning: seeds {args.seeds}, {args.learn_iterations} env-step batches per run, utd_mode strict; "
              f"final return = mean of the last 3 logged rollout/mean_return; band = sync mean ± {BAND_SD:g} sd")
    print(flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="fastsac_bench_acceptance_") as tmp:
            if "perf" in args.phases:
                perf_phase(args, one, many, Path(tmp))
            if "learning" in args.phases:
                learning_phase(args, [sync, one, many], Path(tmp))
    except RunFailed as exc:
        print(f"bench_acceptance: a run failed: {exc}", file=sys.stderr)
        return 1
    parts = report(args, sync, one, many, untested)
    print("; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
