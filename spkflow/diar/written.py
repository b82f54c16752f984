"""The files diarization wrote in a folder: the marker that tells spkflow's outputs (RTTMs, plots)
from a user's files, so that nothing spkflow writes replaces a file it did not write.

A folder's marker :data:`MARKER` lists, one per line, each file spkflow wrote there with a
fingerprint of what made it (``-``: entered, not finished).  :func:`diarize_files
<spkflow.diar.file_list.diarize_files>` (the command), :meth:`Diarization.to_rttm
<spkflow.diar.result.Diarization.to_rttm>` and the command's plots all go through it.

What it guarantees
------------------
* **A user's file is never replaced**: a name that exists and is not in the marker is refused
  (:func:`foreign`), unless the caller was told to overwrite; the folder's other files are never
  touched.
* **One writer at a time per folder** (:func:`spkflow.core.lock.hold`), and the marker written
  atomically, so a killed run leaves it readable (its unfinished entries are ``-``).

pyannote.core's ``Annotation.write_rttm`` writes to an open file and replaces whatever the caller
opened; ESPnet's diarization scripts write where told.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from spkflow.core import lock
from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError, OutputError

__all__ = ["MARKER", "PENDING", "foreign", "holding", "read_marker", "refuse_foreign", "write_marker"]

#: the file in a folder that lists the files spkflow's diarization wrote there, each with a fingerprint
MARKER = ".spkflow-rttm"
#: the fingerprint of a file entered in the marker and not finished
PENDING = "-"
_HEADER = "# written by spkflow (spkflow.diar): the files it wrote here, each with a fingerprint\n"


def read_marker(folder: str | os.PathLike[str]) -> dict[str, str]:
    """``name -> fingerprint`` of the files spkflow wrote in ``folder`` (empty: none, or no folder)."""
    try:
        text = (Path(folder) / MARKER).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}
    rows = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {r[0]: r[1] for r in rows if len(r) == 2}


def write_marker(folder: str | os.PathLike[str], written: Mapping[str, str]) -> None:
    """Write ``folder``'s marker (atomically)."""
    write_text_atomic(Path(folder) / MARKER, _HEADER + "".join(f"{n} {p}\n" for n, p in sorted(written.items())))


def foreign(folder: str | os.PathLike[str], names: Sequence[str], written: Mapping[str, str]) -> list[str]:
    """The ``names`` that exist in ``folder`` and are not in ``written`` (its marker)."""
    return [n for n in names if os.path.lexists(Path(folder) / n) and n not in written]


def refuse_foreign(folder: str | os.PathLike[str], names: Sequence[str], *, overwrite: bool = False) -> dict[str, str]:
    """Refuse a ``folder`` that is a file, a name of ``names`` that is a folder there, or one that
    spkflow did not write (unless ``overwrite``), naming them; returns the marker."""
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise InputError(out, None, "exists and is a file, not a folder: give a folder for the outputs")
    for n in names:
        if (out / n).is_dir():
            raise InputError(out / n, None, "is a folder where an output of spkflow would go")
    written = read_marker(out)
    mine = foreign(out, names, written)
    if mine and not overwrite:
        shown = ", ".join(mine[:5]) + (f" and {len(mine) - 5} more" if len(mine) > 5 else "")
        raise InputError(
            out,
            None,
            f"holds {shown}, not written by spkflow (not in its {MARKER}); nothing was changed: choose another "
            "folder, move them, or pass --overwrite true (overwrite=True) to replace them",
        )
    return written


@contextmanager
def holding(
    folder: str | os.PathLike[str], names: Sequence[str], *, overwrite: bool = False
) -> Iterator[dict[str, str]]:
    """``folder`` made and locked for the block, ``names`` checked again under the lock
    (:func:`refuse_foreign`); yields its marker (write it back with :func:`write_marker`)."""
    out = Path(folder)
    refuse_foreign(out, names, overwrite=overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(out, exc.strerror or str(exc)) from None
    with lock.hold(out):
        yield refuse_foreign(out, names, overwrite=overwrite)
