"""Data-parallel learners (fastsac.learner.distributed) on real processes: gloo on the CPU, a TCPStore
rendezvous on a free local port, two learner ranks.

Every multi-process test runs this file as a script (`python tests/process/learner/test_distributed_update_process.py
SCENARIO RANK WORLD PORT OUT_DIR`): each rank is its own interpreter, as in a real job. Every
process is bounded by a timeout and killed at teardown; results come back as files in tmp_path.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

if __name__ == "__main__":   # a rank runs this file as a script: tests/ on sys.path for support, as pytest puts it
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support.e2e_helpers import free_port
from support.learner_group import GROUP_TIMEOUT_S, group_config

from fastsac.algo.fastsac import FastSAC
from fastsac.algo.normalizer import RunningNormalizer
from fastsac.config import AlgoConfig

REPO = Path(__file__).resolve().parents[3]
WORKER_TIMEOUT_S = 120      # a whole scenario, startup included (a loaded 2-core machine is slow to import torch)
KILL_NOTICED_S = 15.0       # a killed rank is named within this (describe_failure waits ~3.5 s for a stale beat)

LOW, HIGH = np.array([-2.0, -1.0], np.float32), np.array([2.0, 3.0], np.float32)
OBS_DIM, CRITIC_OBS_DIM, ACT_DIM = 5, 3, 2
BATCH = 64
UPDATES = 3
SLOW_LEAVE_S = 2.0          # the "leave" scenario's late rank
TOL = 2e-5                  # float32 reduction-order noise; gradient averaging off moves params by ~lr = 1e-3


# ---------------------------------------------------------------------------- shared helpers
def make_agent(seed: int = 0, critic_obs_dim: int = 0) -> FastSAC:
    # policy_frequency 1: one update is a critic, an actor and an alpha step; max_grad_norm clips,
    # so averaging before clipping is checked too
    cfg = AlgoConfig(actor_hidden_dim=32, critic_hidden_dim=32, actor_num_layers=2, critic_num_layers=2,
                     num_atoms=21, v_min=-10.0, v_max=10.0, batch_size=BATCH, policy_frequency=1,
                     critic_lr=1e-3, actor_lr=1e-3, alpha_lr=1e-3, max_grad_norm=0.5)
    torch.manual_seed(seed)
    return FastSAC(OBS_DIM, critic_obs_dim, ACT_DIM, LOW, HIGH, cfg, torch.device("cpu"))


def fixed_batch(seed: int = 123) -> dict:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(BATCH, ACT_DIM, generator=g)
    return {"obs": torch.randn(BATCH, OBS_DIM, generator=g) * 3 + 1,
            "actions": torch.tensor(LOW) + u * torch.tensor(HIGH - LOW),
            "rewards": torch.randn(BATCH, generator=g),
            "next_obs": torch.randn(BATCH, OBS_DIM, generator=g) * 3 + 1,
            "bootstrap": (torch.rand(BATCH, generator=g) > 0.1).float(),
            "discount": torch.full((BATCH,), 0.9),
            "critic_obs": None, "next_critic_obs": None}


def supplied_noise(noises: list[torch.Tensor]):
    """Stand-in for torch.randn inside one update: Actor.sample draws its eps with torch.randn
    (critic loss first, then actor loss); here each draw is the next given tensor, so a rank
    working on rows [a, b) of the batch gets exactly rows [a, b) of the full batch's noise."""
    queue = list(noises)

    def randn(*size, generator=None, device=None, dtype=None, **_):
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
        eps = queue.pop(0)
        assert tuple(eps.shape) == shape, (eps.shape, shape)
        return eps.to(device=device or eps.device, dtype=dtype or eps.dtype).clone()

    return randn


def updates(rows: slice, group=None) -> dict[str, torch.Tensor]:
    """UPDATES updates of a fresh agent (seed 0), each on rows of its own fixed batch; the
    trained tensors after them. Several: Adam's first step is ~lr * sign(grad), blind to a
    gradient's size; the later ones are not (a missing average would go unseen after one)."""
    agent = make_agent()
    agent.target_entropy = split_entropy_target()
    if group is not None:
        group.install(agent)
    for i, full_noise in enumerate(update_noise()):
        batch = {k: (v[rows] if v is not None else None) for k, v in fixed_batch(seed=123 + i).items()}
        noise = [eps[rows] for eps in full_noise]
        with mock.patch.object(torch, "randn", supplied_noise(noise)):
            agent.update(batch)
    assert agent.num_updates_done == UPDATES
    return trained(agent)


def update_noise() -> list[list[torch.Tensor]]:
    """Per update, the full batch's eps for Actor.sample in the critic loss and in the actor loss."""
    g = torch.Generator().manual_seed(7)
    return [[torch.randn(BATCH, ACT_DIM, generator=g) for _ in range(2)] for _ in range(UPDATES)]


def split_entropy_target() -> float:
    """A target entropy that gives the two halves' alpha gradients opposite signs in the first
    update (and the whole batch a clearly non-zero one): alpha's Adam step is ~lr * sign(grad)
    whatever the gradient's size, so with the same sign everywhere a missing all-reduce of
    log_alpha's gradient would not show. With mean log-probs m0, m1 of the halves, target
    -(m0 + 3 m1) / 4 puts the whole batch at (m0 - m1) / 4 and the second half at (m1 - m0) / 4."""
    agent = make_agent()
    obs = fixed_batch(seed=123)["obs"]
    with torch.no_grad(), mock.patch.object(torch, "randn", supplied_noise([update_noise()[0][1]])):
        _, log_prob = agent.actor.sample(agent.obs_normalizer(obs))   # = the first actor step's log-probs
    m0, m1 = log_prob[:BATCH // 2].mean().item(), log_prob[BATCH // 2:].mean().item()
    assert abs(m0 - m1) > 0.05, (m0, m1)
    return -(m0 + 3 * m1) / 4


def trained(agent: FastSAC) -> dict[str, torch.Tensor]:
    out = {"log_alpha": agent.log_alpha.detach().clone()}
    for name in ("actor", "critic", "critic_target"):
        out.update({f"{name}.{k}": v.detach().clone() for k, v in getattr(agent, name).state_dict().items()})
    return out


def max_diff(a: dict, b: dict) -> tuple[float, str]:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max().item(), k) for k in a)


def digest(state) -> str:
    """sha256 over every tensor and value of a (nested) state dict, in key order."""
    h = hashlib.sha256()

    def walk(x, path):
        if isinstance(x, dict):
            for k in sorted(x, key=str):
                walk(x[k], f"{path}.{k}")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")
        elif isinstance(x, torch.Tensor):
            h.update(f"{path}:{x.dtype}:{tuple(x.shape)}".encode())
            h.update(x.detach().cpu().contiguous().numpy().tobytes())
        else:
            h.update(f"{path}={x!r}".encode())

    walk(state, "")
    return h.hexdigest()


def norm_data(rank: int, round_: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Different sizes, offsets and scales per rank and round: (obs, critic_obs) batches."""
    g = torch.Generator().manual_seed(1000 * rank + round_)
    out = []
    for i in range(3 + rank):
        n = 17 + 13 * rank + 5 * i
        out.append((torch.randn(n, OBS_DIM, generator=g) * (1 + rank) + 10 * rank - 3,
                    torch.randn(n, CRITIC_OBS_DIM, generator=g) * (0.5 + rank) + 100.0 * (rank + 1)))
    return out


# ---------------------------------------------------------------------------- worker side
def scenario_update(group, out: Path) -> None:
    half = BATCH // group.world_size
    rows = slice(group.rank * half, (group.rank + 1) * half)
    torch.save(updates(rows, group), out / f"rank{group.rank}.pt")


def scenario_normalizers(group, out: Path) -> None:
    agent = make_agent(critic_obs_dim=CRITIC_OBS_DIM)
    group.install(agent)
    group.sync_normalizers(agent)                      # nothing pending anywhere: still a collective
    for round_ in range(2):                            # pending is reset after a sync
        for obs, critic_obs in norm_data(group.rank, round_):
            agent.update_normalizers(obs, critic_obs)
        group.sync_normalizers(agent)
    sums, maxes = group.exchange({"transitions": 10.0 * (group.rank + 1), "updates": 0.5},
                                 {"stop": float(group.rank)})
    torch.save({"obs": agent.obs_normalizer.state_dict(), "critic_obs": agent.critic_obs_normalizer.state_dict(),
                "sums": sums, "maxes": maxes, "gather": group.gather(group.rank * 10 + 1)},
               out / f"rank{group.rank}.pt")


def scenario_broadcast(group, out: Path) -> None:
    if group.rank == 0:
        # a "resumed" rank 0: trained weights, normalizer statistics and optimizer state
        agent = make_agent(seed=0)
        agent.update_normalizers(torch.randn(50, OBS_DIM) * 2 + 1, None)
        for _ in range(2):
            agent.update(fixed_batch())
    else:
        agent = make_agent(seed=group.rank)            # other initial weights, empty optimizer state
        assert not agent.critic_optimizer.state
    before = digest(agent.state_dict())
    group.broadcast_agent(agent)
    (out / f"rank{group.rank}.json").write_text(json.dumps(
        {"before": before, "after": digest(agent.state_dict()), "num_updates": agent.num_updates_done}))


def scenario_kill(group, out: Path) -> None:
    group.gather(1.0)                                  # the group works
    (out / f"ready{group.rank}").touch()
    go = out / "go"
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    while not go.exists():                             # the victim waits here until it is killed
        if time.monotonic() > deadline:
            raise TimeoutError("no go file")
        time.sleep(0.05)
    from fastsac.learner.distributed import DistributedError
    t0 = time.monotonic()
    try:
        group.exchange({"transitions": 1.0}, {"stop": 0.0})
        result = {"raised": False}
    except DistributedError as exc:
        result = {"raised": True, "message": str(exc), "seconds": time.monotonic() - t0}
        t1 = time.monotonic()
        try:
            group.gather(0.0)
        except DistributedError as again:              # a failed group stays failed, at once
            result.update(again=str(again), again_seconds=time.monotonic() - t1)
    group.close()
    group.close()                                      # idempotent
    (out / f"result{group.rank}.json").write_text(json.dumps(result))


def scenario_hang(group, out: Path) -> None:
    group.gather(1.0)                                  # the group works
    if group.rank == 1:                                # alive and beating, but never joins the next collective
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        while not (out / "done").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    from fastsac.learner.distributed import DistributedError
    t0 = time.monotonic()
    try:
        group.gather(2.0)
        result = {"raised": False}
    except DistributedError as exc:
        result = {"raised": True, "message": str(exc), "seconds": time.monotonic() - t0}
    (out / "done").touch()
    (out / f"result{group.rank}.json").write_text(json.dumps(result))


def scenario_leave(group, out: Path) -> None:
    """Rank 1 is slow to leave after the last collective; its close times come back as files."""
    group.gather(1.0)
    if group.rank == 1:
        time.sleep(SLOW_LEAVE_S)
    (out / f"close_start{group.rank}").write_text(repr(time.time()))
    group.close()
    (out / f"close_end{group.rank}").write_text(repr(time.time()))


SCENARIOS = {"update": scenario_update, "normalizers": scenario_normalizers, "broadcast": scenario_broadcast,
             "kill": scenario_kill, "hang": scenario_hang, "leave": scenario_leave}


def worker_main(argv: list[str]) -> int:
    name, rank, world, port, out = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), Path(argv[4])
    timeout_s = float(argv[5]) if len(argv) > 5 else GROUP_TIMEOUT_S
    torch.set_num_threads(1)
    from fastsac.learner.distributed import LearnerGroup
    from fastsac.process.torch_runtime import configure_torch
    configure_torch()                                  # as every fastsac process (and the test session) does
    group = LearnerGroup.join(group_config(port, world, timeout_s), rank, torch.device("cpu"), log=lambda m: None)
    try:
        SCENARIOS[name](group, out)
    finally:
        group.close()
    return 0


# ---------------------------------------------------------------------------- test side
@pytest.fixture
def ranks(tmp_path):
    """start(scenario, world) -> the rank processes; all are killed at teardown if still running."""
    started: list[subprocess.Popen] = []

    def start(scenario: str, world: int = 2, timeout_s: float = GROUP_TIMEOUT_S) -> list[subprocess.Popen]:
        port = free_port()
        for rank in range(world):
            log = open(tmp_path / f"{scenario}{rank}.log", "w")
            started.append(subprocess.Popen([sys.executable, __file__, scenario, str(rank), str(world), str(port),
                                             str(tmp_path), str(timeout_s)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        return started[-world:]

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def finish(procs: list[subprocess.Popen], tmp_path: Path, scenario: str) -> None:
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    for rank, p in enumerate(procs):
        try:
            rc = p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = None
        log = (tmp_path / f"{scenario}{rank}.log").read_text()
        assert rc == 0, f"rank {rank} exit {rc}:\n{log}"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.process
def test_two_ranks_on_half_batches_train_like_one_rank_on_the_whole_batch(ranks, tmp_path):
    procs = ranks("update")
    reference = updates(slice(0, BATCH))               # one learner, the whole batch, no group
    # the negative control: the same updates of each half without gradient averaging
    alone = [updates(slice(0, BATCH // 2)), updates(slice(BATCH // 2, BATCH))]
    finish(procs, tmp_path, "update")
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert max_diff(got[0], got[1])[0] == 0.0, "ranks differ after the same averaged update"
    diff, where = max_diff(got[0], reference)
    assert diff < TOL, f"2 ranks vs 1: {diff:.3g} at {where}"
    # every trained part on its own (so a missing all-reduce of any one of them shows above)
    for part in ("actor.", "critic.", "critic_target.", "log_alpha"):
        control = max(max_diff({k: v for k, v in a.items() if k.startswith(part)},
                               {k: v for k, v in reference.items() if k.startswith(part)})[0] for a in alone)
        assert control > 10 * TOL, f"negative control: {part} without averaging differs only {control:.3g}"


@pytest.mark.process
def test_ranks_leave_in_step_and_rank_0_keeps_the_store_until_the_last_rank_closed(ranks, tmp_path):
    finish(ranks("leave"), tmp_path, "leave")
    t = {f"{what}{r}": float((tmp_path / f"{what}{r}").read_text()) for what in ("close_start", "close_end")
         for r in range(2)}
    # rank 0 reached close well before rank 1, and it waited there until rank 1 had come to close
    assert t["close_start1"] - t["close_start0"] > SLOW_LEAVE_S / 2, t
    assert t["close_end0"] > t["close_start1"], t


@pytest.mark.process
def test_sync_normalizers_bit_identical_and_equal_to_one_normalizer_over_all_data(ranks, tmp_path):
    finish(ranks("normalizers"), tmp_path, "normalizers")
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name, dim, col in (("obs", OBS_DIM, 0), ("critic_obs", CRITIC_OBS_DIM, 1)):
        a, b = got[0][name], got[1][name]
        for k in ("mean", "var", "count"):
            assert torch.equal(a[k], b[k]), (name, k, a[k], b[k])
        one = RunningNormalizer(dim)                   # everything, in the order the ranks fold it
        for round_ in range(2):
            for rank in range(2):
                for batch in norm_data(rank, round_):
                    one.update(batch[col])
        data = torch.cat([batch[col] for round_ in range(2) for rank in range(2)
                          for batch in norm_data(rank, round_)]).double()
        assert a["count"].item() == one.count.item() == data.shape[0]
        torch.testing.assert_close(a["mean"], one.mean, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(a["var"], one.var, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a["var"].double(), data.var(0, unbiased=False), rtol=1e-5, atol=1e-5)
    for r in range(2):
        assert got[r]["sums"] == {"transitions": 30.0, "updates": 1.0}
        assert got[r]["maxes"] == {"stop": 1.0}
        assert got[r]["gather"] == [1.0, 11.0]


@pytest.mark.process
def test_broadcast_agent_makes_every_rank_rank_0(ranks, tmp_path):
    finish(ranks("broadcast"), tmp_path, "broadcast")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r1["before"] != r0["before"]
    assert r0["after"] == r0["before"] == r1["after"]
    assert r0["num_updates"] == r1["num_updates"] == 2


@pytest.mark.process
@pytest.mark.parametrize("victim", [1, 0])
def test_kill_9_of_one_rank_names_it_in_the_survivors_next_collective(ranks, tmp_path, victim):
    procs = ranks("kill")
    survivor = 1 - victim
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
        assert all(p.poll() is None for p in procs), [(tmp_path / f"kill{r}.log").read_text() for r in range(2)]
        assert time.monotonic() < deadline, "the ranks never got ready"
        time.sleep(0.05)
    os.kill(procs[victim].pid, signal.SIGKILL)
    procs[victim].wait(10)
    (tmp_path / "go").touch()
    try:
        rc = procs[survivor].wait(WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        rc = None
    log = (tmp_path / f"kill{survivor}.log").read_text()
    assert rc == 0, f"survivor exit {rc}:\n{log}"
    result = json.loads((tmp_path / f"result{survivor}.json").read_text())
    assert result["raised"], result
    assert result["seconds"] < KILL_NOTICED_S, result
    named = "learner rank(s) 1 (node_rank 0) stopped answering" if victim == 1 else \
        "learner rank 0 (node_rank 0) stopped answering"
    assert result["message"].startswith("exchange of progress counters: " + named), result
    assert result["again"] == result["message"] and result["again_seconds"] < 1.0, result


@pytest.mark.process
def test_a_collective_a_live_rank_never_joins_fails_after_timeout_s(ranks, tmp_path):
    timeout_s = 3.0
    finish(ranks("hang", timeout_s=timeout_s), tmp_path, "hang")
    result = json.loads((tmp_path / "result0.json").read_text())
    assert result["raised"], result
    # bounded by timeout_s (+ describe_failure's wait for a stale beat, which never comes here)
    assert timeout_s * 0.9 < result["seconds"] < timeout_s + KILL_NOTICED_S, result
    assert result["message"].startswith("gather: every learner rank still beats"), result


if __name__ == "__main__":
    try:
        code = worker_main(sys.argv[1:])
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
