"""`python -m fastsac.launcher`: the launcher (fastsac-launch).

The code is fastsac.launch.cli; this path is the one users, the plan's commands and the
systemd unit type, and it stays. It also turns a Ctrl-C that lands before the job's own signal
handling is installed (while Python imports the launcher or torch, reads the config, plans)
into one line and exit code 130 instead of a KeyboardInterrupt traceback: nothing has been
spawned by then, and the cleanup of any segment already created runs on the way out."""
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from fastsac.launch.cli import main as launch   # inside the try: a Ctrl-C while importing, too
        return launch(argv)
    except KeyboardInterrupt:
        print("fastsac-launch: interrupted (Ctrl-C) while starting, before the job ran; no process is left",
              file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
