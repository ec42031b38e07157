"""Helpers every role uses: process helpers, the transition batch, episode statistics, seeds.
Torch-free; imports nothing of fastsac but errors.
"""
