"""`python -m fastsac.launcher`: the launcher (fastsac-launch).

The code is fastsac.launch.cli; this path is the one users, the plan's commands and the
systemd unit type, and it stays."""
import sys

from fastsac.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
