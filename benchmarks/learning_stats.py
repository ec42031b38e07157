"""Aggregates of learning curves over seeds, as the field reports them (rliable's conventions).

A curve is a list of eval points (env_steps, seconds, mean_return), seconds being training
wall-clock since the run started (evaluation time excluded where it blocks training). The value
of a curve at a budget is its last evaluation at or before that budget: what a user stopping
there would have. Over seeds: the mean, the interquartile mean (the mean of the middle 50%,
robust to one outlier seed yet using half the runs, unlike the median) and a 95% percentile
bootstrap interval over the runs, for each.
"""
from __future__ import annotations

import math
import random
from typing import Callable, Sequence

Point = tuple[int, float, float]          # (env_steps, seconds, mean_return)


def value_at(curve: Sequence[Point], budget: float, axis: str) -> float:
    """Last eval return at or before `budget` env steps (axis "steps") or seconds ("seconds").

    NaN where the run never got there: before its first evaluation, or past its last env step
    (a run stopped by the wall-clock budget has no value at env steps it did not reach). On the
    seconds axis every run ran to the same budget, so its last evaluation stands for it."""
    index = 0 if axis == "steps" else 1
    if not curve or (axis == "steps" and curve[-1][0] < budget):
        return math.nan
    seen = [p[2] for p in curve if p[index] <= budget]
    return seen[-1] if seen else math.nan


def first_reach(curve: Sequence[Point], threshold: float, after_steps: int = 0) -> tuple[int | None, float | None]:
    """(env steps, seconds) of the first evaluation past `after_steps` env steps at or above
    `threshold`; (None, None) if none. after_steps is the run's warm-up: an evaluation before any
    update measures the initial policy, not learning (Ant's centred first policy stands still and
    collects ~1,000 of healthy reward)."""
    for steps, seconds, ret in curve:
        if steps > after_steps and ret >= threshold:
            return steps, seconds
    return None, None


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% of the values, fractional weights at the
    quartiles (as scipy.stats.trim_mean(0.25) for n divisible by 4, smooth for any other n)."""
    xs = sorted(v for v in values if not math.isnan(v))
    n = len(xs)
    if n == 0:
        return math.nan
    lo, hi = 0.25 * n, 0.75 * n
    total = 0.0
    for i, x in enumerate(xs):               # sample i covers [i, i + 1) of the n-long axis
        total += x * max(0.0, min(i + 1, hi) - max(i, lo))
    return total / (hi - lo)


def mean(values: Sequence[float]) -> float:
    xs = [v for v in values if not math.isnan(v)]
    return sum(xs) / len(xs) if xs else math.nan


def bootstrap_ci(values: Sequence[float], stat: Callable[[Sequence[float]], float], reps: int = 2000,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of stat over the runs (resampled with replacement)."""
    xs = [v for v in values if not math.isnan(v)]
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (math.nan, math.nan)
    rng = random.Random(seed)
    stats = sorted(stat([rng.choice(xs) for _ in xs]) for _ in range(reps))
    tail = (1.0 - level) / 2
    return stats[int(tail * (reps - 1))], stats[int(math.ceil((1.0 - tail) * (reps - 1)))]


def describe(values: Sequence[float]) -> str:
    """'mean M [lo, hi] · IQM Q [lo, hi] (n runs)' for a table cell."""
    xs = [v for v in values if not math.isnan(v)]
    if not xs:
        return "n/a"
    m_lo, m_hi = bootstrap_ci(xs, mean)
    q_lo, q_hi = bootstrap_ci(xs, iqm)
    return (f"mean {mean(xs):,.0f} [{m_lo:,.0f}, {m_hi:,.0f}] · IQM {iqm(xs):,.0f} [{q_lo:,.0f}, {q_hi:,.0f}]"
            f" (n={len(xs)})")
