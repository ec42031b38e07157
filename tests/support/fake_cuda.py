"""A recorded fake `torch.cuda` for a CPU-only torch: which device is made current, on which
device's stream every event is recorded, which copies are non-blocking, what waits.

`FakeCuda(monkeypatch, count=2).install()` replaces the torch.cuda functions fastsac calls (and the
learner's buffer allocation, so "pinned" and "device" buffers are plain CPU tensors whose copies
run at once). `calls` lists ("set_device", k), ("record", k), ("synchronize", k), ... in order;
k is the device index the call belongs to. Events complete when `complete()` is called (or at
once with auto_complete), so a test sees what happens before a copy landed.
"""
from __future__ import annotations

import itertools

import torch


def _index(device, current: int) -> int:
    if device is None:
        return current
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return current if d.index is None else d.index


class FakeStream:
    def __init__(self, index: int):
        self.device_index = index
        self.device = torch.device("cuda", index)


class FakeEvent:
    _ids = itertools.count()

    def __init__(self, cuda: "FakeCuda", enable_timing: bool = False, **_):
        self.cuda, self.enable_timing, self.id = cuda, enable_timing, next(self._ids)
        self.device_index: int | None = None
        self.recorded = self.completed = False
        self.t = 0.0

    def record(self, stream: FakeStream | None = None) -> None:
        self.device_index = self.cuda.current if stream is None else stream.device_index
        self.recorded, self.completed = True, self.cuda.auto_complete
        self.t = self.cuda.clock
        self.cuda.clock += 0.25
        self.cuda.events.append(self)
        self.cuda.calls.append(("record", self.device_index))

    def query(self) -> bool:
        self.cuda.calls.append(("query", self.device_index))
        return self.completed

    def synchronize(self) -> None:
        self.cuda.calls.append(("event_synchronize", self.device_index))
        self.completed = True

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.enable_timing and end.enable_timing, "elapsed_time needs enable_timing=True events"
        return (end.t - self.t) * 1e3


class FakeCuda:
    def __init__(self, monkeypatch, count: int = 2, available: bool = True, auto_complete: bool = False):
        self.mp, self.count, self.available, self.auto_complete = monkeypatch, count, available, auto_complete
        self.current = 0
        self.calls: list[tuple] = []
        self.events: list[FakeEvent] = []
        self.copies: list[dict] = []
        self.clock = 0.0

    def install(self) -> "FakeCuda":
        c, mp = torch.cuda, self.mp
        mp.setattr(c, "is_available", lambda: self.available)
        mp.setattr(c, "device_count", lambda: self.count if self.available else 0)
        mp.setattr(c, "set_device", self.set_device)
        mp.setattr(c, "current_device", lambda: self.current)
        mp.setattr(c, "current_stream", lambda device=None: self._call("current_stream",
                                                                       FakeStream(_index(device, self.current))))
        mp.setattr(c, "Stream", lambda device=None, **_: FakeStream(_index(device, self.current)))
        mp.setattr(c, "Event", lambda **kw: FakeEvent(self, **kw))
        mp.setattr(c, "synchronize", lambda device=None: self.calls.append(("synchronize",
                                                                            _index(device, self.current))))
        mp.setattr(c, "get_device_name", lambda device=None: "NVIDIA Fake GPU")
        mp.setattr(c, "get_device_capability", lambda device=None: (9, 0))
        mp.setattr(c, "mem_get_info", lambda device=None: (40 << 30, 80 << 30))
        from fastsac.learner import gpu_sync, staging
        for mod in (staging, gpu_sync):
            mp.setattr(mod, "allocate", self.allocate)
        return self

    def _call(self, name, value):
        self.calls.append((name, value.device_index))
        return value

    def set_device(self, device) -> None:
        index = _index(device, self.current)
        if isinstance(device, (str, torch.device)) and torch.device(device).index is None:
            raise ValueError(f"Expected a cuda device with a specified index or an integer, but got:{device}")
        self.current = index
        self.calls.append(("set_device", index))

    def allocate(self, nbytes: int, device, twin: bool = True):
        """Plain CPU tensors stand in for the pinned buffer and its device twin."""
        self.calls.append(("allocate", _index(device, self.current), nbytes))
        host = torch.zeros(nbytes, dtype=torch.uint8)
        return host, (torch.zeros(nbytes, dtype=torch.uint8) if twin else None)

    def complete(self) -> None:
        for e in self.events:
            e.completed = e.completed or e.recorded

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]
