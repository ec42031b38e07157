"""`python -m fastsac.collector_main`: a collector process.

The code is fastsac.collector.main; this path is the one users, the plan's commands and the
systemd unit type, and it stays."""
import sys

from fastsac.collector.main import main

if __name__ == "__main__":
    sys.exit(main())
