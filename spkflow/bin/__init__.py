"""Command-line front ends: ``python -m spkflow.bin.NAME``; argument parsing only.

The names are the recipes' (and users') interface and do not move.  May import: anything.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable

LOG_FORMAT = "%(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s"

Main = Callable[[list[str] | None], int]


def setup_logging(level: int = logging.INFO) -> None:
    """The commands' one log format (ESPnet's), on standard error."""
    logging.basicConfig(level=level, format=LOG_FORMAT)


def exits_on(*errors: type[Exception], say: str | None = None) -> Callable[[Main], Main]:
    """Decorate a command's ``main``: one of ``errors`` (bad input, a failed write: each names its
    file) ends it as one logged line, no traceback, and exit status 1.  ``say``: the line goes to
    standard error as ``<say>: <error>`` instead (the commands that log nothing else)."""

    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except errors as err:
                if say is None:
                    logging.error("%s", err, stacklevel=2)  # logged as the command's (its module) line
                else:
                    print(f"{say}: {err}", file=sys.stderr)
                return 1

        return run

    return wrap
