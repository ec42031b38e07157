"""Test-only hooks for tests/process/launch/test_faults.py, active only with their environment variables set.

With this directory on PYTHONPATH every Python process of a job imports it at start-up
(`site` imports `sitecustomize`). When the learner then imports fastsac.learner.loop:

* FASTSAC_TEST_SLOW_COMPILE_S: FastSAC is patched to behave like `algo.compile: true` on
  CUDA: `agent.compiled` is True and the first critic half blocks for that many seconds,
  standing in for the one-off torch.compile that a CPU run never does.
* FASTSAC_TEST_SLOW_SAVE_S: every checkpoint save first blocks for that many seconds,
  standing in for large networks written to a slow disk.
* FASTSAC_TEST_SAVE_FAIL: checkpoint writes fail with an OSError, in the learner and in the
  synchronous trainer (see the block at the end).

Nothing else changes.
"""
import os

_COMPILE_DELAY = float(os.environ.get("FASTSAC_TEST_SLOW_COMPILE_S") or 0)
_SAVE_DELAY = float(os.environ.get("FASTSAC_TEST_SLOW_SAVE_S") or 0)

if _COMPILE_DELAY > 0 or _SAVE_DELAY > 0:
    import importlib.abc
    import sys
    import time

    def _patch_slow_compile() -> None:
        from fastsac.algo import fastsac as algo

        original_init = algo.FastSAC.__init__

        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self.compiled = True
            # each twin's half of the critic step: what the update calls first on every path (the
            # CPU path by hand never calls the critic loss that torch.compile would wrap on CUDA)
            critic_net_grads, first = self._critic_net_grads, [True]

            def slow_first_call(*a, **kw):
                if first:
                    first.clear()
                    time.sleep(_COMPILE_DELAY)
                return critic_net_grads(*a, **kw)

            self._critic_net_grads = slow_first_call

        algo.FastSAC.__init__ = __init__

    def _patch_slow_save() -> None:
        from fastsac.training import state as run_state
        original_save = run_state.save

        def slow_save(*args, **kwargs):
            time.sleep(_SAVE_DELAY)
            return original_save(*args, **kwargs)

        run_state.save = slow_save

    class _PatchOnLearnerImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "fastsac.learner.loop":
                sys.meta_path.remove(self)
                if _COMPILE_DELAY > 0:
                    _patch_slow_compile()
                if _SAVE_DELAY > 0:
                    _patch_slow_save()
            return None

    sys.meta_path.insert(0, _PatchOnLearnerImport())


# FASTSAC_TEST_SAVE_FAIL=<ERRNO>:<which> (for tests/process/run_dir/test_checkpoint_cli.py): checkpoint writes fail
# like a full or failing disk in the process that trains (the learner, or the launcher running the
# synchronous trainer). <which> is "all" or a comma list of 1-based save attempts ("1" = the first).
# A failing write puts 4 KiB of the file on disk first, then raises OSError(<ERRNO>), as write(2)
# does when the disk fills up mid-file.
_SAVE_FAIL = os.environ.get("FASTSAC_TEST_SAVE_FAIL") or ""

if _SAVE_FAIL:
    import errno as _errno
    import importlib.abc as _importlib_abc
    import sys as _sys

    def _patch_failing_save() -> None:
        import torch

        name, _, which = _SAVE_FAIL.partition(":")
        code = getattr(_errno, name)
        attempts = None if which in ("", "all") else {int(w) for w in which.split(",")}
        original, count = torch.save, [0]

        def failing_save(obj, f, *args, **kwargs):
            count[0] += 1
            if attempts is None or count[0] in attempts:
                if hasattr(f, "write"):
                    f.write(b"\0" * 4096)
                raise OSError(code, os.strerror(code))
            return original(obj, f, *args, **kwargs)

        torch.save = failing_save

    class _FailSavesOnTrainerImport(_importlib_abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name in ("fastsac.learner.loop", "fastsac.sync"):
                _sys.meta_path.remove(self)
                _patch_failing_save()
            return None

    _sys.meta_path.insert(0, _FailSavesOnTrainerImport())
