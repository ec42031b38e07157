"""Evaluation: deterministic episodes on envs that are not training envs, their result record, the
async job's evaluator process and the launcher's watch over it. Torch-free to import (the launcher
uses the episode counts and the watch); the evaluator process brings its own torch.
"""
