"""The collector role: steps its shard of envs with a read-only policy and pushes every env-step
batch into its own ring.
"""
