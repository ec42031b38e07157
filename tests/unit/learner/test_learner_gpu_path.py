"""The learner's CUDA path on a CPU-only torch, with a recorded fake torch.cuda
(tests/support/fake_cuda.py): every event belongs to the learner's own GPU (cuda:1 here, with
GPU 0 current, the case that raced), the staging buffer is not rewritten before its copy landed,
update chunks are timed with events (no synchronize), and the weight publish's device->host copy
is non-blocking: the snapshots are written once its event completed."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from support.fake_cuda import FakeCuda

from fastsac import shm_layout as L
from fastsac.learner.gpu_sync import ChunkTimer, WeightCopy
from fastsac.learner.loop import Learner
from fastsac.learner.staging import IngestStaging

GPU1 = torch.device("cuda", 1)


@pytest.fixture
def cuda(monkeypatch):
    return FakeCuda(monkeypatch, count=2).install()


def test_staging_records_its_copy_on_the_learners_gpu_and_waits_before_rewriting(cuda):
    spec = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=0, act_dim=2, capacity=4)
    st = IngestStaging([spec], 2, GPU1)
    assert cuda.current == 0                      # nobody made cuda:1 current: the event must still be cuda:1's
    st.host_np[:64] = np.arange(64, dtype=np.uint8)
    st.used = 64
    st.send()
    assert ("record", 1) in cuda.calls and ("record", 0) not in cuda.calls
    assert torch.equal(st.dev[:64], st.host[:64])
    cuda.calls.clear()
    st.begin()                                    # the next round would overwrite the pinned bytes
    assert cuda.calls[0] == ("event_synchronize", 1) and st.used == 0


def test_chunk_timer_uses_timing_events_on_the_gpu_and_never_synchronizes(cuda):
    timer = ChunkTimer(GPU1)
    token = timer.start()
    assert timer.end(token, 8) is None            # unknown until the GPU got there
    assert all(e.enable_timing and e.device_index == 1 for e in cuda.events)
    assert timer.collect() == 0.0                 # not completed: nothing waits
    cuda.complete()
    assert timer.collect() == pytest.approx(0.25)
    assert "synchronize" not in cuda.names()


def test_weight_copy_is_non_blocking_into_pinned_memory_with_an_event(cuda):
    wc = WeightCopy(4, GPU1)
    assert ("allocate", 1, 16) in cuda.calls      # pinned host vector only, no device twin
    wc.start(torch.arange(4, dtype=torch.float32))
    assert ("record", 1) in cuda.calls and wc.pending and not wc.ready()
    cuda.complete()
    assert wc.ready() and wc.take().tolist() == [0.0, 1.0, 2.0, 3.0] and not wc.pending


def _learner(device):
    """A Learner with only what update() and publish() use."""
    lr = object.__new__(Learner)
    snaps = [SimpleNamespace(repairs=0, published=[], publish=None) for _ in range(2)]
    for s in snaps:
        s.publish = lambda flat, s=s: s.published.append(flat.copy())
    trained = []
    lr.agent = SimpleNamespace(train=lambda buf, n: trained.append(n) or {}, policy_flat=lambda: torch.full(
        (4,), float(len(trained))), num_updates_done=0, compiled=False)
    lr.ao = SimpleNamespace(weight_publish_interval=2)
    lr.buffer, lr.device, lr.threads = None, device, None
    lr.updates_since_publish, lr.compile_updates_left, lr.weight_version, lr.env_steps = 0, 0, 0, 0
    lr.telemetry = SimpleNamespace(learn_time=0.0, last_train=None)
    lr.ctl = SimpleNamespace(learner={}, ingest=lambda cid: {})
    lr.feeds = [SimpleNamespace(cid=i, snapshot=s) for i, s in enumerate(snaps)]
    lr.evaluation = SimpleNamespace(on_publish=lambda flat, steps, version: None)
    lr.chunk_timer, lr.weights, lr.publish_to = ChunkTimer(device), WeightCopy(4, device), None
    return lr, snaps, trained


def test_updates_and_publish_on_cuda_leave_the_host_free(cuda):
    lr, snaps, trained = _learner(GPU1)
    lr.update(3)                                  # chunks of 2 and 1; a publish after the first
    assert trained == [2, 1] and "synchronize" not in cuda.names()
    assert snaps[0].published == [] and lr.publish_to is not None   # the copy is in flight
    cuda.complete()
    lr.deliver()
    lr.update(0)
    assert [p.tolist() for p in snaps[0].published] == [[1.0] * 4] and lr.weight_version == 1
    assert lr.ctl.learner["weight_version"] == 1
    assert lr.telemetry.learn_time == pytest.approx(0.5)   # both chunks, from their events
    assert {e.device_index for e in cuda.events} == {1}


def test_publish_on_the_cpu_is_delivered_at_once():
    lr, snaps, trained = _learner(torch.device("cpu"))
    lr.update(2)
    assert [p.tolist() for p in snaps[1].published] == [[1.0] * 4] and lr.weight_version == 1
    assert lr.telemetry.learn_time > 0.0


@pytest.mark.parametrize("reason", [None, "BackendCompilerFailed: inductor: no Triton for this GPU"])
def test_the_update_path_that_ran_is_logged_and_a_scalar(cuda, reason, capsys):
    """torch.compile falling back to eager anywhere in the first step is loud: a console line and
    train/update_compiled 0 (the agent says why in compile_fallback_reason)."""
    from fastsac import shm_layout as shm
    lr, _, _ = _learner(GPU1)
    lr.agent.compiled, lr.agent.compile_fallback_reason = True, reason
    lr.compile_updates_left, lr.compile_t0 = 2, 0.0
    lr.ctl.learner["state"] = int(shm.ProcState.RUNNING)
    lr.update(2)
    out = capsys.readouterr().out
    assert lr.ctl.learner["state"] == int(shm.ProcState.RUNNING)
    assert lr.telemetry.last_train["update_compiled"] == (1.0 if reason is None else 0.0)
    if reason is None:
        assert "update compiled in" in out and "EAGER" not in out
    else:
        assert "warning: torch.compile failed after" in out and f"the update runs EAGER (train/update_compiled 0): " \
               f"{reason}" in out
