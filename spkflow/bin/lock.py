"""Take, release or show the lock of an output directory (see spkflow.core.lock).

    python -m spkflow.bin.lock acquire [--pid PID] [--command CMD] DIR   # PID: the holder, e.g. the shell's $$
    python -m spkflow.bin.lock release [--pid PID] DIR
    python -m spkflow.bin.lock status DIR

acquire: exit 0 when the lock is taken (a stale one is taken over, saying so on stderr); exit 1
with one line naming the holder (host, pid, start time, command) when another run has it.
release: removes the lock only if it names PID on this host.  A stage script does
``jobs_lock DIR`` (scripts/lib/jobs.sh), which calls this and releases from an EXIT trap.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.core.lock import LockError, acquire, read_holder, release


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m spkflow.bin.lock", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("acquire", help="take the lock (exit 1 naming the holder when refused)")
    a.add_argument("--pid", type=int, default=None, help="the holding process (default: this one)")
    a.add_argument("--command", default=None, help="what the holder runs (default: its command line)")
    a.add_argument("dir")
    r = sub.add_parser("release", help="remove the lock if PID holds it")
    r.add_argument("--pid", type=int, default=None)
    r.add_argument("dir")
    s = sub.add_parser("status", help="print the holder, if any")
    s.add_argument("dir")
    args = p.parse_args(argv)
    if args.cmd == "acquire":
        try:
            acquire(args.dir, pid=args.pid, command=args.command)
        except LockError as err:
            print(f"ERROR: {err}", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "release":
        release(args.dir, pid=args.pid)
        return 0
    holder = read_holder(args.dir)
    print(holder.describe() if holder else f"{args.dir}: not locked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
