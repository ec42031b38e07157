"""The async learner's update threads: its own, plus those of collectors sharing its CPUs."""
from __future__ import annotations

from types import SimpleNamespace as NS

from fastsac.learner.loop import update_thread_range


def test_unbound_collectors_lend_their_threads_to_the_update():
    # binding off on 2 CPUs: learner, collector and evaluator each planned 1 thread on CPUs 0-1
    me = NS(cpus=(0, 1))
    assert update_thread_range(me, [NS(cpus=(0, 1), threads=1)], 1) == (1, 2)


def test_bound_collectors_on_other_cpus_lend_nothing_and_the_cpus_cap_it():
    me = NS(cpus=(0, 1, 2, 3))
    assert update_thread_range(me, [NS(cpus=(4, 5), threads=2), NS(cpus=(6, 7), threads=2)], 4) == (4, 4)
    assert update_thread_range(me, [NS(cpus=(0, 1, 2, 3), threads=4)], 3) == (3, 4)
