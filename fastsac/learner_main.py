"""`python -m fastsac.learner_main`: the learner process.

The code is fastsac.learner.main; this path is the one users, the plan's commands and the
systemd unit type, and it stays."""
import sys

from fastsac.learner.main import main

if __name__ == "__main__":
    sys.exit(main())
