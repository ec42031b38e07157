"""Running mean/variance observation normalizer.

Only the learner calls `update` (on every env-step batch it ingests); acting and the
collectors use the statistics read-only. Stored observations stay raw in the replay
buffer and are normalized at sample time with the current statistics, so old data is
never stuck with stale statistics.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


def batch_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and population variance over dim 0 of float32 x [n, dim], float32.

    Two-pass by hand: torch.var_mean(dim=0) measured ~20x slower on CPU (330 vs 18 us for
    128 x 348), and the learner runs this for every ingested slot."""
    mean = x.mean(dim=0)
    return mean, (x - mean).square().mean(dim=0)


def chan_merge(count: Tensor, mean: Tensor, var: Tensor, n: float, batch_mean: Tensor,
               batch_var: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Parallel-variance merge (Chan et al.) of (count, mean, var) [float64] with n samples of
    (batch_mean, batch_var): -> (mean, var, count) of the union, float64. Exact for any sizes,
    and no sum-of-squares cancellation: only deviations from the means are combined.

    In float64: the m2 terms grow with count and would lose precision in float32."""
    total = count + n
    delta = batch_mean.double() - mean
    new_mean = mean + delta * (n / total)
    m2 = var * count + batch_var.double() * n + delta.square() * (count * n / total)
    return new_mean, m2 / total, total


class RunningNormalizer(nn.Module):
    """normalize(x) = (x - mean) / sqrt(var + eps), with mean/var over everything seen so far.

    Buffers: mean [dim] float32, var [dim] float32 (population variance), count [] float64.
    Batches are merged with the parallel-variance formula (Chan et al.), which is exact for
    any batch sizes, so the result equals numpy's mean/var over the concatenated data.
    With `enabled=False` the module is the identity (its buffers stay at mean 0, var 1).
    """

    def __init__(self, dim: int, eps: float = 1e-4, enabled: bool = True):
        super().__init__()
        self.dim, self.eps, self.enabled = dim, eps, enabled
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        # float64: a float32 count stops being exact after 2^24 samples, i.e. after ~4k batches of 4096 envs
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.pending: PendingMoments | None = None   # see defer()

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        if not self.enabled:
            return
        x = x.reshape(-1, self.dim).float()
        n = x.shape[0]
        if n == 0:
            return
        batch_mean, batch_var = batch_moments(x)
        if self.pending is not None:      # data-parallel learners: folded in by sync (fastsac.learner.distributed)
            self.pending.add(n, batch_mean, batch_var)
            return
        self.merge(n, batch_mean, batch_var)

    @torch.no_grad()
    def merge(self, n: float, batch_mean: Tensor, batch_var: Tensor) -> None:
        """Fold in the statistics of n samples (their mean and population variance, [dim]).

        n is a Python number; update() and a merge of the same batch's moments give the same bits."""
        if not self.enabled or n == 0:
            return
        new_mean, new_var, total = chan_merge(self.count, self.mean.double(), self.var.double(),
                                              n, batch_mean, batch_var)
        self.mean.copy_(new_mean)
        self.var.copy_(new_var)
        self.count.copy_(total)

    def defer(self) -> "PendingMoments":
        """From now on update() only accumulates into the returned PendingMoments; the owner
        folds them in with merge() (in the same order on every data-parallel learner)."""
        self.pending = PendingMoments(self.dim, self.mean.device)
        return self.pending

    def forward(self, x: Tensor) -> Tensor:
        if not self.enabled:
            return x
        # eps = 1e-4 floors the std at 0.01: a dimension that was (nearly) constant so far does
        # not explode into huge inputs the first time it moves
        return (x - self.mean) * torch.rsqrt(self.var + self.eps)

    normalize = forward

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}, enabled={self.enabled}"


class PendingMoments:
    """Sample count, mean and population variance (float64) of batches not yet folded into a
    RunningNormalizer: each data-parallel learner accumulates its own, then every rank folds
    every rank's in rank order (fastsac.learner.distributed.LearnerGroup.sync_normalizers)."""

    def __init__(self, dim: int, device: torch.device):
        self.dim, self.device = dim, device
        self.reset()

    @torch.no_grad()
    def add(self, n: int, batch_mean: Tensor, batch_var: Tensor) -> None:
        self.mean, self.var, self.count = chan_merge(self.count, self.mean, self.var, n, batch_mean, batch_var)

    def packed(self) -> Tensor:
        """[1 + 2 * dim] float64: count, mean, var (what sync_normalizers all-gathers)."""
        count = torch.tensor([self.count], dtype=torch.float64, device=self.device)
        return torch.cat([count, self.mean, self.var])

    def reset(self) -> None:
        # the count is a Python float (exact up to 2^53 samples): reading it never syncs a device
        self.count = 0.0
        self.mean = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
        self.var = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
