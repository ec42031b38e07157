"""RunningNormalizer: exact running mean/variance over many batches."""
from __future__ import annotations

import numpy as np
import torch

from fastsac.algo.normalizer import RunningNormalizer


def test_matches_numpy_over_batches_of_different_sizes():
    rng = np.random.default_rng(0)
    norm = RunningNormalizer(4)
    seen = []
    for n in (1, 7, 300, 2, 1024, 33):
        x = rng.normal(loc=[0.0, 5.0, -3.0, 100.0], scale=[1.0, 0.1, 10.0, 3.0], size=(n, 4)).astype(np.float32)
        norm.update(torch.from_numpy(x))
        seen.append(x)
        data = np.concatenate(seen).astype(np.float64)
        np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-4, atol=1e-6)
        assert float(norm.count) == len(data)
    x = torch.from_numpy(seen[-1])
    expected = (x - torch.from_numpy(data.mean(0)).float()) / torch.sqrt(torch.from_numpy(data.var(0)).float() + norm.eps)
    torch.testing.assert_close(norm(x), expected, rtol=1e-4, atol=1e-4)


def test_fresh_normalizer_is_near_identity_and_disabled_is_identity():
    x = torch.randn(10, 3)
    torch.testing.assert_close(RunningNormalizer(3)(x), x / (1 + 1e-4) ** 0.5)
    off = RunningNormalizer(3, enabled=False)
    off.update(x * 10 + 5)
    assert off(x) is x
    assert float(off.count) == 0 and torch.equal(off.mean, torch.zeros(3))


def test_state_dict_round_trip():
    a, b = RunningNormalizer(2), RunningNormalizer(2)
    a.update(torch.randn(50, 2) * 3)
    b.load_state_dict(a.state_dict())
    assert set(a.state_dict()) == {"mean", "var", "count"}
    a.update(torch.ones(5, 2)); b.update(torch.ones(5, 2))
    torch.testing.assert_close(a.mean, b.mean)
    torch.testing.assert_close(a.var, b.var)
