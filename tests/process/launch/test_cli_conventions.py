"""The conventions every fastsac command keeps: --version, exit codes and keys in --help, a
quiet exit when the reader of its output goes away (`fastsac-launch --plan | head`), and a
Ctrl-C at any moment of the launcher's start-up is one line, never a traceback."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.e2e_helpers import job_segments, tiny_config

import fastsac

REPO = Path(__file__).resolve().parents[3]
COMMANDS = {   # what a user types -> the module that runs it
    "fastsac-launch": "fastsac.launcher", "fastsac-export": "fastsac.tools.export", "fastsac-eval": "fastsac.tools.evaluate",
    "python -m fastsac.collector_main": "fastsac.collector_main", "python -m fastsac.learner_main": "fastsac.learner_main",
    "python -m fastsac.evaluator_main": "fastsac.evaluator_main",
}


def sigint_as_a_terminal_delivers_it() -> None:
    """preexec_fn: a test run in the background (nohup, `&`) ignores SIGINT (and under nohup SIGHUP),
    which children inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def run(module: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, **kwargs)


@pytest.mark.process
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_version(command):
    proc = run(COMMANDS[command], "--version")
    assert proc.returncode == 0 and proc.stdout.strip().endswith(fastsac.__version__), proc.stdout + proc.stderr


@pytest.mark.process
def test_launch_help_names_the_exit_codes_the_common_keys_and_the_key_reference():
    out = run("fastsac.launcher", "--help").stdout
    for text in ("exit codes: 0", "1 a runtime failure", "2 invalid config", "run_dir=", "resume=auto", "seed=",
                 "device=", "env.num_envs=", "trainer.num_iterations=", "docs/configuration.md"):
        assert text in out, f"{text!r} missing from fastsac-launch --help:\n{out}"
    for module in ("fastsac.tools.export", "fastsac.tools.evaluate"):
        assert "exit codes: 0" in run(module, "--help").stdout


@pytest.mark.process
@pytest.mark.parametrize("args", [["--plan"], ["--plan", "--json"], ["--print-config"]])
def test_output_into_a_closed_pipe_exits_quietly(tmp_path, args):
    read_end, write_end = os.pipe()
    os.close(read_end)                       # the reader is gone before anything is written (`| head -0`)
    try:
        proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", "configs/quickstart.yaml", *args,
                               f"run_dir={tmp_path / 'run'}"], cwd=REPO, stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


@contextlib.contextmanager
def launcher(cfg: Path):
    """fastsac-launch CFG as a terminal starts it, in its own session; killed with its group on the way out."""
    proc = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=sigint_as_a_terminal_delivers_it)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


@pytest.mark.process
@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("mode, delay_s", [("sync", 0.4), ("sync", 1.0), ("async", 0.15), ("async", 2.5)])
def test_ctrl_c_while_the_launcher_starts_is_one_line_not_a_traceback(tmp_path, job_name, mode, delay_s, sig):
    """SIGINT (what a terminal's Ctrl-C sends), SIGTERM or SIGHUP while Python imports the launcher,
    torch, builds the envs or spawns the job: exit 128 + the signal with one line naming it before
    the job's own handling is in place, a graceful stop (0) after; never a KeyboardInterrupt
    traceback nor a silent death by the signal with an empty log, no segment left."""
    cfg = tiny_config(tmp_path, job_name, trainer={"num_iterations": 100000, "asynchronous": mode == "async"})
    with launcher(cfg) as proc:
        time.sleep(delay_s)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    # -SIGINT: a Ctrl-C in the interpreter's first milliseconds, before any Python of ours ran
    assert proc.returncode in (0, 128 + sig, -signal.SIGINT), (proc.returncode, out + err)
    if proc.returncode == 128 + sig:
        what = "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
        assert f"fastsac-launch: interrupted ({what}) while starting, before the job ran" in err, err
    assert job_segments(job_name) == []


@pytest.mark.process
@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_every_stop_signal_stops_the_sync_trainer_gracefully(tmp_path, job_name, sig):
    """SIGHUP (an ssh session that drops), SIGTERM and SIGINT mid-run: the synchronous trainer
    finishes its iteration, writes the final checkpoint and its summary, exit 0 (the async
    trainer: test_faults.py)."""
    cfg = tiny_config(tmp_path, job_name, trainer={"num_iterations": 100000, "asynchronous": False},
                      checkpoint={"interval": 0})
    with launcher(cfg) as proc:
        seen = ""
        while "run started" not in seen:     # the trainer runs: its own stop handling is in place
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            seen += line
        time.sleep(0.5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    out = seen + out
    assert proc.returncode == 0, (proc.returncode, out + err)
    assert "stop requested: writing final checkpoint" in out and "run summary:" in out, out + err
    assert len(list((tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"))) == 1, "no final checkpoint"


INTERRUPT_DEFERRED = """
import signal
from fastsac.common.stopping import interrupt_deferred
ran_on = False
try:
    with interrupt_deferred():
        signal.raise_signal(signal.SIGINT)   # a Ctrl-C in the middle: only recorded
        ran_on = True
except KeyboardInterrupt:
    print("raised on the way out" if ran_on else "raised inside")
print("default handler back:", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a job started in the background ignores SIGINT
with interrupt_deferred():
    signal.raise_signal(signal.SIGINT)
print("ignored stays ignored:", signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
"""


@pytest.mark.process
def test_a_deferred_interrupt_is_raised_after_the_block_and_an_ignored_one_stays_ignored():
    proc = run_python(INTERRUPT_DEFERRED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["raised on the way out", "default handler back: True",
                                           "ignored stays ignored: True"], proc.stdout + proc.stderr


CTRL_C_WHILE_THE_ENVS_BUILD = """
import signal, sys
import fastsac.sync as sync
from fastsac.launcher import main
make_env = sync.make_env
def interrupted_make_env(*args, **kwargs):   # the Ctrl-C lands while the envs build
    signal.raise_signal(signal.SIGINT)
    return make_env(*args, **kwargs)
sync.make_env = interrupted_make_env
sys.exit(main([sys.argv[1]]))
"""


@pytest.mark.process
def test_ctrl_c_while_the_sync_trainer_builds_its_envs_is_a_graceful_stop(tmp_path, job_name):
    """The sync trainer installs its stop handling before torch and the envs run (C++ that calls
    Python, where a raised KeyboardInterrupt aborts the process): the stop is recorded and the
    run ends at its first iteration with a final checkpoint, exit 0."""
    cfg = tiny_config(tmp_path, job_name, trainer={"num_iterations": 100000, "asynchronous": False})
    proc = run_python(CTRL_C_WHILE_THE_ENVS_BUILD, str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stop requested: writing final checkpoint" in proc.stdout, proc.stdout
    assert list((tmp_path / "run" / "checkpoints").glob("*.pt")), "no final checkpoint"


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          preexec_fn=sigint_as_a_terminal_delivers_it)
