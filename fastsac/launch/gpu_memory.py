"""The launcher's GPU memory check: what every planned CUDA process will hold on its GPU must fit
that GPU's free memory, before anything is spawned (torch-free; ConfigError = exit 2 naming the
key to change and, for the replay buffer, the largest algo.buffer_size that fits). Without it a
job that does not fit dies later with a raw CUDA out-of-memory traceback.

Per GPU (the plan's concrete devices, fastsac.machine.devices):
  * each learner on it: its replay buffer (rows for its own collectors' envs), the networks with
    gradients, Adam moments and target critics, one update's working set at batch_size
    (fastsac.launch.memory_check's lower bound, the one estimate of it), the staging buffer's
    device twin, and a CUDA context;
  * each collector inferring on it: a CUDA context (the actor itself is small).
Free memory per GPU comes from the launcher's torch probe (fastsac.launch.preflight), which
runs anyway when a CUDA device is planned.
"""
from __future__ import annotations

from fastsac import shm_layout as shm
from fastsac.config import Config, ConfigError
from fastsac.launch.memory_check import replay_buffer_nbytes, update_working_set_nbytes_lower_bound
from fastsac.launch.preflight import gib, torch_cuda_probe
from fastsac.machine import devices as dv
from fastsac.shm_layout.policy_layout import critic_widths, policy_flat_numel

CUDA_CONTEXT_BYTES = 512 << 20   # a CUDA context with torch's kernels loaded: ~0.3-0.6 GB, by GPU and CUDA


def network_nbytes(spec, a) -> int:
    """The twin critics (weights, gradients, 2 Adam moments) and their targets, the actor (the
    same four copies), and one update's working set at batch_size (memory_check's estimate)."""
    widths = critic_widths(a)
    ins = [(spec.critic_obs_dim or spec.obs_dim) + spec.act_dim, *widths]
    q_net = sum(i * o + o for i, o in zip(ins, [*widths, a.num_atoms]))
    actor = policy_flat_numel(spec.obs_dim, spec.act_dim, a)
    return 4 * (2 * 4 * q_net + 2 * q_net + 4 * actor) + \
        update_working_set_nbytes_lower_bound(spec.obs_dim, spec.critic_obs_dim, spec.act_dim, a)


def staging_nbytes(cfg: Config, spec, envs: list[int]) -> int:
    """The device twin of a learner's staging buffer (fastsac.learner.staging.IngestStaging)."""
    max_slots = cfg.trainer.async_options.max_ingest_per_iter
    return max(shm.job_ring_spec(cfg, spec, n).staging_nbytes(max_slots) for n in envs)


def _per_gpu(cfg: Config, spec, plan) -> dict[str, dict]:
    """device -> {"replay": bytes, "other": [(label, bytes)], "envs": learner env rows}."""
    a, out = cfg.algo, {}
    for p in plan.learners:
        if p.device == "cpu":
            continue
        envs = [c.env_count for c in plan.collectors if c.learner_index == p.learner_index]
        g = out.setdefault(p.device, {"replay": 0, "envs": 0, "other": []})
        g["replay"] += replay_buffer_nbytes(sum(envs), a.buffer_size, spec.obs_dim, spec.critic_obs_dim,
                                            spec.act_dim, a.num_steps)
        g["envs"] += sum(envs)
        g["other"] += [("networks, optimizer and activations", network_nbytes(spec, a)),
                       ("staging", staging_nbytes(cfg, spec, envs)), ("CUDA context", CUDA_CONTEXT_BYTES)]
    for c in plan.collectors:
        if c.device != "cpu":
            out.setdefault(c.device, {"replay": 0, "envs": 0, "other": []})["other"].append(
                (f"collector {c.collector_id}'s CUDA context", CUDA_CONTEXT_BYTES))
    return out


def _largest_buffer(cfg: Config, spec, envs: int, room: int) -> int:
    """The largest algo.buffer_size whose replay buffer for `envs` rows fits `room` bytes (0: none)."""
    a = cfg.algo
    lo, hi = 0, a.buffer_size          # replay(lo) fits (or lo is 0), replay(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if replay_buffer_nbytes(envs, mid, spec.obs_dim, spec.critic_obs_dim, spec.act_dim, a.num_steps) <= room:
            lo = mid
        else:
            hi = mid
    return lo if lo > a.num_steps else 0


def check_gpu_memory(cfg: Config, spec, plan) -> None:
    """Every GPU of the plan must hold what its processes need (module docstring)."""
    if plan is None or all(p.device == "cpu" for p in plan.processes):
        return
    probe = torch_cuda_probe()
    if not probe or not probe["gpus"]:
        return   # check_devices already refused a GPU torch cannot use; no numbers, no check
    a = cfg.algo
    for device, g in sorted(_per_gpu(cfg, spec, plan).items()):
        k = dv.cuda_index(device) or 0
        if k >= len(probe["gpus"]):
            continue
        free, name = probe["gpus"][k]["free"], probe["gpus"][k]["name"]
        other = sum(n for _, n in g["other"])
        need = g["replay"] + other
        if need <= free:
            continue
        parts = ", ".join([f"replay buffer {gib(g['replay'])}"] * bool(g["replay"]) +
                          [f"{label} {gib(n)}" for label, n in g["other"]])
        what = f"need {need:,} bytes ({gib(need)}: {parts}), but {device} ({name}) has {free:,} bytes " \
               f"({gib(free)}) free"
        contexts = sum(n for label, n in g["other"] if label.startswith("collector"))
        if g["replay"] >= max(other - contexts, contexts):
            fits = _largest_buffer(cfg, spec, g["envs"], free - other)
            raise ConfigError(f"algo.buffer_size: {a.buffer_size} slots per env for {g['envs']:,} env rows on "
                              f"{device}: the learner's GPU memory would {what}; the largest algo.buffer_size that "
                              f"fits is {fits:,} (or fewer env.num_envs, or another GPU)")
        if contexts >= other - contexts:
            raise ConfigError(f"trainer.async_options.collector_inference_device: {device}: the CUDA contexts of "
                              f"{contexts // CUDA_CONTEXT_BYTES} collectors and the learner on it {what}; infer on the "
                              "CPU (collector_inference_device: cpu) or use fewer collectors")
        raise ConfigError(f"algo.critic_hidden_dim: {a.critic_hidden_dim}: the networks, optimizer and activations "
                          f"(algo.batch_size {a.batch_size}) on {device} {what}; shrink the networks or "
                          "algo.batch_size, or use another GPU")
