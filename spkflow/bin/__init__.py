"""Command-line front ends: ``python -m spkflow.bin.NAME``; argument parsing only.

The names are the recipes' (and users') interface and do not move.  May import: anything.
"""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s"


def setup_logging(level: int = logging.INFO) -> None:
    """The commands' one log format (ESPnet's), on standard error."""
    logging.basicConfig(level=level, format=LOG_FORMAT)
