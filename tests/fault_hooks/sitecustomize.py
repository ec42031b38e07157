"""Test-only hook for tests/test_faults.py, active only with FASTSAC_TEST_SLOW_COMPILE_S set.

With this directory on PYTHONPATH every Python process of a job imports it at start-up
(`site` imports `sitecustomize`). When the learner then imports fastsac.learner_loop, FastSAC
is patched to behave like `algo.compile: true` on CUDA: `agent.compiled` is True and the first
critic-loss call blocks for FASTSAC_TEST_SLOW_COMPILE_S seconds, standing in for the one-off
torch.compile that a CPU run never does. Nothing else changes.
"""
import os

_DELAY = float(os.environ.get("FASTSAC_TEST_SLOW_COMPILE_S") or 0)

if _DELAY > 0:
    import importlib.abc
    import sys
    import time

    def _patch() -> None:
        from fastsac.algo import fastsac as algo

        original_init = algo.FastSAC.__init__

        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self.compiled = True
            critic_loss, first = self._critic_loss, [True]

            def slow_first_call(*a, **kw):
                if first:
                    first.clear()
                    time.sleep(_DELAY)
                return critic_loss(*a, **kw)

            self._critic_loss = slow_first_call

        algo.FastSAC.__init__ = __init__

    class _PatchOnLearnerImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "fastsac.learner_loop":
                sys.meta_path.remove(self)
                _patch()
            return None

    sys.meta_path.insert(0, _PatchOnLearnerImport())
