"""Data-parallel learners: one torch.distributed process group over every learner of the job.

Every learner trains on its own replay buffer (its own collectors' transitions, which never
leave the learner) and all of them keep identical networks: torch.distributed moves only

  * rank 0's complete agent state, once after build + restore (broadcast_agent);
  * gradients: one flat all-reduce (sum / world) after each backward of an update: critic,
    log_alpha, then the actor on actor steps (install -> FastSAC.grad_sync);
  * normalizer statistics: every rank's pending (count, mean, var) since the last sync, all
    gathered and folded in rank order on every rank (sync_normalizers);
  * small float64 counters (exchange, gather).

Engine: torch.distributed itself: rank 0 hosts a TCPStore at master_addr:master_port, the
process group (NCCL for CUDA learners, gloo for CPU ones) rendezvous through it, and every
collective is bounded by distributed.timeout_s (the process group's timeout). Two planes:
gradients go over the default group (NCCL on CUDA), everything else (the agent broadcast,
normalizers, counters, stop flags) over a gloo group of its own on host tensors. NCCL returns
before a collective completed, so its errors surface late or as a watchdog abort; gloo's fail
in the call, and the control plane runs once per iteration: a dead peer is a DistributedError
naming its rank there. A liveness beacon thread beats a key in the same store every
BEAT_INTERVAL_S; when a collective fails, the beats name the rank that died (gloo notices a
killed peer's closed connection at once, a hung one after timeout_s). With NCCL the beacon also
aborts the gradient plane once a peer has been silent for ABORT_AFTER_S: a gradient all-reduce
that peer never joins would otherwise hold this GPU (and every host wait on it) until the
watchdog kills the process. Only imported when the job has more than one learner.
"""
from __future__ import annotations

import datetime
import io
import json
import re
import threading
import time
import zlib
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from fastsac.errors import ConfigError
from fastsac.learner.group_settings import differences, shared_settings
from fastsac.machine.ranks import global_rank, node_of, world_size

if TYPE_CHECKING:
    from fastsac.algo.fastsac import FastSAC

__all__ = ["DistributedError", "LearnerGroup", "global_rank", "world_size"]

BEAT_INTERVAL_S = 0.5      # each rank's beacon writes its beat key this often
STALE_AFTER_S = 2.0        # a beat unchanged for this long (4 beats) names its rank as stopped
BEACON_STORE_TIMEOUT_S = 5.0  # the beacon's own store client: a dead store fails its ops within this
READ_WAIT_S = 10.0         # rank 0 keeps the store up this long for the others to read the settings
CLOSE_WAIT_S = 30.0        # close(): how long a rank waits for the others to reach each shutdown step
# NCCL: a peer whose beat is unchanged this long is dead, frozen or cut off (its beacon thread beats
# whatever its main thread does): abort the gradient plane so this rank's GPU work and host are freed
ABORT_AFTER_S = 10.0
SETTLE_WAIT_S = 5.0        # settle(): how long the GPU may take to finish the work queued before a failure


# The flat all-gather: torch 2.13 renamed all_gather_into_tensor to all_gather_single and warns on
# the old name (once per process, into every learner log); torch >= 2.2 is supported, so take
# whichever this torch has.
_ALL_GATHER_FLAT = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class DistributedError(RuntimeError):
    """A learner-group failure; the message names the failed rank(s) and what failed, ready to log."""


def resolve_backend(cfg, device: torch.device) -> str:
    backend = cfg.distributed.backend
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise DistributedError(f"distributed.backend=nccl needs CUDA learners, this learner's device is {device}; "
                               "use backend gloo or auto")
    return backend


def _beat_key(rank: int) -> str:
    return f"fastsac/beat/{rank}"


def _settings_key(rank: int) -> str:
    return f"fastsac/settings/{rank}"


def _settings_read_key(rank: int) -> str:
    return f"fastsac/settings_read/{rank}"


def _shutdown_key(step: str, rank: int) -> str:
    return f"fastsac/{step}/{rank}"


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of a (torch) error, without gloo's source location and advice."""
    text = str(exc).strip().splitlines()
    line = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text[0] if text else "")
    line = line.split(" This is typically caused by")[0]
    return f"{type(exc).__name__}: {line[:limit]}"


class _Beacon:
    """Beats this rank's key and watches everyone else's, through its own store client.

    Staleness is judged on this machine's monotonic clock (when did I last see rank r's beat
    change), never by comparing clocks of different machines."""

    def __init__(self, host: str, port: int, rank: int, world: int):
        self.rank, self.world = rank, world
        self.client = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=BEACON_STORE_TIMEOUT_S))
        self.others = [r for r in range(world) if r != rank]
        now = time.monotonic()
        self.lock = threading.Lock()
        self.seen: dict[int, bytes] = {}
        self.changed = {r: now for r in self.others}
        self.last_ok = now
        self.store_error: str | None = None
        self.on_silent: Callable[[int], None] | None = None   # called once with a rank silent ABORT_AFTER_S
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, name=f"learner-beacon-{rank}", daemon=True)
        self.thread.start()

    def run(self) -> None:
        beat, keys = 0, [_beat_key(r) for r in self.others]
        while True:
            beat += 1
            try:
                self.client.set(_beat_key(self.rank), str(beat))
                values = self.client.multi_get(keys) if keys else []
            except Exception as exc:  # noqa: BLE001 - any store failure: the store (rank 0) is gone
                with self.lock:
                    self.store_error = _first_line(exc)
                return
            now = time.monotonic()
            with self.lock:
                self.last_ok = now
                for r, v in zip(self.others, values):
                    if self.seen.get(r) != v:
                        self.seen[r], self.changed[r] = v, now
                silent = [r for r, t in self.changed.items() if now - t > ABORT_AFTER_S]
                hook = self.on_silent if silent else None
                if hook is not None:
                    self.on_silent = None
            if hook is not None:
                hook(silent[0])
            if self.stop_event.wait(BEAT_INTERVAL_S):
                return

    def verdict(self) -> tuple[str | None, list[tuple[int, float]]]:
        """(store problem or None, [(rank, seconds since its beat last changed)] of stale ranks)."""
        now = time.monotonic()
        with self.lock:
            if self.store_error is None and now - self.last_ok > STALE_AFTER_S:
                store = f"no answer for {now - self.last_ok:.1f} s"
            else:
                store = self.store_error
            stale = [(r, now - t) for r, t in self.changed.items() if now - t > STALE_AFTER_S]
        return store, stale

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=BEACON_STORE_TIMEOUT_S + 1.0)


def _check_same_settings(cfg, store, rank: int, world: int, timeout: datetime.timedelta) -> None:
    """Every rank compares every other rank's shared settings with its own (group_settings);
    ConfigError (exit 2 on every rank) naming the differing keys and both values. Rank 0 hosts
    the store, so it leaves only after every rank read what it needed (else the others would
    see a vanished store, and name rank 0 as the failure instead of the settings)."""
    store.set(_settings_key(rank), json.dumps(shared_settings(cfg), sort_keys=True, default=str))
    try:
        store.wait([_settings_key(r) for r in range(world)], timeout)
    except RuntimeError as exc:
        raise DistributedError(f"learner rank {rank}: not every rank published its settings within "
                               f"distributed.timeout_s={cfg.distributed.timeout_s:g} s ({_first_line(exc)})") from None
    mine = json.loads(json.dumps(shared_settings(cfg), default=str))
    lines = []
    for r in range(world):
        if r == rank:
            continue
        for key, here, there in differences(mine, json.loads(store.get(_settings_key(r)))):
            lines.append(f"{key}: {here!r} here, {there!r} on learner rank {r} (node_rank {node_of(cfg, r)})")
    store.set(_settings_read_key(rank), "1")
    if rank == 0:
        try:
            store.wait([_settings_read_key(r) for r in range(world)], datetime.timedelta(seconds=READ_WAIT_S))
        except RuntimeError:
            pass                       # a rank that died meanwhile: it reads nothing anyway
    if lines:
        raise ConfigError(f"learner rank {rank} (node_rank {node_of(cfg, rank)}): the machines of this job run "
                          f"different settings, and learners would average gradients of different objectives: "
                          f"{'; '.join(lines)}. Give every machine the same config (only "
                          "job_name, run_dir, resume, devices, placement and supervision keys may differ)")


class LearnerGroup:
    """This learner's membership of the job's learner process group (see the module doc)."""

    def __init__(self, cfg, rank: int, world: int, backend: str, device: torch.device, store, beacon: _Beacon,
                 control=None):
        self.cfg, self.rank, self.world_size, self.backend = cfg, rank, world, backend
        self.is_root = rank == 0
        self.device = torch.device(device)
        # gradients: NCCL reduces tensors on this learner's GPU, gloo host tensors; the control
        # plane (control, a gloo group; None = the default group) always host tensors
        self.comm_device = self.device if backend == "nccl" else torch.device("cpu")
        self.control = control
        self._gradients_aborted: str | None = None
        self.where = f"{cfg.distributed.master_addr}:{cfg.distributed.master_port}"
        self._store, self._beacon = store, beacon
        self._broken: str | None = None
        self._closed = False
        self._normalizers: list = []

    # ------------------------------------------------------------------ joining
    @classmethod
    def join(cls, cfg, local_index: int, device: torch.device, log: Callable[[str], None] = print) -> "LearnerGroup":
        d = cfg.distributed
        world, rank = world_size(cfg), global_rank(cfg, local_index)
        device = torch.device(device)
        backend = resolve_backend(cfg, device)
        timeout = datetime.timedelta(seconds=d.timeout_s)
        where = f"{d.master_addr}:{d.master_port}"
        try:
            # rank 0 hosts the store in-process; the others connect, retrying until timeout_s
            store = dist.TCPStore(d.master_addr, d.master_port, world, rank == 0, timeout, wait_for_workers=False)
        except RuntimeError as exc:
            if rank == 0:
                raise DistributedError(f"learner rank 0 cannot host the rendezvous at {where} "
                                       f"(distributed.master_addr / master_port): {_first_line(exc)}") from None
            raise DistributedError(f"learner rank {rank} (node_rank {node_of(cfg, rank)}): nobody answered at {where} "
                                   f"within distributed.timeout_s={d.timeout_s:g} s; is learner rank 0 (node_rank 0) "
                                   f"running, and are master_addr / master_port right? ({_first_line(exc)})") from None
        store.set(_beat_key(rank), "0")
        try:
            # every rank announced itself: the beacon can read everyone's key from its first beat,
            # and a missing rank is named here instead of as an anonymous init timeout (NCCL inits lazily)
            store.wait([_beat_key(r) for r in range(world)], timeout)
        except RuntimeError:
            missing = [r for r in range(world) if not store.check([_beat_key(r)])]
            who = ", ".join(f"{r} (node_rank {node_of(cfg, r)})" for r in missing) or "?"
            raise DistributedError(f"learner rank(s) {who} did not join the learner group at {where} within "
                                   f"distributed.timeout_s={d.timeout_s:g} s") from None
        _check_same_settings(cfg, store, rank, world, timeout)
        if device.type == "cuda" and device.index is None:   # the plan gives cuda:K; torch refuses 'cuda' here
            raise DistributedError(f"learner rank {rank}: device {device} has no index; expected cuda:K")
        # (this process made its GPU current first thing: fastsac.process.torch_runtime.open_device)
        try:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout,
                                    device_id=device if backend == "nccl" else None)
            # the control plane: gloo, whose collectives fail in the call when a peer is gone
            control = dist.new_group(backend="gloo", timeout=timeout)
        except RuntimeError as exc:
            raise DistributedError(f"learner rank {rank}: init_process_group({backend}) over {where} failed: "
                                   f"{_first_line(exc)}") from None
        try:
            beacon = _Beacon(d.master_addr, d.master_port, rank, world)
        except RuntimeError as exc:
            dist.destroy_process_group()
            raise DistributedError(f"learner rank {rank}: the liveness beacon cannot reach the rendezvous at {where}: "
                                   f"{_first_line(exc)}") from None
        log(f"learner group: rank {rank} of {world} (node_rank {node_of(cfg, rank)}), backend {backend} for "
            f"gradients, gloo for control, device {device}, rendezvous {where}")
        group = cls(cfg, rank, world, backend, device, store, beacon, control)
        if backend == "nccl":
            beacon.on_silent = group.abort_gradients
        return group

    # ------------------------------------------------------------------ failures
    def _who(self, rank: int) -> str:
        return f"learner rank {rank} (node_rank {node_of(self.cfg, rank)})"

    def describe_failure(self, exc: BaseException) -> str:
        """Which rank(s) failed, from the beacon: waits until a beat is stale (up to STALE_AFTER_S
        plus a few beats: a rank killed just now beat moments ago)."""
        deadline = time.monotonic() + STALE_AFTER_S + 3 * BEAT_INTERVAL_S
        while True:
            store, stale = self._beacon.verdict()
            if store or stale or time.monotonic() >= deadline:
                break
            time.sleep(BEAT_INTERVAL_S / 5)
        cause = _first_line(exc)
        if store and self.rank != 0:
            return (f"{self._who(0)} stopped answering: its rendezvous store at {self.where} is unreachable "
                    f"({store}): {cause}")
        if stale:
            ranks = ", ".join(f"{r}" for r, _ in stale)
            nodes = ", ".join(sorted({str(node_of(self.cfg, r)) for r, _ in stale}))
            ago = ", ".join(f"{s:.1f}" for _, s in stale)
            return (f"learner rank(s) {ranks} (node_rank {nodes}) stopped answering (last beat {ago} s ago): {cause}")
        if store:
            return f"learner rank 0 (this process): the rendezvous store failed ({store}): {cause}"
        # nobody died: a rank that is alive but does not join within timeout_s (hung, or stuck in
        # other work) ends here with a timeout as the cause; so does a local error
        return (f"every learner rank still beats (none died); failed on learner rank {self.rank} "
                f"(node_rank {node_of(self.cfg, self.rank)}): {cause}")

    def _run(self, what: str, fn: Callable[[], object]):
        """One collective, turned into a DistributedError naming the failed rank if it fails.
        A failed group stays failed: later collectives raise the same error at once."""
        if self._broken is not None:
            raise DistributedError(self._broken)
        if self._closed:
            raise DistributedError(f"{what}: the learner group of rank {self.rank} is closed")
        try:
            return fn()
        except RuntimeError as exc:   # torch's DistBackendError / DistNetworkError / gloo errors
            self._broken = f"{what}: {self.describe_failure(exc)}"
            raise DistributedError(self._broken) from exc

    def _all_reduce_sum(self, t: Tensor, what: str) -> Tensor:
        buf = t if t.device == self.comm_device else t.to(self.comm_device)
        self._run(what, lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM))
        if buf is not t:
            t.copy_(buf)
        return t

    def _all_gather(self, t: Tensor, what: str) -> Tensor:
        """[world, *t.shape]: row r is rank r's t (the control plane: host tensors, gloo)."""
        t = t.to("cpu").contiguous()
        # the flat [world * numel] output form: gloo accepts only that one
        out = torch.empty(self.world_size * t.numel(), dtype=t.dtype)
        self._run(what, lambda: _ALL_GATHER_FLAT(out, t, group=self.control))
        return out.view(self.world_size, *t.shape)

    # ------------------------------------------------------------------ the gradient plane after a failure
    def abort_gradients(self, silent_rank: int) -> None:
        """NCCL: a peer went silent (the beacon's thread calls this): abort the gradient plane, so a
        gradient all-reduce it will never join stops holding this GPU and every host wait on it.
        The weights after such an all-reduce are not the job's: settle() reports it."""
        self._abort(f"a gradient all-reduce was cut off: {self._who(silent_rank)} was silent for {ABORT_AFTER_S:g} s")

    def _abort(self, reason: str) -> None:
        self._gradients_aborted = reason
        try:
            dist.distributed_c10d._abort_process_group()
        except (RuntimeError, AttributeError, ValueError):
            pass   # nothing left to abort (a group already torn down, or a torch without it)

    def settle(self, wait_s: float = SETTLE_WAIT_S) -> str | None:
        """After a failure: None when every gradient all-reduce this rank queued completed (so its
        weights are the job's and a final checkpoint is sound), else why not. gloo's collectives
        complete in the call; NCCL's may still wait on the GPU for a dead peer: an event after
        them either completes within wait_s, or the plane is aborted and the weights are not
        trusted."""
        if self.backend != "nccl" or self._gradients_aborted:
            return self._gradients_aborted
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        deadline = time.monotonic() + wait_s
        while not done.query():
            if time.monotonic() >= deadline:
                self._abort(f"the GPU's queued gradient all-reduces did not complete within {wait_s:g} s of "
                            "the failure")
                return self._gradients_aborted
            time.sleep(0.01)
        return None

    # ------------------------------------------------------------------ the agent
    def broadcast_agent(self, agent: "FastSAC") -> None:
        """Every rank ends with rank 0's complete agent state (networks, targets, normalizers,
        log_alpha, optimizer states, update counter). A serialized state dict, not per-tensor
        broadcasts: after a resume rank 0 has optimizer state the others do not have yet."""
        if self.is_root:
            buf = io.BytesIO()
            torch.save(agent.state_dict(), buf)
            payload = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self._run("broadcast of rank 0's agent state (size)", lambda: dist.broadcast(size, src=0, group=self.control))
        if not self.is_root:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._run("broadcast of rank 0's agent state", lambda: dist.broadcast(payload, src=0, group=self.control))
        if self.is_root:
            return
        state = torch.load(io.BytesIO(payload.cpu().numpy().tobytes()), map_location=agent.device, weights_only=True)
        try:
            agent.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError) as exc:
            raise DistributedError(f"{self._who(self.rank)}: rank 0's agent state does not fit this learner's "
                                   f"agent (same config on every machine?): {_first_line(exc)}") from None

    def install(self, agent: "FastSAC") -> None:
        """Gradient averaging inside every agent.update() and deferred normalizer updates."""
        agent.grad_sync = self._average_grads
        self._normalizers = [agent.obs_normalizer, agent.critic_obs_normalizer]
        for n in self._normalizers:
            n.defer()

    def _average_grads(self, params: list[Tensor]) -> None:
        """One flat all-reduce, sum / world, of the gradients of `params` (None counts as zero).
        Every param leaves with a gradient: a view into the reduced buffer (no copy back)."""
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in params])
        self._all_reduce_sum(flat, f"gradient all-reduce ({flat.numel()} values)")
        flat.div_(self.world_size)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p)

    def sync_normalizers(self, agent: "FastSAC") -> None:
        """Fold every rank's pending normalizer statistics into every rank's normalizers, in rank
        order, with the parallel-variance merge: all ranks end bit-identical (same start, same
        inputs, same order). Still a collective when nothing is pending anywhere."""
        norms = [agent.obs_normalizer, agent.critic_obs_normalizer]
        if norms != self._normalizers or any(n.pending is None for n in norms):
            raise RuntimeError("LearnerGroup.sync_normalizers before install(agent) on this agent")
        local = torch.cat([n.pending.packed() for n in norms])
        everyone = self._all_gather(local, "normalizer statistics all-gather")
        sizes = [1 + 2 * n.dim for n in norms]
        starts = [sum(sizes[:i]) for i in range(len(norms))]
        counts = everyone[:, starts].tolist()         # one host sync for all ranks' counts
        everyone = everyone.to(agent.device)
        for r in range(self.world_size):
            for i, n in enumerate(norms):
                if counts[r][i]:
                    s, d = starts[i], n.dim
                    n.merge(counts[r][i], everyone[r, s + 1:s + 1 + d], everyone[r, s + 1 + d:s + 1 + 2 * d])
        for n in norms:
            n.pending.reset()

    # ------------------------------------------------------------------ small values
    def exchange(self, sums: dict[str, float], maxes: dict[str, float] | None = None
                 ) -> tuple[dict[str, float], dict[str, float]]:
        """Element-wise sum of `sums` and max of `maxes` over ranks: one all-gather (float64),
        summed in rank order on every rank, so every rank gets the same bits. Every rank must
        pass the same keys in the same order (checked)."""
        maxes = maxes or {}
        keys = list(sums) + ["|"] + list(maxes)
        tag = float(zlib.crc32("\0".join(keys).encode()))
        local = torch.tensor([tag, *map(float, sums.values()), *map(float, maxes.values())], dtype=torch.float64)
        rows = self._all_gather(local, "exchange of progress counters").tolist()
        bad = [r for r, row in enumerate(rows) if row[0] != tag]
        if bad:
            raise DistributedError(f"exchange: learner rank(s) {bad} passed other keys than rank {self.rank} "
                                   f"(sums {list(sums)}, maxes {list(maxes)})")
        n = len(sums)
        out_sums = {k: sum(row[1 + i] for row in rows) for i, k in enumerate(sums)}
        out_maxes = {k: max(row[1 + n + i] for row in rows) for i, k in enumerate(maxes)}
        return out_sums, out_maxes

    def gather(self, value: float) -> list[float]:
        """Every rank's value, index = rank."""
        return self._all_gather(torch.tensor([float(value)], dtype=torch.float64), "gather").reshape(-1).tolist()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stop the beacon and destroy the process group, in step with the other ranks; idempotent.

        Two store barriers, each bounded by CLOSE_WAIT_S (a rank that died or hangs is not waited
        for beyond that): no rank tears down its gloo pairs while a peer may still be inside the
        last collective ("left"), and rank 0, which hosts the store in-process, keeps it up until
        every rank has destroyed its process group ("closed"). Without them a fast rank 0 could
        abort in the C++ teardown (std::terminate) under a slow peer."""
        if self._closed:
            return
        self._closed = True
        self._beacon.stop()
        self._store_barrier("left", wait=self._broken is None)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except RuntimeError:
                pass   # a broken group: nothing left to tear down cleanly
        self._store_barrier("closed", wait=self.is_root and self._broken is None)
        self._store = None

    def _store_barrier(self, step: str, wait: bool) -> None:
        """Announce this rank reached `step`; if `wait`, wait (bounded) until every rank has.
        Best effort: a vanished store or a missing rank ends the wait, never the shutdown."""
        try:
            self._store.set(_shutdown_key(step, self.rank), "1")
            if wait:
                self._store.wait([_shutdown_key(step, r) for r in range(self.world_size)],
                                 datetime.timedelta(seconds=CLOSE_WAIT_S))
        except RuntimeError:
            pass
