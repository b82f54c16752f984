"""Atomic file output: a crash never leaves a half-written file under the final name.

Write to a temporary file in the same directory, ``fsync`` it, then ``os.replace`` it
onto the final name (atomic on POSIX within one file system).  Readers therefore see
either the old complete file or the new complete file, never a prefix of it.  A write that
fails (a full disk: ``ENOSPC``, which names no file) is re-raised as an ``OSError`` naming the
output, and the temporary file is removed.  Temporary folders that become outputs
(:func:`make_temp_dir`) get the mode a ``mkdir`` gives, not ``mkdtemp``'s 0700.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open ``path`` for writing so that it appears only once the block exits cleanly.

    >>> with atomic_write("out.txt") as f:   # doctest: +SKIP
    ...     f.write("a 1\\n")
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        # mkstemp creates 0600; give the file the mode open() would (0666 less the umask),
        # so outputs stay readable by the group as on any shared cluster file system.
        os.fchmod(fd, 0o666 & ~umask())
        binary = "b" in mode
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if err.filename is None:  # a failed write (a full disk) names no file: name the output
            raise OSError(err.errno, err.strerror, path) from err
        raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def umask() -> int:
    """This process's umask (set and put back: there is no call that only reads it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_temp_dir(prefix: str, parent: str | os.PathLike[str]) -> Path:
    """A new empty folder in ``parent`` (``tempfile.mkdtemp``) with the mode ``mkdir`` would give
    it, 0777 less the umask: for a folder written in full and then renamed into place as an output
    (a data dir, a pack), which would otherwise stay ``drwx------``."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o777 & ~umask())
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_write(path) as f:
        f.write(text)
