"""How a planned process is started (torch-free): its command line and its extra environment.

The rendering half of the job plan: fastsac.machine.placement decides where every process runs (a
node, CPUs, a device, thread counts); this module writes the argv and environment that start it
there, the same way for the learners, the collectors and the evaluator.
"""
from __future__ import annotations

from dataclasses import dataclass

from fastsac.machine import devices as dv
from fastsac.machine.binding import thread_env
from fastsac.machine.topology import Topology, format_cpulist


@dataclass(frozen=True)
class ChildCommands:
    """What every child's command line shares: the binding method, numactl, the interpreter, and
    the config file and overrides, passed verbatim so each child re-loads the config the launcher
    validated."""
    method: str                   # 'numactl' | 'inprocess' | 'off'
    numactl: str | None
    python: str
    config_path: str
    overrides: tuple[str, ...]
    topology: Topology

    def argv(self, module: str, node: int | None, cpus: tuple[int, ...], extra: list[str]) -> tuple[str, ...]:
        prefix: list[str] = []
        bind: list[str] = []
        if self.method == "numactl":
            whole = set(cpus) == set(self.topology.node(node).cpus)
            prefix = [self.numactl, f"--cpunodebind={node}" if whole else f"--physcpubind={format_cpulist(cpus)}",
                      f"--membind={node}"]
        elif self.method == "inprocess":
            bind = ["--bind-node", str(node), "--bind-cpus", format_cpulist(cpus)]
        return tuple([*prefix, self.python, "-m", module, "--config", self.config_path, *extra, *bind,
                      *self.overrides])


def child_env(threads: int) -> tuple[tuple[str, str], ...]:
    """A child's extra environment: its thread-pool sizes and the GPU numbering the plan assumes."""
    return tuple(sorted({**thread_env(threads), dv.DEVICE_ORDER_ENV[0]: dv.DEVICE_ORDER_ENV[1]}.items()))
