"""TwinRunner: the twins' halves side by side on a CPU with 2+ threads, one after the other else;
run_after's prepare on the calling thread while the worker's half waits for what it makes."""
from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
import torch

from fastsac.algo.twin_runner import TwinRunner


@pytest.fixture(params=[1, 2], ids=["sequential", "parallel"])
def runner(request):
    r = TwinRunner(torch.device("cpu"))
    n = torch.get_num_threads()
    r.set_threads(request.param)
    yield r
    r.close()
    torch.set_num_threads(n)


def half(k: int, made: Future, log: list) -> str:
    log.append((k, "before"))
    value = made.result()
    log.append((k, "after"))
    return f"{k}:{value}:{threading.current_thread().name}"


def test_run_after_runs_prepare_on_the_caller_and_both_halves_see_its_result(runner):
    made, log = Future(), []

    def prepare():
        log.append(("prepare", threading.current_thread().name))
        made.set_result(7)

    first, second = runner.run_after(prepare, half, made, log)
    caller = threading.current_thread().name
    assert first == f"0:7:{caller}" and log[0][0] in ("prepare", 1)
    assert ("prepare", caller) in log
    assert second.startswith("1:7:") and (second.endswith(caller) != runner.parallel)


def test_a_failing_prepare_fails_the_call_and_releases_the_waiting_half(runner):
    made, log = Future(), []

    def prepare():
        try:
            raise RuntimeError("no targets")
        except RuntimeError as exc:
            made.set_exception(exc)
            raise

    with pytest.raises(RuntimeError, match="no targets"):
        runner.run_after(prepare, half, made, log)
    assert (0, "after") not in log and (1, "after") not in log
    assert runner.run(lambda k: k * 10) == (0, 10)          # the worker is free again
