"""argparse value types (and option groups) shared by the command-line front ends, so that every
command takes booleans the same way, rejects bad values with the same message and spells a shared
option alike.

The convention for a boolean option of a ``spkflow.bin`` command is the stage scripts' (and
Kaldi's, ESPnet's ``str2bool``): ``--opt true|false``, registered with :func:`add_bool_option`.
Exception: ``spkflow.bin.datadir`` keeps the flags of the Kaldi scripts it implements
(``validate_data_dir.sh --no-feats`` ...), whose interface is Kaldi's."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["add_bool_option", "add_decision_options", "boolean", "float_at_least", "int_at_least", "str2bool"]


def boolean(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``), as Kaldi and ESPnet scripts pass them."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


str2bool = boolean  # ESPnet's name for the same type


def add_bool_option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    default: bool,
    help: str,
    dest: str | None = None,
    old_negative: str | None = None,
    bare: bool = False,
) -> None:
    """Register ``flag`` as ``--opt true|false``.  ``bare=True`` also lets a bare ``--opt`` mean
    true (the spelling of an earlier ``store_true`` flag; only for commands without positional
    arguments, which it would swallow).  ``old_negative`` (e.g. ``--no-progress``) keeps an
    earlier ``--no-opt`` spelling working, hidden from ``--help``."""
    dest = dest or flag.lstrip("-").replace("-", "_")
    parser.add_argument(
        flag,
        dest=dest,
        type=boolean,
        nargs="?" if bare else None,
        const=True if bare else None,
        default=default,
        metavar="true|false",
        help=f"{help} (default: {str(default).lower()})",
    )
    if old_negative:
        parser.add_argument(old_negative, dest=dest, action="store_false", help=argparse.SUPPRESS)


def add_decision_options(parser: argparse.ArgumentParser, *, min_speech: float, skip_bad: str) -> None:
    """The options of the commands that decide on recordings (verify, identify): ``--out`` (the
    JSON lines), ``--min-speech`` (default ``min_speech``), ``--skip-bad`` (``skip_bad``: what it
    leaves out), ``--progress`` and ``--device``."""
    parser.add_argument("--out", default=None, help="write the JSON lines here (atomically) instead of standard output")
    parser.add_argument(
        "--min-speech",
        type=float,
        default=min_speech,
        metavar="SECONDS",
        help=f"fewest seconds of voiced speech (energy VAD) a decision is made on; fewer: a null decision and a "
        f"'warning' in the JSON line (default {min_speech}; 0: off)",
    )
    add_bool_option(parser, "--skip-bad", default=False, help=skip_bad)
    add_bool_option(parser, "--progress", default=True, help="progress bar while embedding")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")


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


def int_at_least_or_all(lo: int) -> Callable[[str], int | None]:
    """An integer >= ``lo``, or ``all`` (no limit: None)."""
    number = int_at_least(lo)

    def parse(text: str) -> int | None:
        return None if text == "all" else number(text)

    return parse


def float_at_least(lo: float) -> Callable[[str], float]:
    """A float type that refuses values below ``lo`` (and NaN)."""

    def parse(text: str) -> float:
        v = _number(text)
        if not v >= lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo:g}, got {text}")
        return v

    return parse


def _number(text: str, expected: str = "") -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{expected or 'invalid number'} {text!r}") from None


def finite_float(text: str) -> float:
    """Any finite number (refuses NaN and infinities)."""
    v = _number(text)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return v


def probability(text: str) -> float:
    """A prior strictly between 0 and 1 (``--p-target 0.5``)."""
    v = _number(text, "expected a number in (0, 1), got")
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"a prior must be in (0, 1), got {text}")
    return v
