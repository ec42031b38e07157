"""Several calls of one command's main(argv) in one Python process, each answered as its own process
would be: a test that checks many refusals of a CLI pays one interpreter start and one torch import,
not one per call.

Each call gets its own exit status (main's return value; SystemExit's code, as argparse's errors
give it; 1 with the traceback on stderr for an uncaught exception, as the interpreter does) and its
own stdout and stderr (sys.stdout / sys.stderr swapped for the call). Python prints a warning once
per place in a process: a check that a call prints no warning needs a process of its own (cli()).
"""
from __future__ import annotations

import json
import subprocess
import sys

_RUNNER = r"""
import contextlib, importlib, io, json, sys, traceback
main = importlib.import_module(sys.argv[1]).main
results = []
for argv in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            traceback.print_exc()
            code = 1
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    results.append([code, out.getvalue(), err.getvalue()])
sys.__stdout__.write("\n" + json.dumps(results))
"""


def run_mains(module: str, calls: list[list[str]], timeout: float = 240,
              env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """[CompletedProcess(argv, returncode, stdout, stderr)] of `module`.main(argv) for each argv, in
    order, all in one child interpreter (with env, as subprocess.run takes it)."""
    proc = subprocess.run([sys.executable, "-c", _RUNNER, module], input=json.dumps([list(map(str, a)) for a in calls]),
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"the batch of {module}.main calls died (exit {proc.returncode}):\n{proc.stderr}"
    results = json.loads(proc.stdout.rsplit("\n", 1)[1])
    return [subprocess.CompletedProcess(argv, code, out, err) for argv, (code, out, err) in zip(calls, results)]
