"""Time regions of one recording: sorted, disjoint ``[start, end)`` intervals in seconds.

The few operations the diarization stages share: the union of overlapping intervals (speech of
a reference = the union of its turns), the intersection with another set (speech inside the
scored UEM), clipping to a duration, dropping short pieces and filling short gaps.  Every
function returns a new sorted list of disjoint intervals with ``end > start``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["Regions", "clip", "intersect", "merge_gaps", "total", "union"]

Regions = list[tuple[float, float]]


def union(intervals: Iterable[tuple[float, float]]) -> Regions:
    """Sorted disjoint union; touching intervals are joined, empty ones dropped."""
    out: Regions = []
    for s, e in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def intersect(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> Regions:
    """The parts of ``a`` inside ``b`` (both any intervals; normalised first)."""
    a, b = union(a), union(b)
    out: Regions = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(regions: Sequence[tuple[float, float]], duration: float) -> Regions:
    """``regions`` cut to ``[0, duration)``."""
    return intersect(regions, [(0.0, duration)])


def merge_gaps(regions: Sequence[tuple[float, float]], min_gap: float = 0.0, min_len: float = 0.0) -> Regions:
    """Gaps shorter than ``min_gap`` filled, then pieces shorter than ``min_len`` dropped."""
    out: Regions = []
    for s, e in union(regions):
        if out and s - out[-1][1] < min_gap:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return [(s, e) for s, e in out if e - s >= min_len]


def total(regions: Iterable[tuple[float, float]]) -> float:
    """Summed length of ``regions`` (of their union)."""
    return sum(e - s for s, e in union(regions))
