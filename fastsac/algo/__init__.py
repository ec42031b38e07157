"""FastSAC learner algorithm, replay buffer and collector-side inference policy.

Deliberately empty: importing `fastsac.algo` must not import torch, so torch-free code
(launcher, shared-memory layout) can use `fastsac.algo.policy_layout`. Import the
torch modules directly: `fastsac.algo.fastsac`, `fastsac.algo.replay_buffer`,
`fastsac.algo.policy`, `fastsac.algo.networks`, `fastsac.algo.normalizer`.
"""
