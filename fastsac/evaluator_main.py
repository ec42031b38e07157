"""`python -m fastsac.evaluator_main`: the evaluator process of an async job. The code is fastsac.evaluation.evaluator; this path is the
one users, the plan's commands and systemd units type, and stays."""
import sys

from fastsac.evaluation.evaluator import main

if __name__ == "__main__":
    sys.exit(main())
