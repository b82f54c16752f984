"""Kaldi-style option files (``--num-mel-bins=80`` one per line) read into typed dataclasses.

Guarantees: every line of the file is either blank, a ``#`` comment or one ``--name=value``
option whose name is a field of the target dataclass (dashes for underscores) and whose value
parses as that field's type; anything else raises :class:`~spkflow.core.errors.InputError` naming
the file and the 1-based line.  Kaldi's own ``ReadConfigFile`` (util/parse-options.cc) accepts
the same format but reports a bad option without its line; unknown options there are fatal
too, which we keep.  ``--flag`` alone means ``--flag=true`` as in Kaldi.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, TypeVar

from spkflow.core.errors import InputError

T = TypeVar("T")

_TRUE = {"true", "t", "1", "yes"}
_FALSE = {"false", "f", "0", "no"}


def _parse_value(kind: Any, text: str) -> Any:
    if kind is bool:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"expected true or false, got '{text}'")
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    if kind is str:
        return text
    raise TypeError(f"unsupported option type {kind!r}")


def read_kaldi_options(
    path: str | os.PathLike[str], cls: type[T], ignore: frozenset[str] = frozenset(), base: T | None = None
) -> T:
    """Read a Kaldi option file into a dataclass ``cls`` (a frozen dataclass of scalars).

    ``ignore`` lists Kaldi option names (with dashes) that are accepted and dropped, e.g.
    ``verbose``.  Values start from ``base`` (default: ``cls()``); the file overrides them.
    """
    path = os.fspath(path)
    hints = typing.get_type_hints(cls)
    fields = {f.name.replace("_", "-"): f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise InputError(path, None, f"cannot read option file: {e.strerror}") from e
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not line.startswith("--") or " " in line:
            raise InputError(path, lineno, f"expected one '--name=value' option per line, got '{raw.strip()}'")
        name, sep, value = line[2:].partition("=")
        if not sep:
            value = "true"
        if name in ignore:
            continue
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise InputError(path, lineno, f"unknown option '--{name}' (known: {known})")
        attr = fields[name]
        try:
            values[attr] = _parse_value(hints[attr], value)
        except (TypeError, ValueError) as e:
            raise InputError(path, lineno, f"bad value for '--{name}': {e}") from e
    start = base if base is not None else cls()
    try:
        return dataclasses.replace(start, **values)  # type: ignore[type-var]
    except ValueError as e:  # __post_init__ validation
        raise InputError(path, None, str(e)) from e


def to_kaldi_lines(opts: Any) -> str:
    """The inverse of :func:`read_kaldi_options`: one ``--name=value`` line per field."""
    out = []
    for f in dataclasses.fields(opts):
        v = getattr(opts, f.name)
        if isinstance(v, bool):
            v = "true" if v else "false"
        out.append(f"--{f.name.replace('_', '-')}={v}\n")
    return "".join(out)
