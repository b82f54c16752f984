"""Reference against hypothesis for one recording: a timeline a person can check at a glance.

Two panels over one time axis: the reference speakers' turns (overlapped speech shows as bars
at one instant on two rows) and the hypothesis speakers', each hypothesis speaker drawn in the
colour of the reference speaker it is mapped to by the optimal (DER) mapping, so that confusions
show as colour changes.  Without a reference (``python -m spkflow.bin.diarize --plot`` on a
detector's speech), one panel: the hypothesis, a colour per speaker.  Drawn with matplotlib's
object-oriented API on an Agg canvas (no pyplot, no global backend) and written atomically, as
:mod:`spkflow.score.plots` does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from spkflow.core.atomic import atomic_write
from spkflow.diar.rttm import Turn

__all__ = ["plot_diarization"]


def plot_diarization(
    path: str | os.PathLike[str],
    reference: Sequence[Turn] | None,
    hypothesis: Sequence[Turn],
    mapping: Mapping[str, str] | None = None,
    title: str = "",
) -> None:
    """Write the PNG ``path``; ``mapping``: hypothesis speaker -> reference speaker (colours);
    ``reference`` None: the hypothesis alone, a colour per speaker."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    hyp_spk = sorted({t.speaker for t in hypothesis})
    panels: list[tuple[Sequence[Turn], list[str], str]] = []
    if reference is not None:
        ref_spk = sorted({t.speaker for t in reference})
        colours = {s: f"C{i % 10}" for i, s in enumerate(ref_spk)}
        hyp_colours = {s: colours.get((mapping or {}).get(s, ""), "0.5") for s in hyp_spk}
        panels.append((reference, ref_spk, "reference"))
    else:
        colours = {}
        hyp_colours = {s: f"C{i % 10}" for i, s in enumerate(hyp_spk)}
    panels.append((hypothesis, hyp_spk, "hypothesis"))
    rows = sum(len(names) for _, names, _ in panels)
    fig = Figure(figsize=(12, 1.2 + 0.35 * rows), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False,
                        height_ratios=[max(len(names), 1) for _, names, _ in panels])[:, 0]  # fmt: skip
    for ax, (turns, names, label) in zip(axes, panels, strict=True):
        for row, spk in enumerate(names):
            spans = [(t.start, t.end - t.start) for t in turns if t.speaker == spk]
            colour = colours.get(spk, "0.5") if label == "reference" else hyp_colours[spk]
            ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour)
        ax.set_yticks(range(len(names)), names)
        ax.set_ylabel(label)
        ax.set_ylim(-0.6, max(len(names), 1) - 0.4)
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("time (s)")
    if title:
        axes[0].set_title(title)
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png")
