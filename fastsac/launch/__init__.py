"""The launcher: CLI, preflight checks, the supervisor of every process, status.
"""
