"""What every fastsac command line shares: `--version`, exit code 2 with a `PROG: error:` line on
a usage error, the exit codes in `--help`, and a quiet exit when the reader of its output goes
away (`fastsac-launch --plan | head`)."""
from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Callable

from fastsac import __version__
from fastsac.errors import EXIT_OK, EXIT_USAGE

EXIT_CODES_HELP = ("exit codes: 0 done, or stopped gracefully (SIGTERM, SIGHUP, Ctrl-C) after its final checkpoint; "
                   "1 a runtime failure; 2 invalid config or usage (nothing was started or written)")


class UsageParser(argparse.ArgumentParser):
    """argparse with --version, the project's usage exit code and a 'PROG: error:' line."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def quiet_broken_pipe(main: Callable[..., int]) -> Callable[..., int]:
    """A command whose stdout reader closed early (`| head`) ends quietly with exit 0."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            # Python flushes stdout again at exit: point it at /dev/null so that flush cannot fail
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK

    return wrapped
