"""Check that checkpoint files load safely (``weights_only=True``), before jobs are started on them.

    python -m spkflow.bin.check_checkpoint exp/spk_x/model.pth [more.pth ...]

Exit status 0 when every file loads; 1 with one line per bad file
(``<file>: unreadable or truncated checkpoint; ...`` or ``<file> holds pickled Python
objects (code), refused; ...``), no traceback.  The work is :func:`spkflow.nnet.checkpoint.load_checkpoint`.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.nnet.checkpoint import CheckpointError, load_checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.check_checkpoint", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="checkpoint files (checkpoint.pth, epoch<E>.pth, model.pth, ...)")
    p.add_argument("--hint", default=None, help="what to tell the user to do about a bad file (default: by name)")
    args = p.parse_args(argv)

    bad = 0
    for f in args.files:
        try:
            load_checkpoint(f, hint=args.hint)
        except CheckpointError as err:
            print(f"{p.prog}: error: {err}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
