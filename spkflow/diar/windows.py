"""Sliding windows over speech, as a Kaldi data dir with ``segments``, and labelled windows back
to speaker turns.

:func:`plan_windows`: inside each speech region, windows of ``window`` seconds every ``shift``
seconds (default 1.5 s every 0.75 s, as Kaldi's ``callhome_diarization`` and WeSpeaker's
voxconverse recipe); the last window of a region ends at the region's end (so the region's tail
is seen by a full window, not by a short remainder); a region shorter than a window is one
window of its own length when it is at least ``min_window`` long, and no window otherwise (its
time is labelled from the nearest window, below).

:func:`write_window_dir` writes them as a data dir stage 5 embeds unchanged (``wav.scp`` of the
recordings, ``segments``, ``utt2spk`` / ``spk2utt`` with the recording as the "speaker", ids
``<recording>-<start ms>-<end ms>`` zero-padded so that ``LC_ALL=C`` order is time order).

:func:`windows_to_turns`: one speaker per instant.  Consecutive windows overlap; the instant
between two window starts belongs to the window whose centre is nearer, i.e. the boundary is the
midpoint of the overlap (WeSpeaker's and pyannote's "midpoint" rule).  Overlapped speech is
therefore never output: it is missed speech for every speaker but one (counted by DER's fair and
full conditions, skipped by the forgiving one).  Speech not covered by any window (regions
shorter than ``min_window``) takes the label of the nearest window in time; adjacent pieces of
one label are merged.  Labels are renamed ``spk1, spk2, ...`` in order of first appearance, so
the same clustering always gives the same file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from spkflow.core.errors import InputError
from spkflow.data.tables import c_sorted, read_kv_lines, split_fields, utt2spk_to_spk2utt, write_kv
from spkflow.diar.rttm import Turn

__all__ = [
    "Window",
    "check_windowing",
    "plan_windows",
    "read_window_dir",
    "relabel",
    "window_id",
    "windows_to_turns",
    "write_window_dir",
]


class Window(NamedTuple):
    """One sub-segment ``[start, end)`` of ``recording``, in seconds."""

    recording: str
    start: float
    end: float

    @property
    def id(self) -> str:
        return window_id(self.recording, self.start, self.end)


def window_id(recording: str, start: float, end: float) -> str:
    return f"{recording}-{round(start * 1000):08d}-{round(end * 1000):08d}"


def check_windowing(window: float, shift: float, min_window: float) -> None:
    """Refuse window settings :func:`plan_windows` cannot use (checked before any audio is read)."""
    if not (window > 0 and 0 < shift <= window and 0 < min_window <= window):
        raise ValueError(
            f"need window > 0, 0 < shift <= window and 0 < min_window <= window; got {window}, {shift}, {min_window}"
        )


def plan_windows(
    recording: str,
    regions: Sequence[tuple[float, float]],
    window: float = 1.5,
    shift: float = 0.75,
    min_window: float = 0.5,
) -> list[Window]:
    """Windows over ``regions`` (see the module doc), in time order."""
    check_windowing(window, shift, min_window)
    out: list[Window] = []
    for s, e in regions:
        if e - s < min_window:
            continue
        if e - s <= window:
            out.append(Window(recording, s, e))
            continue
        t = s
        while t + window < e - 1e-9:
            out.append(Window(recording, t, t + window))
            t += shift
        out.append(Window(recording, max(s, e - window), e))
    # millisecond ids must stay unique: a last window within 1 ms of the one before is dropped
    seen: set[str] = set()
    uniq = []
    for w in out:
        if w.id not in seen:
            seen.add(w.id)
            uniq.append(w)
    return uniq


def write_window_dir(out_dir: str | os.PathLike[str], wav: Mapping[str, str], windows: Sequence[Window]) -> Path:
    """A data dir of ``windows``: ``wav.scp`` (their recordings), ``segments``, ``utt2spk``, ``spk2utt``."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    if not windows:
        raise ValueError(f"{d}: no windows to write (no speech found in any recording)")
    recs = {w.recording for w in windows}
    write_kv(d / "wav.scp", {r: wav[r] for r in recs})
    write_kv(d / "segments", {w.id: f"{w.recording} {w.start:.3f} {w.end:.3f}" for w in windows})
    u2s = {w.id: w.recording for w in windows}
    write_kv(d / "utt2spk", u2s)
    write_kv(d / "spk2utt", {s: " ".join(c_sorted(u)) for s, u in utt2spk_to_spk2utt(u2s).items()})
    return d


def read_window_dir(data_dir: str | os.PathLike[str]) -> dict[str, list[Window]]:
    """``recording -> windows`` (time order) from a window dir's ``segments``."""
    path = Path(data_dir) / "segments"
    out: dict[str, list[Window]] = {}
    for n, (key, rest) in enumerate(read_kv_lines(path), 1):
        f = split_fields(rest)
        try:
            w = Window(f[0], float(f[1]), float(f[2]))
        except (IndexError, ValueError):
            raise InputError(path, n, f"expected '<window> <recording> <start> <end>', got {key} {rest}") from None
        out.setdefault(w.recording, []).append(w)
    return {r: sorted(v, key=lambda w: (w.start, w.end)) for r, v in out.items()}


def relabel(labels: Sequence[int]) -> list[int]:
    """Cluster labels renumbered 0, 1, ... in order of first appearance."""
    order: dict[int, int] = {}
    return [order.setdefault(int(c), len(order)) for c in labels]


def windows_to_turns(
    windows: Sequence[Window], labels: Sequence[int], regions: Sequence[tuple[float, float]]
) -> list[Turn]:
    """Speaker turns from labelled windows over ``regions`` (see the module doc)."""
    if len(windows) != len(labels):
        raise ValueError(f"{len(windows)} windows but {len(labels)} labels")
    if not windows:
        return []
    rec = windows[0].recording
    order = sorted(range(len(windows)), key=lambda i: (windows[i].start, windows[i].end))
    ws = [windows[i] for i in order]
    ls = relabel([labels[i] for i in order])
    pieces: list[tuple[float, float, int]] = []
    j = 0
    for rs, re_ in regions:
        inside = []
        while j < len(ws) and ws[j].start < re_ - 1e-9:
            if ws[j].end > rs + 1e-9:
                inside.append(j)
            j += 1
        if not inside:
            centre = 0.5 * (rs + re_)
            k = min(range(len(ws)), key=lambda i: abs(0.5 * (ws[i].start + ws[i].end) - centre))
            pieces.append((rs, re_, ls[k]))
            continue
        bounds = [rs]
        for a, b in zip(inside, inside[1:], strict=False):
            bounds.append(0.5 * (ws[b].start + ws[a].end))
        bounds.append(re_)
        pieces += [(bounds[i], bounds[i + 1], ls[k]) for i, k in enumerate(inside)]
    turns: list[Turn] = []
    for s, e, lab in pieces:
        if e <= s:
            continue
        if turns and turns[-1].speaker == f"spk{lab + 1}" and abs(turns[-1].end - s) < 1e-6:
            turns[-1] = turns[-1]._replace(end=e)
        else:
            turns.append(Turn(rec, s, e, f"spk{lab + 1}"))
    return turns
