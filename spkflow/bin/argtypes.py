"""argparse value types shared by the command-line front ends (Kaldi-style ``true``/``false``
flags, bounded integers), so that every command rejects bad values with the same message."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["boolean", "int_at_least"]


def boolean(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``), as Kaldi and ESPnet scripts pass them."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def int_at_least(lo: int) -> Callable[[str], int]:
    """An integer type that refuses values below ``lo``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v

    return parse
