"""Errors that point at the offending input.

Every user-facing failure on bad input raises :class:`InputError` (or a subclass)
carrying the file and, where there is one, the 1-based line number, so that the
message reads like a compiler's: ``data/train/utt2spk:17: duplicate key 'a-01'``.
"""

from __future__ import annotations

import os
from typing import Any


def _restore(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    """An error unpickled as it was (its class, message and attributes), without calling its
    ``__init__``, whose arguments are not the message alone."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class InputError(ValueError):
    """Bad user input, located by file and line (``line`` is 1-based, or None)."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, message: str) -> None:
        self.path = os.fspath(path)
        self.line = line
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses a process boundary (a DataLoader worker) as itself
        return _restore, (type(self), self.args, self.__dict__)


class UtteranceError(RuntimeError):
    """Processing one utterance failed; names the utterance and its source."""

    def __init__(self, utt: str, source: str, message: str) -> None:
        self.utt = utt
        self.source = source
        self.message = message
        super().__init__(f"utterance '{utt}' ({source}): {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses a process boundary (a DataLoader worker) as itself
        return _restore, (type(self), self.args, self.__dict__)


class OutputError(RuntimeError):
    """Writing an output failed (a full disk, a quota, a file-size limit); names the file."""

    def __init__(self, path: str | os.PathLike[str], message: str) -> None:
        self.path = os.fspath(path)
        self.message = message
        super().__init__(f"{self.path}: cannot write: {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses a process boundary (a DataLoader worker) as itself
        return _restore, (type(self), self.args, self.__dict__)
