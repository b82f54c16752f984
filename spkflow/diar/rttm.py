"""RTTM and UEM files: who spoke when, and which part of a recording is scored.

RTTM (NIST Rich Transcription Time Marked), one turn per line, ten fields::

    SPEAKER <recording> <channel> <onset> <duration> <NA> <NA> <speaker> <NA> <NA>

UEM (un-partitioned evaluation map), one scored region per line: ``<recording> <channel> <start> <end>``.

What it guarantees
------------------
* Every bad line is an :class:`~spkflow.core.errors.InputError` naming the file, the 1-based line
  and the field: ``ref.rttm:17: field 5 (duration): '-0.3' is not a positive number``.  Lines of
  the other RTTM types (``SPKR-INFO``, ``LEXEME``, ...) and comments (``;;``) are skipped, as
  md-eval skips them.  A line of 9 fields (no signal-lookahead field) is accepted as the same
  turn: ESPnet's diarization recipes write and read exactly 9 (``espnet2/fileio/rttm.py``) and
  dscore reads any line of at least 9, while md-eval and pyannote write 10; the speaker is field 8
  in both.  Any other count is an error naming it.
* A turn of zero duration is dropped (it scores nothing) and counted in :attr:`Rttm.dropped`.
* Speaker and recording ids are kept as UTF-8 text (AMI's ``MÉO069``).
* :func:`write_rttm` writes ten fields with millisecond times, turns sorted by (recording,
  onset, speaker), atomically (:mod:`spkflow.core.atomic`); a recording or speaker id that is
  empty or holds whitespace (which would shift every field after it: ``SPEAKER my meeting 1 ...``
  reads as recording ``my``) is refused, naming it; :func:`safe_id` makes one from any name.

Compared with pyannote.database's ``load_rttm`` (pandas ``read_csv``: a malformed line raises
a parser error without its field, a negative duration is read as it is) and md-eval's reader
(dies at the first bad line, without saying which field).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError
from spkflow.data.tables import c_key, read_lines, show_line, split_fields

__all__ = ["Rttm", "Turn", "read_rttm", "read_uem", "safe_id", "turns_by_recording", "write_rttm", "write_uem"]

#: the RTTM types other than SPEAKER (NIST RT-09 evaluation plan): skipped
_OTHER_TYPES = frozenset(
    "SEGMENT NOSCORE NO_RT_METADATA LEXEME NON-LEX NON-SPEECH FILLER EDIT IP SU CB A/P SPKR-INFO".split()
)
_RTTM_FIELDS = ("type", "recording", "channel", "onset", "duration", "ortho", "stype", "speaker", "conf", "slat")


class Turn(NamedTuple):
    """One speaker turn: ``[start, end)`` seconds of ``recording`` spoken by ``speaker``."""

    recording: str
    start: float
    end: float
    speaker: str

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Rttm:
    """The turns of an RTTM file in file order, with the line each came from."""

    path: str
    turns: list[Turn] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    dropped: int = 0

    def recordings(self) -> list[str]:
        """Recording ids in first-seen order."""
        return list(dict.fromkeys(t.recording for t in self.turns))


def _number(path: str, lineno: int, fields: list[str], i: int, *, positive: bool = False) -> float:
    try:
        v = float(fields[i])
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        what = "a non-negative number" if not positive else "a positive number"
        raise InputError(path, lineno, f"field {i + 1} ({_RTTM_FIELDS[i]}): {fields[i]!r} is not {what}")
    return v


def safe_id(name: str) -> str:
    """``name`` as one RTTM field: every run of whitespace made ``_`` (``my meeting`` ->
    ``my_meeting``), an empty name ``_``."""
    return "_".join(name.split()) or "_"


def _check_ids(path: str | os.PathLike[str], t: Turn) -> None:
    for what, v in (("recording", t.recording), ("speaker", t.speaker)):
        if safe_id(v) != v:
            raise ValueError(
                f"{os.fspath(path)}: {what} id {v!r} is empty or holds whitespace, which would shift the RTTM "
                f"fields after it; use {safe_id(v)!r} (spkflow.diar.rttm.safe_id)"
            )


def read_rttm(path: str | os.PathLike[str]) -> Rttm:
    """Read the ``SPEAKER`` lines of an RTTM file (see the module doc for what is checked)."""
    p = os.fspath(path)
    out = Rttm(p)
    for n, line in enumerate(read_lines(p), 1):
        f = split_fields(line)
        if not f or f[0].startswith(";;"):
            continue
        if f[0] != "SPEAKER":
            if f[0] in _OTHER_TYPES:
                continue  # another RTTM type: not a speaker turn
            raise InputError(p, n, f"field 1 (type): expected 'SPEAKER', got {show_line(line)}")
        if len(f) not in (9, 10):
            raise InputError(
                p, n, f"expected 10 fields 'SPEAKER rec chan onset dur <NA> <NA> spk <NA> <NA>', got {len(f)}"
            )
        onset = _number(p, n, f, 3)
        dur = _number(p, n, f, 4, positive=True)
        if dur == 0.0:
            out.dropped += 1
            continue
        out.turns.append(Turn(f[1], onset, onset + dur, f[7]))
        out.lines.append(n)
    return out


def turns_by_recording(turns: Iterable[Turn]) -> dict[str, list[Turn]]:
    """Turns grouped by recording, each group sorted by (start, end, speaker)."""
    out: dict[str, list[Turn]] = {}
    for t in turns:
        out.setdefault(t.recording, []).append(t)
    return {r: sorted(v, key=lambda t: (t.start, t.end, t.speaker)) for r, v in out.items()}


def write_rttm(path: str | os.PathLike[str], turns: Iterable[Turn]) -> None:
    """Write ``turns`` as ten-field RTTM lines (millisecond times), sorted, atomically; an id that
    is not one field (:func:`safe_id`) is a ``ValueError`` before anything is written."""
    rows = sorted(turns, key=lambda t: (c_key(t.recording), t.start, t.end, c_key(t.speaker)))
    for t in rows:
        _check_ids(path, t)
    with atomic_write(path) as fh:
        for t in rows:
            if t.end <= t.start:
                continue
            fh.write(f"SPEAKER {t.recording} 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {t.speaker} <NA> <NA>\n")


def read_uem(path: str | os.PathLike[str]) -> dict[str, list[tuple[float, float]]]:
    """``recording -> [(start, end), ...]`` of a UEM file (4 fields per line; end > start)."""
    p = os.fspath(path)
    out: dict[str, list[tuple[float, float]]] = {}
    for n, line in enumerate(read_lines(p), 1):
        f = split_fields(line)
        if not f or f[0].startswith(";;"):
            continue
        if len(f) != 4:
            raise InputError(p, n, f"expected 4 fields '<recording> <channel> <start> <end>', got {show_line(line)}")
        vals = []
        for i, name in ((2, "start"), (3, "end")):
            try:
                v = float(f[i])
            except ValueError:
                v = math.nan
            if not math.isfinite(v) or v < 0:
                raise InputError(p, n, f"field {i + 1} ({name}): {f[i]!r} is not a non-negative number")
            vals.append(v)
        if vals[1] <= vals[0]:
            raise InputError(p, n, f"field 4 (end): {f[3]} is not after the start {f[2]}")
        out.setdefault(f[0], []).append((vals[0], vals[1]))
    return out


def write_uem(path: str | os.PathLike[str], uem: Mapping[str, Iterable[tuple[float, float]]]) -> None:
    """Write ``recording -> regions`` as a UEM file, atomically."""
    with atomic_write(path) as fh:
        for rec in sorted(uem, key=c_key):
            for s, e in uem[rec]:
                fh.write(f"{rec} 1 {s:.3f} {e:.3f}\n")
