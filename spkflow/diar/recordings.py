"""Recording-level data dirs: the input of a diarization recipe, checked as a whole.

A recording dir holds ``wav.scp`` (``recording audio``, one long recording per line, any entry
:mod:`spkflow.data.audio` reads), and optionally ``rttm`` (the reference turns), ``uem`` (the
scored regions) and ``reco2dur`` (``recording seconds``).

What :func:`load_recordings` guarantees
---------------------------------------
* ``wav.scp`` is ``LC_ALL=C`` sorted without duplicate keys (Kaldi's rule for every table).
* An RTTM or UEM line naming a recording that is not in ``wav.scp`` is an error naming the file,
  the line and the recording (a reference that silently scored nothing would read as perfect).
* A turn ending more than :data:`MAX_OVERSHOOT` seconds after its recording is an error naming its
  line; one ending within that is cut at the end (as Kaldi's ``extract-segments`` tolerates).
* Overlapping turns of *different* speakers are overlapped speech and kept as they are; the turns
  of *one* speaker that overlap or touch are merged into one (a speaker speaks once at a time;
  pyannote.metrics would do the same), and the merges are counted in :attr:`RecordingSet.notes`.
* ``reco2dur`` is read when present (keys must be those of ``wav.scp``), else measured from the
  audio headers (:func:`spkflow.data.audio.spec_duration`).
* A recording of ``wav.scp`` without reference turns has none: all of it is non-speech (a silent
  recording is a valid one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from spkflow.core.errors import InputError
from spkflow.data.audio import spec_duration
from spkflow.data.durations import format_duration
from spkflow.data.tables import c_key, c_sorted, read_kv, write_kv
from spkflow.diar.regions import Regions, union
from spkflow.diar.rttm import Turn, read_rttm, read_uem, write_rttm, write_uem

__all__ = ["MAX_OVERSHOOT", "RecordingSet", "describe", "load_recordings", "merge_speaker_turns", "write_recordings"]

#: how far (seconds) a reference turn may run past its recording before it is an error
MAX_OVERSHOOT = 0.5


@dataclass
class RecordingSet:
    """A loaded recording dir: ``wav`` (recording -> wav.scp entry, sorted), ``durations``,
    ``turns`` (recording -> sorted turns; None without an ``rttm``), ``uem`` (recording -> scored
    regions; None without a ``uem``) and ``notes`` (what was repaired, in words)."""

    path: Path
    wav: dict[str, str]
    durations: dict[str, float]
    turns: dict[str, list[Turn]] | None = None
    uem: dict[str, Regions] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def recordings(self) -> list[str]:
        return list(self.wav)

    def scored(self, rec: str) -> Regions:
        """The scored regions of ``rec``: its UEM, or all of it."""
        if self.uem is not None and rec in self.uem:
            return self.uem[rec]
        return [(0.0, self.durations[rec])]


def merge_speaker_turns(turns: list[Turn]) -> tuple[list[Turn], int]:
    """Each speaker's overlapping or touching turns joined; returns (sorted turns, joins made)."""
    by_spk: dict[str, list[tuple[float, float]]] = {}
    for t in turns:
        by_spk.setdefault(t.speaker, []).append((t.start, t.end))
    out: list[Turn] = []
    joins = 0
    rec = turns[0].recording if turns else ""
    for spk, spans in by_spk.items():
        merged = union(spans)
        joins += len(spans) - len(merged)
        out += [Turn(rec, s, e, spk) for s, e in merged]
    return sorted(out, key=lambda t: (t.start, t.end, c_key(t.speaker))), joins


def load_recordings(data_dir: str | os.PathLike[str], *, need_rttm: bool = False) -> RecordingSet:
    """Read and check a recording dir (see the module doc); ``need_rttm``: the reference is required."""
    d = Path(data_dir)
    wav_path = d / "wav.scp"
    wav = read_kv(wav_path)
    keys = list(wav)
    if keys != c_sorted(keys):
        first = next(i for i, (a, b) in enumerate(zip(keys, c_sorted(keys), strict=True)) if a != b)
        raise InputError(
            wav_path, first + 1, f"not sorted in LC_ALL=C order at {keys[first]!r} (utils/fix_data_dir.sh)"
        )
    if not keys:
        raise InputError(wav_path, None, "no recordings")
    r2d_path = d / "reco2dur"
    if r2d_path.is_file():
        raw = read_kv(r2d_path, num_fields=2)
        if set(raw) != set(wav):
            odd = c_sorted(set(raw) ^ set(wav))[:3]
            raise InputError(r2d_path, None, f"recordings differ from {wav_path}: {', '.join(odd)}")
        durations = {}
        for n, (k, v) in enumerate(raw.items(), 1):
            try:
                durations[k] = float(v)
            except ValueError:
                raise InputError(r2d_path, n, f"duration {v!r} of {k!r} is not a number") from None
    else:
        durations = {k: spec_duration(v, k, table=True) for k, v in wav.items()}
    out = RecordingSet(d, wav, durations)
    rttm_path = d / "rttm"
    if rttm_path.is_file():
        out.turns = _checked_turns(rttm_path, out)
    elif need_rttm:
        raise InputError(rttm_path, None, "no such file: the reference turns are needed here")
    uem_path = d / "uem"
    if uem_path.is_file():
        uem = read_uem(uem_path)
        for rec in uem:
            if rec not in wav:
                raise InputError(uem_path, None, f"recording {rec!r} is not in {wav_path}")
        out.uem = {r: union(v) for r, v in uem.items()}
    return out


def _checked_turns(rttm_path: Path, rs: RecordingSet) -> dict[str, list[Turn]]:
    rttm = read_rttm(rttm_path)
    by_rec: dict[str, list[Turn]] = {r: [] for r in rs.wav}
    for t, n in zip(rttm.turns, rttm.lines, strict=True):
        if t.recording not in rs.wav:
            raise InputError(rttm_path, n, f"recording {t.recording!r} is not in {rs.path / 'wav.scp'}")
        dur = rs.durations[t.recording]
        if t.end > dur + MAX_OVERSHOOT:
            raise InputError(
                rttm_path, n, f"turn ends at {t.end:.3f} s, after the end of {t.recording!r} ({dur:.3f} s)"
            )
        if t.start >= dur:
            continue
        by_rec[t.recording].append(t._replace(end=min(t.end, dur)))
    joins = 0
    for rec, turns in by_rec.items():
        by_rec[rec], j = merge_speaker_turns(turns)
        joins += j
    if joins:
        rs.notes.append(f"{rttm_path}: {joins} overlapping turns of one speaker merged")
    if rttm.dropped:
        rs.notes.append(f"{rttm_path}: {rttm.dropped} turns of zero duration left out")
    return by_rec


def write_recordings(
    data_dir: str | os.PathLike[str],
    wav: dict[str, str],
    durations: dict[str, float],
    turns: list[Turn] | None = None,
    uem: dict[str, Regions] | None = None,
) -> Path:
    """Write a recording dir: ``wav.scp``, ``reco2dur`` and, when given, ``rttm`` and ``uem``."""
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    write_kv(d / "wav.scp", wav)
    write_kv(d / "reco2dur", {k: format_duration(v) for k, v in durations.items()})
    if turns is not None:
        write_rttm(d / "rttm", turns)
    if uem is not None:
        write_uem(d / "uem", uem)
    return d


def describe(rs: RecordingSet) -> str:
    """One line: recordings, hours and, with a reference, speakers, speech and overlap."""
    from spkflow.diar.regions import intersect, total

    hours = sum(rs.durations.values()) / 3600
    text = f"{len(rs.wav)} recordings, {hours:.2f} h"
    if rs.turns is None:
        return text + ", no reference"
    counts = [len({t.speaker for t in v}) for v in rs.turns.values()]
    speech = overlap = 0.0
    for turns in rs.turns.values():
        spans = [(t.start, t.end) for t in turns]
        speech += total(spans)
        pairs = [intersect([a], [b]) for i, a in enumerate(spans) for b in spans[i + 1 :] if b[0] < a[1]]
        overlap += total([r for p in pairs for r in p])
    return (
        f"{text}, {min(counts)}-{max(counts)} speakers per recording, speech {speech / 3600:.2f} h "
        f"({100 * speech / max(hours * 3600, 1e-9):.0f}%), {100 * overlap / max(speech, 1e-9):.1f}% of it overlapped"
    )
