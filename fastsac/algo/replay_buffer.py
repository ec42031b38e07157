"""Replay buffer on the learner device: one circular row per env, next-obs derived from the successor.

Layout (E = num_envs rows, S = buffer_size slots per row, K = final_obs_capacity):

    obs          [E, S, obs_dim]      observation the action was taken in
    critic_obs   [E, S, critic_dim]   (only when critic_obs_dim > 0)
    actions      [E, S, act_dim]      env-scaled actions
    rewards      [E, S]
    terminated   [E, S] bool          true MDP end: no bootstrap
    done         [E, S] bool          terminated | truncated: the episode ended at this entry
    final_obs    [E, K, obs_dim]      true last observation of ended episodes (+ final_critic_obs)
    final_slot   [E, S] int64         entry -> its slot in final_obs (meaningful where done)

Next observation of entry t (same row): final_obs[final_slot[t]] if done[t], else obs[t + 1].
Storing next_obs densely would double the memory and the host->device traffic; episode ends
are rare (1 in 200 steps for the pendulum), so their final observations live in a small
per-row side table instead.

Positions are absolute per-row entry counters: `pos[e]` entries were ever written to row e,
the valid ones are [start[e], pos[e]) and entry a lives in slot a % S. Each collector owns a
contiguous block of rows and advances it at its own pace, so positions are per row.

The side table is circular too (K slots per row, in episode-end order). Reusing a slot whose
previous owner entry is still in the row evicts that entry and everything older (start moves
past it): their n-step windows might need its final observation. This only happens when a
row saw more than K episode ends within S steps, i.e. episodes shorter than S / K steps on
average (S / 4 by default); such a row then simply holds fewer than S entries.

Sampling: rows uniformly among rows with sampleable entries, then a start entry t uniformly
in [start, pos - n): the newest n entries are never sampled, so the successor obs[t + k + 1]
of every window step exists. The n-step window stops at the first ended entry (terminated or
truncated); a termination sets bootstrap = 0, a truncation bootstraps from the true final obs.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fastsac.common.transition import TransitionBatch


class ReplayBuffer:
    def __init__(self, num_envs: int, buffer_size: int, obs_dim: int, critic_obs_dim: int, act_dim: int,
                 n_steps: int, gamma: float, device: torch.device | str,
                 final_obs_capacity: int | None = None):
        if not 1 <= n_steps < buffer_size:
            raise ValueError(f"ReplayBuffer: n_steps ({n_steps}) must be in [1, buffer_size ({buffer_size}))")
        E, S = num_envs, buffer_size
        # K > n_steps guarantees an eviction never empties a row that had sampleable entries
        K = final_obs_capacity if final_obs_capacity is not None else max(1, S // 4)
        K = max(K, n_steps + 1)
        self.num_envs, self.buffer_size, self.final_obs_capacity = E, S, K
        self.obs_dim, self.critic_obs_dim, self.act_dim = obs_dim, critic_obs_dim, act_dim
        self.n_steps, self.gamma = n_steps, float(gamma)
        self.device = device = torch.device(device)

        self.obs = torch.zeros(E, S, obs_dim, device=device)
        self.critic_obs = torch.zeros(E, S, critic_obs_dim, device=device) if critic_obs_dim else None
        self.actions = torch.zeros(E, S, act_dim, device=device)
        self.rewards = torch.zeros(E, S, device=device)
        self.terminated = torch.zeros(E, S, dtype=torch.bool, device=device)
        self.done = torch.zeros(E, S, dtype=torch.bool, device=device)
        self.final_obs = torch.zeros(E, K, obs_dim, device=device)
        self.final_critic_obs = torch.zeros(E, K, critic_obs_dim, device=device) if critic_obs_dim else None
        self.final_slot = torch.zeros(E, S, dtype=torch.long, device=device)
        self.final_owner = torch.full((E, K), -1, dtype=torch.long, device=device)  # absolute entry index
        self.final_count = torch.zeros(E, dtype=torch.long, device=device)          # episode ends ever stored
        self.pos = torch.zeros(E, dtype=torch.long, device=device)
        self.start = torch.zeros(E, dtype=torch.long, device=device)
        self.gamma_powers = self.gamma ** torch.arange(n_steps + 1, dtype=torch.float64, device=device).float()
        # Host-side flag: once every row has a sampleable entry, rows are drawn with randint
        # (no host sync). Only drop_newest can take that away again (see _store_final on why
        # evictions cannot).
        self._all_rows_ready = False

    # ------------------------------------------------------------------ writing
    def _rows(self, env_rows: slice) -> Tensor:
        start, stop, step = env_rows.indices(self.num_envs)
        if step != 1 or stop <= start:
            raise ValueError(f"ReplayBuffer: env_rows must be a non-empty contiguous slice, got {env_rows}")
        return torch.arange(start, stop, device=self.device)

    def extend(self, env_rows: slice, batch: TransitionBatch) -> None:
        """Append one env-step batch (torch tensors on this device) for the rows in env_rows.

        batch.final_idx: int64 LOCAL indices (within the block) of the envs whose episode ended
        this step; it must list exactly the envs with terminated | truncated (not checked here:
        that would cost a host sync; the learner checks it on the host before staging).
        batch.final_obs / final_critic_obs: their true last observations, one row each.
        """
        obs, critic_obs, actions, rewards = batch.obs, batch.critic_obs, batch.actions, batch.rewards
        terminated, truncated, final_idx = batch.terminated, batch.truncated, batch.final_idx
        final_obs, final_critic_obs = batch.final_obs, batch.final_critic_obs
        rows = self._rows(env_rows)
        a = self.pos[rows]                      # absolute index of the new entry, per row
        slot = a % self.buffer_size
        self.obs[rows, slot] = obs
        if self.critic_obs is not None:
            self.critic_obs[rows, slot] = critic_obs
        self.actions[rows, slot] = actions
        self.rewards[rows, slot] = rewards.reshape(-1).to(self.rewards.dtype)
        terminated = terminated.reshape(-1).bool()
        self.terminated[rows, slot] = terminated
        self.done[rows, slot] = terminated | truncated.reshape(-1).bool()
        if final_idx.numel() > 0:               # numel is host metadata: no sync
            final_idx = final_idx.to(self.device, torch.long)
            self._store_final(rows[final_idx], a[final_idx], final_obs, final_critic_obs)
        self.pos[rows] = a + 1
        # the slot we just wrote held entry a - S, which is gone now
        self.start[rows] = torch.maximum(self.start[rows], a + 1 - self.buffer_size)

    def _store_final(self, rows: Tensor, a: Tensor, final_obs: Tensor, final_critic_obs: Tensor | None) -> None:
        """Store the true final observation of entries a (one per row, rows unique).

        The side slot is reused circularly. Its previous owner is the row's oldest entry with a
        stored final obs; it and every older entry are evicted (their n-step windows could end
        there). The K - 1 newer episode ends all lie after it, so at least K entries remain and,
        with K > n_steps, a row that was sampleable stays sampleable.
        """
        k = self.final_count[rows] % self.final_obs_capacity
        self.start[rows] = torch.maximum(self.start[rows], self.final_owner[rows, k] + 1)
        self.final_obs[rows, k] = final_obs
        if self.final_critic_obs is not None:
            self.final_critic_obs[rows, k] = final_critic_obs
        self.final_owner[rows, k] = a
        self.final_slot[rows, a % self.buffer_size] = k
        self.final_count[rows] += 1

    def drop_newest(self, env_rows: slice) -> None:
        """Forget the newest entry of each row in the block (a restarted collector's last step).

        That entry has no successor and never will: the restarted collector starts new
        episodes. Its predecessor would otherwise take the restarted env's first reset obs as
        its next obs, so it becomes an episode end: truncated, with the dropped entry's obs
        (its true successor) as final obs. Host syncs here are fine: restarts are rare.
        """
        self._all_rows_ready = False
        rows = self._rows(env_rows)
        rows = rows[self.pos[rows] > self.start[rows]]          # non-empty rows only
        if rows.numel() == 0:
            return
        newest = self.pos[rows] - 1
        newest_slot = newest % self.buffer_size
        # 1. give back the side slot of a dropped episode end (it is always the latest one)
        had_final = self.done[rows, newest_slot]
        if had_final.any():
            r = rows[had_final]
            self.final_count[r] -= 1
            self.final_owner[r, self.final_count[r] % self.final_obs_capacity] = -1
        # 2. the predecessor (if still valid and not already an episode end) becomes a truncation
        prev = newest - 1
        prev_slot = prev % self.buffer_size
        fix = (prev >= self.start[rows]) & ~self.done[rows, prev_slot]
        self.pos[rows] = newest
        self.done[rows, newest_slot] = False
        self.terminated[rows, newest_slot] = False
        if fix.any():
            r, p, s = rows[fix], prev[fix], newest_slot[fix]
            self.done[r, p % self.buffer_size] = True
            self.terminated[r, p % self.buffer_size] = False
            self._store_final(r, p, self.obs[r, s],
                              self.critic_obs[r, s] if self.critic_obs is not None else None)

    # ------------------------------------------------------------------ reading
    def row_sizes(self) -> Tensor:
        """Valid entries per row [E] (on the buffer device)."""
        return self.pos - self.start

    def row_sampleable(self) -> Tensor:
        """Sampleable start entries per row [E]: all valid entries but the newest n_steps."""
        return (self.pos - self.n_steps - self.start).clamp(min=0)

    def size(self) -> int:
        """Valid entries in the whole buffer (host sync)."""
        return int(self.row_sizes().sum())

    def num_sampleable(self) -> int:
        """Entries sample() can start a window at (host sync)."""
        return int(self.row_sampleable().sum())

    def ready(self) -> bool:
        """True when sample() can run. Free (no host sync) once every row is sampleable, unlike
        num_sampleable(), which syncs every call: prefer this in the training loop."""
        if self._all_rows_ready:
            return True
        counts = self.row_sampleable()
        self._all_rows_ready = bool((counts > 0).all())
        return self._all_rows_ready or bool((counts > 0).any())

    def _sample_rows(self, batch_size: int, counts: Tensor) -> Tensor:
        if not self._all_rows_ready:
            self._all_rows_ready = bool((counts > 0).all())      # one host sync until every row has data
        if self._all_rows_ready:
            return torch.randint(0, self.num_envs, (batch_size,), device=self.device)
        ready = torch.nonzero(counts > 0).squeeze(1)
        if ready.numel() == 0:
            raise RuntimeError(f"ReplayBuffer.sample: no row holds more than n_steps={self.n_steps} entries yet; "
                               "collect more env steps before training")
        return ready[torch.randint(0, ready.numel(), (batch_size,), device=self.device)]

    def sample(self, batch_size: int) -> dict[str, Tensor | None]:
        """A batch of n-step transitions (all tensors on the buffer device):

        obs, critic_obs (None when critic_obs_dim == 0), actions: at the start entry t;
        rewards: sum_{j<k} gamma^j r_{t+j} over the window of length k <= n_steps, which stops
          at the first ended (terminated or truncated) entry;
        next_obs, next_critic_obs: the observation after the window (the true final obs when it
          ended an episode);
        bootstrap: 0.0 when the window ended in a termination, else 1.0;
        discount: gamma^k.
        Target: rewards + discount * bootstrap * V(next_obs).
        """
        S, n = self.buffer_size, self.n_steps
        counts = self.row_sampleable()
        rows = self._sample_rows(batch_size, counts)
        # float64 uniforms: u * count must not round up to count for large rows
        u = torch.rand(batch_size, dtype=torch.float64, device=self.device)
        offset = torch.minimum((u * counts[rows]).long(), counts[rows] - 1)
        t = self.start[rows] + offset

        returns = torch.zeros(batch_size, device=self.device)
        is_open = torch.ones(batch_size, dtype=torch.bool, device=self.device)
        ended = torch.zeros_like(is_open)
        terminal = torch.zeros_like(is_open)
        end = t + (n - 1)                               # last entry of the window
        for k in range(n):                              # n is small; the batch is vectorized
            s = (t + k) % S
            returns += torch.where(is_open, self.rewards[rows, s] * self.gamma_powers[k], 0.0)
            stop = is_open & self.done[rows, s]
            end = torch.where(stop, t + k, end)
            ended |= stop
            terminal |= stop & self.terminated[rows, s]
            is_open &= ~stop

        end_slot, next_slot = end % S, (end + 1) % S
        fslot = self.final_slot[rows, end_slot]
        ended_col = ended.unsqueeze(1)
        next_obs = torch.where(ended_col, self.final_obs[rows, fslot], self.obs[rows, next_slot])
        t_slot = t % S
        batch: dict[str, Tensor | None] = {
            "obs": self.obs[rows, t_slot],
            "critic_obs": None,
            "actions": self.actions[rows, t_slot],
            "rewards": returns,
            "next_obs": next_obs,
            "next_critic_obs": None,
            "bootstrap": (~terminal).float(),
            "discount": self.gamma_powers[end - t + 1],
        }
        if self.critic_obs is not None:
            batch["critic_obs"] = self.critic_obs[rows, t_slot]
            batch["next_critic_obs"] = torch.where(ended_col, self.final_critic_obs[rows, fslot],
                                                   self.critic_obs[rows, next_slot])
        return batch
