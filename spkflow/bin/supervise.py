"""Run a command so that SIGINT / SIGTERM / SIGHUP to this process stop everything it starts.

    python -m spkflow.bin.supervise [--grace 5] [--name run.sh] -- bash ./run.sh --stage 4 ...

Every recipe and stage script runs under it through ``utils/supervise.sh`` (sourced first
thing; ``exec`` keeps the script's pid): the signal goes to the command's process group, and
what is left ``--grace`` seconds later is killed (a second signal kills at once).  Exit status:
the command's, 128 + N after signal N, 127 when it cannot be started.  The work is
:func:`spkflow.core.procs.supervise`.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.core.procs import supervise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.supervise", description=__doc__.split("\n")[0])
    p.add_argument("--grace", type=float, default=5.0, help="seconds between the forwarded signal and SIGKILL")
    p.add_argument("--name", default=None, help="what the supervisor's messages start with (default: the program)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --)")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given")
    if args.grace < 0:
        p.error(f"--grace {args.grace}: want >= 0")
    return supervise(command, grace=args.grace, name=args.name)


if __name__ == "__main__":
    sys.exit(main())
