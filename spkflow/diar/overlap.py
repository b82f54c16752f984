"""Overlapped speech: where two speakers talk at once, a second speaker beside the clustered one.

The pipeline (:mod:`spkflow.diar.pipeline`) gives one speaker per instant (the midpoint rule of
:func:`~spkflow.diar.windows.windows_to_turns`), so every second of overlapped speech is missed
speech in the fair and full DER (AMI: a quarter of the speech).  Given regions of overlapped
speech, :func:`add_second_speakers` labels each with a second speaker: the hypothesis speaker
nearest in time among those not already speaking there, the heuristic of Otterson & Ostendorf
(2007) that Bullock et al. (2020, "Overlap-aware diarization") build on: in conversations,
overlap is mostly at turn changes, where the other speaker is the previous or the next one.

The regions come from an RTTM through :func:`overlap_regions` (the instants where it has two or
more speakers): the reference RTTM gives *oracle overlap*, the analysis condition that says how
much an overlapped-speech detector could gain (the recipe's ``--overlap oracle``).

pyannote.audio assigns the second speaker from its segmentation model's frame-level speaker
activations, which spkflow does not have; VBx and Kaldi's x-vector recipes give one speaker per
frame and leave overlap missed.  This module's guarantees: the added turns lie inside the given
regions *and* inside the time the hypothesis already labels (no speech is added where the
pipeline found none), each names a speaker of the hypothesis other than the one there, and the
clustered turns are kept unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spkflow.diar.regions import Regions, intersect, union
from spkflow.diar.rttm import Turn

__all__ = ["add_second_speakers", "overlap_regions"]


def overlap_regions(turns: Sequence[Turn]) -> Regions:
    """The instants where two or more of ``turns`` (one recording; one speaker's own turns
    merged first) are active, as sorted, disjoint ``(start, end)`` regions."""
    by_speaker: dict[str, list[tuple[float, float]]] = {}
    for t in turns:
        by_speaker.setdefault(t.speaker, []).append((t.start, t.end))
    events = sorted((x, d) for spans in by_speaker.values() for s, e in union(spans) for x, d in ((s, 1), (e, -1)))
    out: list[tuple[float, float]] = []
    active, start = 0, 0.0
    for x, d in events:  # at one instant, ends (-1) sort before starts (+1): touching turns do not overlap
        before, active = active, active + d
        if before < 2 <= active:
            start = x
        elif active < 2 <= before and x > start:
            out.append((start, x))
    return union(out)


def add_second_speakers(turns: Sequence[Turn], regions: Sequence[tuple[float, float]]) -> list[Turn]:
    """``turns`` (one recording's hypothesis) plus, inside each of ``regions`` where the
    hypothesis has speech, a turn of the nearest other hypothesis speaker in time (see the module
    doc); sorted by start.  A hypothesis with one speaker is returned unchanged."""
    turns = sorted(turns, key=lambda t: (t.start, t.end, t.speaker))
    if len({t.speaker for t in turns}) < 2:
        return list(turns)
    labelled = union((t.start, t.end) for t in turns)
    starts = np.array([t.start for t in turns])
    ends = np.array([t.end for t in turns])
    names = sorted({t.speaker for t in turns})
    spk = np.array([names.index(t.speaker) for t in turns])
    added: list[Turn] = []
    for s, e in intersect(union(regions), labelled):
        # each stretch of the region under one set of hypothesis speakers gets its own second speaker
        inside = np.concatenate([starts[(starts > s) & (starts < e)], ends[(ends > s) & (ends < e)]])
        cuts = np.unique(np.concatenate([[s, e], inside]))
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            here = np.unique(spk[(starts < b) & (ends > a)])
            other = ~np.isin(spk, here)
            if not other.any():
                continue
            mid = 0.5 * (a + b)
            gap = np.maximum(0.0, np.maximum(starts - mid, mid - ends))
            k = np.flatnonzero(other)[np.argmin(gap[other])]  # the first such turn in start order on a tie
            who = names[spk[k]]
            if added and added[-1].speaker == who and abs(added[-1].end - a) < 1e-9:
                added[-1] = added[-1]._replace(end=float(b))
            else:
                added.append(Turn(turns[0].recording, float(a), float(b), who))
    return sorted([*turns, *added], key=lambda t: (t.start, t.end, t.speaker))
