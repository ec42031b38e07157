"""Everything that can be checked before a process is spawned is checked before, through the real CLI:
exit code 2, a message that names the key path and what is valid, and nothing created (no run_dir,
no logs, no segments in /dev/shm). `--plan` applies the same checks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.e2e_helpers import job_segments, tiny_config

from fastsac.launch import preflight
from fastsac.shm_layout import MAX_COLLECTORS

AO = "trainer.async_options"
NCPU = len(os.sched_getaffinity(0))
HAS_GPU = preflight.visible_gpu_count() > 0


def run_cli(tmp_path: Path, cfg: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The launcher as a user runs it, from tmp_path (a relative run_dir would land there)."""
    try:
        return subprocess.run([sys.executable, "-m", "fastsac.launcher", str(cfg), *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"fastsac-launch {' '.join(args)} did not stop within {timeout}s") from exc


def assert_refused(tmp_path: Path, job: str, cfg: Path, args: list[str], *fragments: str) -> str:
    proc = run_cli(tmp_path, cfg, *args)
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert "fastsac-launch: config error: " in err, err
    for frag in fragments:
        assert frag in err, (frag, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"], "something was created"
    assert job_segments(job) == []
    assert "starting" not in proc.stdout.lower() and "learner" not in proc.stdout, proc.stdout
    return err


CASES = [
    # (id, overrides, fragments of the message)
    ("run_dir under /proc", ["run_dir=/proc/fastsac_run"],
     ["run_dir: '/proc/fastsac_run' is inside /proc", "choose a directory on a real filesystem"]),
    ("run_dir under /sys", ["run_dir=/sys/fs/fastsac_run"],
     ["run_dir: '/sys/fs/fastsac_run' is inside /sys"]),
    ("more collectors than the layout holds",
     [f"{AO}.num_collectors={MAX_COLLECTORS + 1}", f"env.num_envs={MAX_COLLECTORS + 1}"],
     [f"{AO}.num_collectors: {MAX_COLLECTORS + 1} is out of range; a job has at most {MAX_COLLECTORS} collectors"]),
    ("seed too large for the seed derivation", ["seed=100000000000000000000000"],
     ["seed: 100000000000000000000000 is out of range; expected a value >= 0 and <= 4294967295"]),
    ("seed as a float", ["seed=1.0e+23"], ["seed: 1e+23 is a float; expected an integer"]),
    ("seed written 1e23 (YAML text)", ["seed=1e23"], ["seed: '1e23' is a str; expected an integer"]),
    ("replay buffer larger than memory", ["device=cpu", "algo.buffer_size=1000000000000"],
     ["algo.buffer_size: 1000000000000 slots per env: the replay buffer for env.num_envs 8 and the rest of the "
      "job need", "MemAvailable", "lower algo.buffer_size or env.num_envs"]),
    ("critics larger than memory", ["device=cpu", "algo.critic_hidden_dim=65536"],
     ["algo.critic_hidden_dim: 65536: the twin critics and their targets and the rest of the job need",
      "shrink the critics (algo.critic_hidden_dim"]),
    ("int64 overflow", ["algo.learning_starts=100000000000000000000"],
     ["algo.learning_starts: 100000000000000000000 is out of range; expected a value >= 0 and <= 9223372036854775807"]),
    # issue 46: passed every check, then the learner's first update died of a storage-size overflow
    ("batch size past its bound", ["algo.batch_size=4611686018427387904"],
     ["algo.batch_size: 4611686018427387904 is out of range; expected a value >= 1 and <= 16777216"]),
    ("one update larger than memory", ["device=cpu", "algo.batch_size=16777216"],
     ["algo.batch_size: 16777216 transitions per update: one update's working set", "MemAvailable",
      "lower algo.batch_size"]),
    ("heartbeat timeout below the minimum", [f"{AO}.heartbeat_timeout_s=0.001"],
     [f"{AO}.heartbeat_timeout_s: 0.001 is out of range; expected a value >= 2.0"]),
    ("stop timeout below the minimum", [f"{AO}.stop_timeout_s=0.5"],
     [f"{AO}.stop_timeout_s: 0.5 is out of range; expected a value >= 5.0"]),
    ("training envs larger than memory", ["env.num_envs=4000000000"],
     ["env.num_envs: 4000000000 envs of 'pendulum' and the rest of the job need", "MemAvailable",
      "bytes per env (fastsac's table for the built-in task) the largest env.num_envs that fits is"]),
    ("eval envs larger than memory", ["eval.interval=10", "eval.episodes=4000000000", "eval.num_envs=4000000000"],
     ["eval.num_envs: 4000000000 eval envs of 'pendulum' and the rest of the job need",
      "the largest eval.num_envs that fits is"]),
    ("rings larger than /dev/shm", [f"{AO}.ring_capacity=1000000000"],
     [f"{AO}.ring_capacity: 1000000000 slots per ring: the shared-memory segments of 1 collector(s) need",
      "/dev/shm has", "lower trainer.async_options.ring_capacity"]),
    ("missing resume checkpoint", ["resume=missing/ckpt.pt"],
     ["resume: 'missing/ckpt.pt' does not exist; expected '' (fresh start), 'auto' (the newest valid checkpoint in "
      "run_dir) or the path of a checkpoint file"]),
    ("run_dir component longer than NAME_MAX", ["run_dir=runs/" + "r" * 300],
     ["run_dir: the path component 'rrrr", "is 300 bytes long; this filesystem allows names of at most 255 bytes"]),
    ("run_dir longer than PATH_MAX", ["run_dir=" + "/".join(["d" * 200] * 21)],
     ["run_dir: the path is", "paths may be at most 4095 bytes here; choose a shorter run_dir"]),
    ("resume path longer than NAME_MAX", ["resume=" + "c" * 300 + ".pt"],
     ["resume: the path component 'cccc", "is 303 bytes long"]),
    ("numa_nodes with binding off", [f"{AO}.numa_binding=off", f"{AO}.numa_nodes=[0]"],
     [f"{AO}.numa_nodes: [0] contradicts {AO}.numa_binding: 'off'"]),
]
if NCPU + 1 <= MAX_COLLECTORS:
    CASES.append(("more collectors than CPUs", [f"{AO}.num_collectors={NCPU + 1}", f"env.num_envs={NCPU + 1}"],
                  [f"{AO}.num_collectors: {NCPU + 1} collectors but this process may use only {NCPU} CPU"]))
if not HAS_GPU:
    CASES += [("cuda without a GPU", ["device=cuda"],
               ["device: 'cuda' was requested but this machine shows no NVIDIA GPU", "use cpu or auto"]),
              ("collector cuda without a GPU", [f"{AO}.collector_inference_device=cuda:0"],
               [f"{AO}.collector_inference_device: 'cuda:0' was requested but this machine shows no NVIDIA GPU"])]
CASES.append(("cuda index past the GPUs", ["device=cuda:63"], ["device: 'cuda:63' was requested but"]))


@pytest.mark.process
@pytest.mark.parametrize("mode", ["launch", "plan"])
@pytest.mark.parametrize("case_id, overrides, fragments", CASES, ids=[c[0] for c in CASES])
def test_refused_before_anything_is_created(tmp_path, job_name, mode, case_id, overrides, fragments):
    cfg = tiny_config(tmp_path, job_name, run_dir="run", trainer={"num_iterations": 20})
    args = [*overrides] + (["--plan"] if mode == "plan" else [])
    assert_refused(tmp_path, job_name, cfg, args, *fragments)


@pytest.mark.process
def test_sync_trainer_gets_the_same_checks(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, run_dir="run", trainer={"asynchronous": False, "num_iterations": 20})
    assert_refused(tmp_path, job_name, cfg, ["resume=nope.pt"], "resume: 'nope.pt' does not exist")
    assert_refused(tmp_path, job_name, cfg, ["run_dir=/proc/x"], "run_dir: '/proc/x' is inside /proc")
    assert_refused(tmp_path, job_name, cfg, ["device=cpu", "algo.buffer_size=1000000000000"], "MemAvailable")


@pytest.mark.process
def test_run_dir_that_is_a_file_is_refused(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, run_dir="job.yaml")
    proc = run_cli(tmp_path, cfg, "--plan")
    assert proc.returncode == 2 and "run_dir: 'job.yaml' exists and is not a directory" in proc.stderr


@pytest.mark.process
def test_a_valid_config_still_plans_and_nothing_is_created(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, run_dir="run")
    proc = run_cli(tmp_path, cfg, "--plan")
    assert proc.returncode == 0, proc.stderr
    assert "job plan: 1 learner + 1 collector(s)" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


@pytest.mark.process
def test_the_launcher_never_imports_torch(tmp_path, job_name):
    """--plan and a refused launch run every pre-spawn check without importing torch."""
    cfg = tiny_config(tmp_path, job_name, run_dir="run")
    code = ("import sys; from fastsac.launcher import main\n"
            f"rc1 = main([{str(cfg)!r}, '--plan'])\n"
            f"rc2 = main([{str(cfg)!r}, 'device=cuda:63'])\n"
            f"rc3 = main([{str(cfg)!r}, 'device=cpu', 'algo.buffer_size=1000000000000'])\n"
            "assert (rc1, rc2, rc3) == (0, 2, 2), (rc1, rc2, rc3)\n"
            "assert 'torch' not in sys.modules, 'the launcher imported torch'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.process
@pytest.mark.parametrize("mode", ["launch", "plan"])
def test_wandb_online_without_credentials_is_refused_before_spawning(tmp_path, job_name, mode):
    """The learner used to die ~12 s into the job with a 50-line traceback from wandb.init."""
    cfg = tiny_config(tmp_path, job_name, logging={"wandb": {"enabled": True}})
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["NETRC"] = str(tmp_path / "no.netrc")
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(cfg), *(["--plan"] if mode == "plan" else [])],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "logging.wandb.mode: 'online' needs W&B credentials" in proc.stderr and "wandb login" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"] and job_segments(job_name) == []


@pytest.mark.process
@pytest.mark.parametrize("key", ["run_dir", "resume"])
def test_a_symbolic_link_loop_is_refused_naming_the_path(tmp_path, tmp_path_factory, job_name, key):
    """run_dir or resume through a symlink loop: exit 2 naming the path (before: an ELOOP traceback, exit 1)."""
    links = tmp_path_factory.mktemp("loop")
    (links / "a").symlink_to(links / "b")
    (links / "b").symlink_to(links / "a")
    cfg = tiny_config(tmp_path, job_name)
    for mode in ([], ["--plan"]):
        assert_refused(tmp_path, job_name, cfg, [f"{key}={links / 'a'}", *mode],
                       f"{key}: '{links / 'a'}' cannot be used: it is, or passes through, a symbolic link loop")


@pytest.mark.process
def test_the_plan_of_the_sync_trainer_is_the_one_process_it_is(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False})
    proc = run_cli(tmp_path, cfg, "--plan")
    assert proc.returncode == 0, proc.stderr
    assert "the synchronous trainer" in proc.stdout and "one process, the launcher itself" in proc.stdout
    assert "collector_main" not in proc.stdout and "learner_main" not in proc.stdout, proc.stdout
    plan = json.loads(run_cli(tmp_path, cfg, "--plan", "--json").stdout)
    assert plan["trainer"] == "synchronous" and [p["role"] for p in plan["processes"]] == ["trainer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"], "something was created"


@pytest.mark.process
@pytest.mark.parametrize("holder", ["a running job", "another job's run_dir", "another run's output"])
def test_the_plan_says_when_a_launch_would_be_refused_and_why(tmp_path, job_name, holder):
    """--plan exits 0 (the plan itself is valid) and names on stderr what would refuse the launch now."""
    from fastsac import shm_layout as shm
    from fastsac.run_dir.lock import RunDirLock
    cfg = tiny_config(tmp_path, job_name)
    run = tmp_path / "run"
    held = None
    if holder == "a running job":
        held = shm.ControlBlock.create(job_name, 1)
    elif holder == "another job's run_dir":
        held = RunDirLock.acquire(run, "other-job")
    else:
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"env_steps": 8}\n')
    try:
        proc = run_cli(tmp_path, cfg, "--plan")
    finally:
        if isinstance(held, shm.ControlBlock):
            held.unlink(include_collectors=True)
            held.close()
        elif held is not None:
            held.release()
    why = {"a running job": f"job {job_name!r} is already running", "another job's run_dir": "in use by job 'other-job'",
           "another run's output": "already holds the output of an earlier run"}[holder]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "a launch of this job now would be refused (exit 2): " in proc.stderr and why in proc.stderr, proc.stderr
