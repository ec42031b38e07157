"""The error every bad input becomes, and the exit codes of every fastsac command.

Its own module, importing nothing of fastsac: config.py and the modules it validates with
(fastsac.envs.registry) both raise ConfigError, and neither may import the other at load time.
"""
from __future__ import annotations

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class ConfigError(ValueError):
    """Invalid configuration or command-line usage (exit code 2)."""
