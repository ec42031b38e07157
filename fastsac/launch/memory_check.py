"""The launcher's memory check: the whole job must fit the memory it may use, before anything is
spawned (torch-free; ConfigError = exit 2, naming the key to change and the largest value that fits).

What the job takes (host memory):
  * every process: PROCESS_BASE_BYTES (interpreter, numpy, torch, env libraries);
  * the training envs, env.num_envs of them in all, at fastsac.envs.env_memory's bytes per env (a
    table for the built-in tasks, a probe process for the others);
  * the eval envs (eval.interval > 0): min(eval.num_envs, eval.episodes), the same size;
  * a learner on the CPU: the replay buffer, the networks and one update's working set (on a GPU
    they are checked against that GPU's free memory instead: fastsac.launch.gpu_memory).
What it may use (fastsac.machine.memory_available): MemAvailable and the cgroup's limit (v2 or v1), and
for collectors bound with --membind each node's free memory, which their envs must fit alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from fastsac.config import Config, ConfigError
from fastsac.envs.env_memory import PROCESS_BASE_BYTES, bytes_per_env
from fastsac.evaluation import episodes as eval_episodes
from fastsac.launch.preflight import gib, visible_gpu_count
from fastsac.machine.memory_available import available_memory
from fastsac.shm_layout.policy_layout import actor_widths, critic_widths, policy_flat_numel


def replay_buffer_nbytes(num_envs: int, buffer_size: int, obs_dim: int, critic_obs_dim: int, act_dim: int,
                         n_steps: int) -> int:
    """Bytes of fastsac.algo.replay_buffer.ReplayBuffer's tensors (a test checks it against the real
    buffer). Python ints: no overflow, whatever the config asks for."""
    E, S = num_envs, buffer_size
    K = max(max(1, S // 4), n_steps + 1)   # final-observation slots per row, as ReplayBuffer sizes them
    per_entry = 4 * (obs_dim + critic_obs_dim + act_dim + 1) + 2 + 8   # f32 obs/critic/act/reward, 2 bools, final_slot
    per_final = 4 * (obs_dim + critic_obs_dim) + 8                     # final obs (+ critic), final_owner
    return E * S * per_entry + E * K * per_final + 3 * 8 * E + 4 * (n_steps + 1)  # final_count/pos/start, gammas


def network_weights_nbytes_lower_bound(obs_dim: int, critic_obs_dim: int, act_dim: int, a) -> tuple[int, int]:
    """(critic, actor) bytes the learner holds at least: the twin critics and their target copy
    (Linear weights only: no biases, gradients or optimizer moments), and the actor's flat vector."""
    widths = critic_widths(a)
    ins = [(critic_obs_dim or obs_dim) + act_dim, *widths]
    q_net = sum(i * o for i, o in zip(ins, [*widths, a.num_atoms]))
    return 4 * 4 * q_net, 4 * policy_flat_numel(obs_dim, act_dim, a)


def update_working_set_nbytes_lower_bound(obs_dim: int, critic_obs_dim: int, act_dim: int, a) -> int:
    """Bytes one update holds at least besides the weights: the sampled batch (observations and
    next observations, actions, rewards), every hidden layer's activation and its gradient for
    the twin critics (online and target) and the actor, and the C51 distributions and their
    projection (float32, plus its int64 indices), all batch_size rows."""
    batch = a.batch_size * (2 * (obs_dim + critic_obs_dim) + act_dim + 2)
    layers = a.batch_size * 2 * (2 * 2 * sum(critic_widths(a)) + sum(actor_widths(a)))
    atoms = a.batch_size * 2 * a.num_atoms * (4 + 2)   # logits, probs, target, support; indices (2 x 4 bytes)
    return 4 * (batch + layers + atoms)


def learner_runs_on_cpu(cfg: Config, plan=None) -> bool:
    """The plan's learners all train on the CPU (no plan, the synchronous trainer: its device)."""
    if plan is not None:
        return all(p.device == "cpu" for p in plan.learners)
    return cfg.device == "cpu" or (cfg.device == "auto" and visible_gpu_count() == 0)


@dataclass
class Part:
    """One part of the job's memory: its size, what it is, and (for the parts a key sizes) the
    message head and the advice."""
    nbytes: int
    label: str
    head: str = ""
    fix: str = ""


def eval_env_count(cfg: Config) -> int:
    return eval_episodes.eval_env_count(cfg.eval.episodes, cfg.eval.num_envs) if cfg.eval.interval > 0 else 0


def job_parts(cfg: Config, spec, per_env: int | None, plan=None) -> list[Part]:
    """Every part of the job's host memory, the named ones first."""
    a, n = cfg.algo, cfg.env.num_envs
    parts = []
    if learner_runs_on_cpu(cfg, plan):
        replay = replay_buffer_nbytes(n, a.buffer_size, spec.obs_dim, spec.critic_obs_dim, spec.act_dim, a.num_steps)
        critic, actor = network_weights_nbytes_lower_bound(spec.obs_dim, spec.critic_obs_dim, spec.act_dim, a)
        parts += [Part(replay, "replay buffer", f"algo.buffer_size: {a.buffer_size} slots per env: the replay buffer "
                                                f"for env.num_envs {n}", "lower algo.buffer_size or env.num_envs"),
                  Part(critic, "critics at least", f"algo.critic_hidden_dim: {a.critic_hidden_dim}: the twin critics "
                                                   "and their targets", "shrink the critics (algo.critic_hidden_dim, "
                                                                         "algo.critic_num_layers, algo.num_atoms)"),
                  Part(actor, "actor at least", f"algo.actor_hidden_dim: {a.actor_hidden_dim}: the actor",
                       "shrink the actor (algo.actor_hidden_dim, algo.actor_num_layers)"),
                  Part(update_working_set_nbytes_lower_bound(spec.obs_dim, spec.critic_obs_dim, spec.act_dim, a),
                       "one update at least", f"algo.batch_size: {a.batch_size} transitions per update: one update's "
                                              "working set (batch x network widths x atoms)",
                       "lower algo.batch_size (or the network widths, algo.num_atoms)")]
    if per_env is not None:
        parts.append(Part(n * per_env, f"{n} training envs", f"env.num_envs: {n} envs of {cfg.env.name!r}", "env"))
        k = eval_env_count(cfg)
        if k:
            parts.append(Part(k * per_env, f"{k} eval envs", f"eval.num_envs: {k} eval envs of {cfg.env.name!r}",
                              "eval"))
    processes = 1 if plan is None else len(plan.learners) + len(plan.collectors) + (1 if plan.evaluator else 0)
    parts.append(Part(processes * PROCESS_BASE_BYTES, f"{processes} process(es) at {gib(PROCESS_BASE_BYTES)}"))
    return parts


def _largest_fitting(room: int, per_env: int) -> int:
    return max(0, room // max(per_env, 1))


def check_memory(cfg: Config, spec, plan=None) -> None:
    """The job's memory (job_parts) must fit what it may use; the message names the key of the
    biggest part and, for env counts, the largest count that fits."""
    per_env, per_env_source = bytes_per_env(cfg.env.name, cfg.env.max_episode_steps)
    parts = job_parts(cfg, spec, per_env, plan)
    need = sum(p.nbytes for p in parts)
    avail = available_memory()
    if avail is not None and need > avail[0]:
        _refuse(cfg, parts, need, avail, per_env, per_env_source, "")
    if plan is not None and per_env is not None and plan.binding != "off":
        check_nodes(cfg, plan, per_env, per_env_source)


def _refuse(cfg, parts: list[Part], need: int, avail: tuple[int, str], per_env, per_env_source: str,
            where: str) -> None:
    have, source = avail
    named = max((p for p in parts if p.head), key=lambda p: p.nbytes)
    listed = ", ".join(f"{p.label} {gib(p.nbytes)}" for p in parts)
    if named.fix in ("env", "eval"):
        count = cfg.env.num_envs if named.fix == "env" else eval_env_count(cfg)
        fits = _largest_fitting(have - (need - named.nbytes), per_env)
        key = "env.num_envs" if named.fix == "env" else "eval.num_envs"
        fix = (f"at {per_env:,} bytes per env ({per_env_source}) the largest {key} that fits is {fits:,}"
               if fits < count else f"lower {key}")
    else:
        fix = named.fix
    raise ConfigError(f"{named.head} and the rest of the job need {need:,} bytes ({gib(need)}: {listed}){where}, "
                      f"but {source} is {have:,} bytes ({gib(have)}); {fix}"
                      + ("" if named.fix in ("env", "eval") else ", or train on a GPU"))


def check_nodes(cfg: Config, plan, per_env: int, per_env_source: str) -> None:
    """Collectors bound to a node (--membind) must fit its free memory with their envs alone."""
    by_node: dict[int, list] = {}
    for c in plan.collectors:
        if c.node is not None and not c.manual:
            by_node.setdefault(c.node, []).append(c)
    for node_id, cols in sorted(by_node.items()):
        kb = plan.topology.node(node_id).mem_available_kb
        if kb is None:
            continue
        have, envs = kb * 1024, sum(c.env_count for c in cols)
        need = envs * per_env + len(cols) * PROCESS_BASE_BYTES
        if need <= have:
            continue
        share = envs / cfg.env.num_envs
        fits = int(_largest_fitting(have - len(cols) * PROCESS_BASE_BYTES, per_env) / share)
        raise ConfigError(f"env.num_envs: {cfg.env.num_envs} envs of {cfg.env.name!r}: the {len(cols)} collector(s) "
                          f"bound to NUMA node {node_id} hold {envs:,} of them and need {need:,} bytes "
                          f"({gib(need)}, {per_env:,} bytes per env: {per_env_source}), but the node has "
                          f"{have:,} bytes ({gib(have)}) free (MemFree + Inactive(file)); the largest env.num_envs "
                          f"that fits is {fits:,} (or spread the collectors over more nodes)")
