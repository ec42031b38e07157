"""Helpers every role uses: process helpers, the transition batch, episode statistics, seeds, the eval
result record. Torch-free; imports nothing of fastsac but errors.
"""
