"""FastSAC learner algorithm, replay buffer and collector-side inference policy.

Deliberately empty: importing `fastsac.algo` does not import torch (the flat policy layout that
torch-free code sizes snapshots with is `fastsac.shm_layout.policy_layout`). Import the
torch modules directly: `fastsac.algo.fastsac`, `fastsac.algo.replay_buffer`,
`fastsac.algo.policy`, `fastsac.algo.networks`, `fastsac.algo.normalizer`.
"""
