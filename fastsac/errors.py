"""The errors that end a process, and the exit codes of every fastsac command.

Library code never exits the process: it raises ConfigError (bad input) or FatalError (a
process that cannot go on), and the entry point maps them to an exit code with exit_code_for.
Importing nothing of fastsac, this module sits below every other.
"""
from __future__ import annotations

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class ConfigError(ValueError):
    """Invalid configuration or command-line usage (exit code 2)."""


class FatalError(Exception):
    """A process cannot go on (the launcher is gone, an env produced NaN, a binding failed, ...).
    Its entry point prints the message under `role` (or its own) and exits with exit_code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE, role: str | None = None):
        super().__init__(message)
        self.exit_code, self.role = exit_code, role


def exit_code_for(exc: BaseException) -> int:
    """The one table from an error to an exit code: bad input 2, a fatal error its own code, else 1."""
    if isinstance(exc, ConfigError):
        return EXIT_USAGE
    if isinstance(exc, FatalError):
        return exc.exit_code
    return EXIT_FAILURE
