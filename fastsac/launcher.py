"""`python -m fastsac.launcher`: the launcher (fastsac-launch).

The code is fastsac.launch.cli; this path is the one users, the plan's commands and the
systemd unit type, and it stays. It also turns a stop signal (SIGINT, SIGTERM, SIGHUP) that lands
before the job's own signal handling is installed (while Python imports the launcher or torch,
reads the config, plans) into one line and exit code 128 + the signal (130 for a Ctrl-C) instead
of a KeyboardInterrupt traceback or a silent death: nothing has been spawned by then, and the
cleanup of any segment already created runs on the way out."""
import sys

from fastsac.common.stopping import Interrupted, raise_on_stop_signals


def main(argv: list[str] | None = None) -> int:
    try:
        raise_on_stop_signals()   # until the job's own handling (sync trainer, supervisor) replaces it
        from fastsac.launch.cli import main as launch   # inside the try: a stop while importing, too
        return launch(argv)
    except KeyboardInterrupt as exc:
        stop = exc if isinstance(exc, Interrupted) else Interrupted()
        print(f"fastsac-launch: interrupted ({stop.what}) while starting, before the job ran; no process is left",
              file=sys.stderr)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
