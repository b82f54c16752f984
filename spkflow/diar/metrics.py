"""Diarization figures with ``pyannote.metrics``: DER in the three standard conditions, JER and the
speaker-count error, per recording and over a set.

Conditions (those of Landini et al.'s VBx papers and of the DIHARD / VoxConverse reports):

=========  ==========================================  ===================================
name       what is not scored                          pyannote.metrics call
=========  ==========================================  ===================================
forgiving  0.25 s each side of every reference         ``DiarizationErrorRate(collar=0.5,
           boundary, and overlapped speech             skip_overlap=True)``
fair       0.25 s each side of every boundary          ``DiarizationErrorRate(collar=0.5)``
full       nothing                                     ``DiarizationErrorRate(collar=0.0)``
=========  ==========================================  ===================================

**The collar convention.**  pyannote.metrics' ``collar`` is the *total* width of the region
removed around a reference boundary (``collar / 2`` on each side: pyannote/metrics/utils.py
centres a segment of length ``collar`` on each boundary); NIST's md-eval ``-c`` is the width on
*each* side.  md-eval ``-c 0.25`` (the "0.25 s collar" of every paper) is therefore pyannote
``collar=0.5``.  Passing ``collar=0.25`` to pyannote scores a 0.125 s collar and reports a
higher DER than the papers it is compared with.

JER (Jaccard error rate, DIHARD II) uses no collar and scores overlap; it is undefined for a
recording without reference speakers (reported as NaN and left out of the mean).  The
speaker-count error is ``|hypothesis speakers - reference speakers|`` per recording, counted
inside the scored regions (pyannote's ``DiarizationSpeakerCountError``), and its mean.  Every
figure is computed inside the recording's UEM (all of it when there is none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spkflow.diar.regions import Regions
from spkflow.diar.rttm import Turn

__all__ = ["CONDITIONS", "COLLAR_PYANNOTE", "DiarScores", "format_table", "optimal_mapping", "score_diarization"]

#: pyannote.metrics' collar for md-eval's 0.25 s on each side (see the module doc)
COLLAR_PYANNOTE = 0.5
#: name -> (pyannote collar, skip_overlap)
CONDITIONS = {"forgiving": (COLLAR_PYANNOTE, True), "fair": (COLLAR_PYANNOTE, False), "full": (0.0, False)}


@dataclass
class DiarScores:
    """Figures in percent (speaker-count error in speakers): ``total`` over the set, ``rows`` per
    recording (recording id first)."""

    total: dict[str, float] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)


def _annotation(turns: Sequence[Turn], uri: str) -> Any:
    from pyannote.core import Annotation, Segment

    ann = Annotation(uri=uri)
    for i, t in enumerate(turns):
        ann[Segment(t.start, t.end), i] = t.speaker
    return ann


def _timeline(regions: Regions, uri: str) -> Any:
    from pyannote.core import Segment, Timeline

    return Timeline([Segment(s, e) for s, e in regions], uri=uri)


def score_diarization(
    reference: Mapping[str, Sequence[Turn]],
    hypothesis: Mapping[str, Sequence[Turn]],
    scored: Mapping[str, Regions],
) -> DiarScores:
    """Score ``hypothesis`` against ``reference`` over the recordings of ``scored``
    (``recording -> scored regions``); a recording missing from either side has no turns."""
    try:
        from pyannote.metrics.diarization import DiarizationErrorRate, DiarizationSpeakerCountError, JaccardErrorRate
    except ImportError:
        raise RuntimeError("diarization scoring needs pyannote.metrics (pip install pyannote.metrics)") from None
    ders = {name: DiarizationErrorRate(collar=c, skip_overlap=o) for name, (c, o) in CONDITIONS.items()}
    jer = JaccardErrorRate(collar=0.0)
    count = DiarizationSpeakerCountError()
    out = DiarScores()
    jer_values: list[float] = []
    for rec in scored:
        ref = _annotation(reference.get(rec, []), rec)
        hyp = _annotation(hypothesis.get(rec, []), rec)
        uem = _timeline(scored[rec], rec)
        row: dict[str, Any] = {"recording": rec}
        for name, metric in ders.items():
            d = metric(ref, hyp, uem=uem, detailed=True)
            row[f"der_{name}"] = 100.0 * d["diarization error rate"]
            if name == "full":
                tot = d["total"] or 1.0
                row["miss"] = 100.0 * d["missed detection"] / tot
                row["fa"] = 100.0 * d["false alarm"] / tot
                row["conf"] = 100.0 * d["confusion"] / tot
                row["speech"] = d["total"]
        if ref.labels():
            row["jer"] = 100.0 * jer(ref, hyp, uem=uem)
            jer_values.append(row["jer"])
        else:
            row["jer"] = math.nan
        row["ref_spk"] = len(ref.crop(uem).labels()) if ref.labels() else 0
        row["hyp_spk"] = len(hyp.crop(uem).labels()) if hyp.labels() else 0
        row["spk_err"] = float(count(ref, hyp, uem=uem))
        out.rows.append(row)
    for name, metric in ders.items():
        out.total[f"der_{name}"] = 100.0 * abs(metric)
    det = ders["full"].accumulated_
    tot = det["total"] or 1.0
    out.total["miss"] = 100.0 * det["missed detection"] / tot
    out.total["fa"] = 100.0 * det["false alarm"] / tot
    out.total["conf"] = 100.0 * det["confusion"] / tot
    out.total["jer"] = sum(jer_values) / len(jer_values) if jer_values else math.nan
    out.total["spk_err"] = abs(count)
    out.total["recordings"] = len(out.rows)
    return out


def format_table(scores: DiarScores) -> str:
    """A Markdown table: one row per recording and the set's total (DER over the pooled time,
    JER and speaker-count error as means over recordings)."""
    head = (
        "| recording | DER forgiving | DER fair | DER full | miss | FA | conf. | JER | ref. spk | hyp. spk |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )

    def line(r: Mapping[str, Any], name: str, spk: str) -> str:
        return (
            f"| {name} | {r['der_forgiving']:.2f} | {r['der_fair']:.2f} | {r['der_full']:.2f} | {r['miss']:.2f} | "
            f"{r['fa']:.2f} | {r['conf']:.2f} | {r['jer']:.2f} | {spk} |\n"
        )

    body = "".join(line(r, r["recording"], f"{r['ref_spk']} | {r['hyp_spk']}") for r in scores.rows)
    t = scores.total
    return head + body + line(t, "**all**", f"speaker-count error {t['spk_err']:.2f} (mean) |")


def optimal_mapping(reference: Sequence[Turn], hypothesis: Sequence[Turn], recording: str) -> dict[str, str]:
    """Hypothesis speaker -> reference speaker of the DER's optimal (Hungarian) mapping."""
    from pyannote.metrics.diarization import DiarizationErrorRate

    m = DiarizationErrorRate().optimal_mapping(_annotation(reference, recording), _annotation(hypothesis, recording))
    return {str(k): str(v) for k, v in m.items()}
