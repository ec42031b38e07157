"""The learner role: drains the rings, stages one host-to-device copy, trains FastSAC, publishes
weights; the learner group on torch.distributed.
"""
