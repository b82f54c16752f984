"""Where a data dir is written: a folder that may already hold a user's files.

:func:`data_dir_destination` is the one way stage-1 code (:func:`~spkflow.corpora.base.write_data_dir`,
so ``make_data_dir`` and ``prepare_corpus``) puts a data dir in place.  What it guarantees:

* **Nothing outside the data dir it writes is modified, moved or deleted.**  An existing
  non-empty ``DATA_DIR`` is replaced only when a marker file (:data:`MARKER`, listing the files
  written) says this code wrote it and it holds nothing else; otherwise the run is refused
  with one line naming the folder and what is in it, unless ``overwrite`` (``--overwrite``) is
  asked for.  Nothing is ever moved into a backup folder.
* **Sources stay apart.**  A source folder (the recordings) inside ``DATA_DIR`` or ``DATA_DIR``
  inside a source folder, and any audio file inside ``DATA_DIR``, is refused (paths compared
  after resolving symbolic links), even with ``overwrite``.
* **Complete or not at all.**  The files are written into a temporary folder beside
  ``DATA_DIR`` (same file system), checked there (:meth:`~spkflow.data.datadir.DataDir.validate`)
  and only then renamed into place, so a data dir that fails its checks never replaces the
  previous valid one.  It gets the mode a ``mkdir`` would (0777 less the umask).  A failed run
  leaves no temporary folder and no empty ``DATA_DIR``.
* **One run at a time.**  ``DATA_DIR`` is locked (:mod:`spkflow.core.lock`) from the check of
  its contents to the rename; a second run is refused naming the first one's pid and command.
  The lock travels into the new folder before the rename and is released after it.
* A write that fails (a full disk) is one :class:`~spkflow.core.errors.OutputError` line naming
  the folder.

Kaldi's and ESPnet's ``local/data.sh`` scripts write into ``data/x`` in place (a stale
``feats.scp`` stays next to the new ``wav.scp``) and take no lock; lhotse writes manifests
beside each other without a marker.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from spkflow.core import lock
from spkflow.core.atomic import make_temp_dir
from spkflow.core.errors import InputError, OutputError

__all__ = ["MARKER", "check_apart", "check_destination", "data_dir_destination", "read_marker"]

log = logging.getLogger(__name__)

#: the file that says "spkflow wrote this data dir", with the names of the files it wrote
MARKER = ".spkflow-data-dir"
_HEADER = "# written by spkflow (spkflow.corpora.destination); the files it wrote:\n"


def read_marker(directory: Path) -> set[str] | None:
    """The files listed by ``directory``'s marker, or None when it has none."""
    try:
        text = (directory / MARKER).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return {line for line in text.splitlines() if line and not line.startswith("#")}


def _real(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.path.abspath(path)))


def _inside(a: Path, b: Path) -> bool:
    """Whether ``a`` is ``b`` or lies below it (both resolved)."""
    return a == b or b in a.parents


def check_apart(out: Path, sources: Iterable[str | os.PathLike[str]], files: Iterable[str] = ()) -> None:
    """Refuse a source folder inside ``out``, ``out`` inside a source folder, or a file of
    ``files`` inside ``out`` (all resolved): replacing ``out`` would delete them."""
    real_out = _real(out)
    for src in sources:
        real = _real(src)
        if _inside(real, real_out):
            raise InputError(
                src, None, f"the recordings are inside the data dir {out} ({real}): choose a DATA_DIR elsewhere"
            )
        if _inside(real_out, real):
            raise InputError(
                out,
                None,
                f"the data dir would be inside the recordings' folder {src} ({real}): choose a DATA_DIR elsewhere",
            )
    for f in files:
        if _inside(_real(f), real_out):
            raise InputError(f, None, f"this audio file is inside the data dir {out}: choose a DATA_DIR elsewhere")


def _foreign(out: Path) -> list[str]:
    """What in ``out`` this code did not write (empty: ``out`` may be replaced)."""
    names = sorted(n for n in os.listdir(out) if n != MARKER and not lock.is_lock_file(n))
    if not names:
        return []
    written = read_marker(out)
    if written is None:
        return names
    return [n for n in names if n not in written]


def _refuse(out: Path, foreign: list[str]) -> InputError:
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    why = "was not written by spkflow" if read_marker(out) is None else "holds files spkflow did not write"
    return InputError(
        out,
        None,
        f"exists and {why} ({shown}); nothing was changed: choose another DATA_DIR, remove this one, or pass "
        "--overwrite true to replace the folder and everything in it",
    )


def check_destination(
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    sources: Iterable[str | os.PathLike[str]] = (),
    files: Iterable[str] = (),
) -> Path:
    """The checks :func:`data_dir_destination` makes before it writes anything (a command makes
    them first too, to refuse before reading the recordings); returns the resolved folder."""
    given = Path(out_dir)
    out = _real(given)  # a DATA_DIR that is a link: write where it points
    check_apart(out, sources, files)
    if out.exists() and not out.is_dir():
        raise InputError(given, None, "exists and is not a folder; nothing was changed")
    if out.is_dir() and not overwrite and (foreign := _foreign(out)):
        raise _refuse(given, foreign)
    return out


@contextlib.contextmanager
def data_dir_destination(
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    sources: Iterable[str | os.PathLike[str]] = (),
    files: Iterable[str] = (),
) -> Iterator[Path]:
    """A temporary folder beside ``out_dir`` to write the data dir into; on a clean exit of the
    block it is marked, and renamed onto ``out_dir`` (see the module docstring).

    The block validates what it wrote; an exception leaves ``out_dir`` as it was."""
    given = Path(out_dir)
    out = check_destination(given, overwrite=overwrite, sources=sources, files=files)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        created = False
        with contextlib.suppress(FileExistsError):
            out.mkdir()
            created = True
    except OSError as exc:
        raise OutputError(given, exc.strerror or str(exc)) from None
    tmp: Path | None = None
    swapped = False
    with _signals_exit():  # a SIGTERM too runs the clean-up below
        try:
            try:
                lock.acquire(out)
            except lock.LockError as exc:
                raise InputError(given, None, f"{exc}; nothing was changed") from None
            except FileNotFoundError:  # renamed away under us by a run putting its result in place
                raise InputError(given, None, "is being replaced by another run; nothing was changed") from None
            except OSError as exc:
                raise OutputError(given, exc.strerror or str(exc)) from None
            if not overwrite and (foreign := _foreign(out)):  # written meanwhile by someone else
                raise _refuse(given, foreign)
            try:
                tmp = make_temp_dir(f".{out.name}.tmp.", out.parent)
            except OSError as exc:
                raise OutputError(out.parent, exc.strerror or str(exc)) from None
            try:
                yield tmp
            except OSError as exc:
                if exc.filename is None or _inside(_real(exc.filename), _real(tmp)):  # a write failed: a full disk
                    raise OutputError(given, exc.strerror or str(exc)) from None
                raise
            try:
                names = sorted(os.listdir(tmp))
                (tmp / MARKER).write_text(_HEADER + "".join(f"{n}\n" for n in names), encoding="utf-8")
                _swap(tmp, out)
            except OSError as exc:
                raise OutputError(given, exc.strerror or str(exc)) from None
            swapped = True
        finally:
            if tmp is not None and tmp.exists() and not swapped:
                shutil.rmtree(tmp, ignore_errors=True)
            lock.release(out)
            if created and not swapped:
                with contextlib.suppress(OSError):
                    out.rmdir()  # only when empty: a run that got the lock meanwhile keeps it


@contextlib.contextmanager
def _signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` in the block (main thread only), so a
    killed run still removes its temporary folder and lock; SIGINT already raises."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, _exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the C
    library or the file system has no such call (then :func:`_swap` renames twice)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if call(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap(tmp: Path, out: Path) -> None:
    """Put ``tmp`` in place of ``out`` (whose lock this process holds); delete the previous ``out``.

    The new folder carries this process's lock the moment it appears under the final name, and
    where the system can exchange two folders in one step, ``out`` never goes missing, so a
    second run always finds it locked."""
    lock.acquire(tmp)
    if _exchange(tmp, out):
        _remove_previous(tmp)  # now the previous contents, with the previous lock file
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    os.replace(out, old)  # onto the empty placeholder
    try:
        os.replace(tmp, out)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            os.replace(old, out)
            raise
        # another run made DATA_DIR in the instant it was away: it wins, ours is dropped
        shutil.rmtree(old, ignore_errors=True)
        raise InputError(
            out, None, "another run wrote this data dir at the same moment; this run's result was dropped"
        ) from None
    _remove_previous(old)


def _remove_previous(path: Path) -> None:
    """Delete the replaced folder.  A contender may write its lock temporary into it in the
    instant after the swap (it looked the folder up by the old name), which makes one ``rmtree``
    fail with 'directory not empty' although the new data dir is in place: try again."""
    for _ in range(3):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            time.sleep(0.05)
    shutil.rmtree(path, ignore_errors=True)
