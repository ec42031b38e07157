"""Episode bookkeeping over a batch of envs (numpy, torch-free)."""
from __future__ import annotations

import numpy as np


class EpisodeTracker:
    """Accumulates per-env returns/lengths and totals over finished episodes.

    Totals are cumulative (count, return sum, length sum) so a reader in another
    process can take differences between two reads without any handshake.
    """

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)
        self.count = 0
        self.return_sum = 0.0
        self.length_sum = 0

    def step(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.returns += reward
        self.lengths += 1
        if done.any():
            self.count += int(done.sum())
            self.return_sum += float(self.returns[done].sum())
            self.length_sum += int(self.lengths[done].sum())
            self.returns[done] = 0.0
            self.lengths[done] = 0

    def totals(self) -> tuple[int, float, int]:
        """(episodes finished, sum of their returns, sum of their lengths), cumulative."""
        return self.count, self.return_sum, self.length_sum


class EpisodeWindow:
    """Mean return/length of the episodes finished since the last `take()`."""

    def __init__(self):
        self._last = (0, 0.0, 0)
        self.mean_return = float("nan")
        self.mean_length = float("nan")

    def take(self, count: int, return_sum: float, length_sum: int) -> bool:
        dc = count - self._last[0]
        if dc > 0:
            self.mean_return = (return_sum - self._last[1]) / dc
            self.mean_length = (length_sum - self._last[2]) / dc
        self._last = (count, return_sum, length_sum)
        return dc > 0
