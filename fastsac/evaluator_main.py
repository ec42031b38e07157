"""`python -m fastsac.evaluator_main`: the evaluator process of an async job.

The code is fastsac.evaluation.main; this path is the one users, the plan's commands and the
systemd unit type, and it stays."""
import sys

from fastsac.evaluation.main import main

if __name__ == "__main__":
    sys.exit(main())
