"""Names for the speakers of a diarization: each cluster named by the enrolled speaker of a saved
enrolment (a gallery of ``identify --save``) when the model's calibrated evidence says it is that
speaker, ``unknown_<k>`` otherwise.

How (:func:`name_clusters`):

1. each cluster's windows (the windows whose centre lies in its turns) averaged as one test
   recording, each enrolled speaker the mean of its enrolment utterances in the scoring space, as
   ``identify`` enrols them (utterances of fewer than ``min_speech`` s of voiced speech left out);
2. the model's scoring of every cluster against every enrolled speaker (backend, AS-norm,
   calibration), centred as ``identify`` centres, on the enrolment and test recordings together:
   here the enrolment utterances and the recording's windows (or the ``domain`` the diarization was
   centred on, when one was given);
3. an assignment of clusters to enrolled speakers (Hungarian, :func:`scipy.optimize.linear_sum_assignment`)
   maximising the summed calibrated LLR above the threshold, so that **two clusters never take
   one name**; a cluster is named when its assigned speaker's LLR is above the threshold, else it
   is ``unknown_1``, ``unknown_2``, ... in order of first speech.  The threshold,
   :data:`NAME_THRESHOLD` (an LLR of 1.25, odds of 3.5 to 1 that the cluster is that speaker), was
   chosen by leave-one-corpus-out on simulated meetings of held-out LibriSpeech and
   speechocean762 speakers (egs/speechocean762/diar1/RESULTS.md, "Naming the speakers"): the
   scoring's decision threshold (0) names most strangers there, and ``identify``'s open-set rule
   (``log S - logit(p_known)``, growing with the ``S`` enrolled speakers) refused 82 % of the
   enrolled speech of a 20-speaker gallery: the model's calibration, fitted on single recordings
   of another corpus, gives a cluster's true speaker an LLR of about 2 there, not the ``log 20``
   the rule asks for.

What it guarantees: names are RTTM-safe (:func:`spkflow.diar.rttm.safe_id`; two enrolled names
that become one field are an error naming both); an ``unknown_<k>`` never repeats an enrolled
name; a model without a calibration is refused (there is no evidence to name by).

Anchor: pyannote.audio's pipelines label clusters ``SPEAKER_00``...; naming them is left to the
user (its tutorials compare cluster centroids with enrolment embeddings by cosine, with no
threshold from a calibration and no assignment, so two clusters can take one name).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spkflow.deploy.gallery import Gallery
from spkflow.diar.result import Diarization
from spkflow.diar.rttm import Turn, safe_id
from spkflow.diar.windows import Window
from spkflow.features.speech import MIN_SPEECH
from spkflow.score.model_scoring import MIN_DOMAIN, PAIR, Scoring

__all__ = ["NAME_THRESHOLD", "Naming", "enrolled_models", "name_clusters", "window_speakers"]

UNKNOWN = "unknown"
#: the calibrated LLR a cluster needs against an enrolled speaker to take its name (see the module doc)
NAME_THRESHOLD = 1.25


@dataclass(frozen=True)
class Naming:
    """What a cluster was called: its label in the diarization (``spk1``), the ``name`` it takes,
    the enrolled ``candidate`` the assignment gave it (or, left without one, its best, which may
    have gone to another cluster) and that candidate's calibrated ``llr`` (None: no window)."""

    cluster: str
    name: str
    candidate: str | None
    llr: float | None


def window_speakers(windows: Sequence[Window], turns: Sequence[Turn]) -> list[str]:
    """The speaker of each window: that of the turn holding the window's centre (the midpoint rule
    puts every window's centre inside its own turn), else of the turn nearest to it."""
    ts = sorted(turns, key=lambda t: (t.start, t.end))
    if not ts:
        raise ValueError("no turns to name windows by")
    starts = [t.start for t in ts]
    out = []
    for w in windows:
        c = 0.5 * (w.start + w.end)
        i = bisect.bisect_right(starts, c) - 1
        cand = [j for j in (i, i + 1) if 0 <= j < len(ts)]
        inside = [j for j in cand if ts[j].start <= c < ts[j].end]
        j = inside[0] if inside else min(cand, key=lambda j: min(abs(ts[j].start - c), abs(ts[j].end - c)))
        out.append(ts[j].speaker)
    return out


def enrolled_models(gallery: Gallery, min_speech: float = MIN_SPEECH) -> tuple[list[str], list[np.ndarray]]:
    """(RTTM-safe names, raw embeddings of each speaker's utterances) of a gallery, leaving out
    utterances of fewer than ``min_speech`` voiced seconds (unknown seconds are kept)."""
    keep = ~(gallery.speech < min_speech)
    groups: dict[str, list[np.ndarray]] = {}
    for spk, vec, ok in zip(gallery.speakers, gallery.emb, keep, strict=True):
        if ok:
            groups.setdefault(spk, []).append(vec)
    if not groups:
        raise ValueError(f"no enrolled speaker has an utterance of >= {min_speech:g} s of voiced speech")
    names: dict[str, str] = {}
    for spk in groups:
        n = safe_id(spk)
        if n in names:
            raise ValueError(f"enrolled speakers {names[n]!r} and {spk!r} are one RTTM field, {n!r}: rename one")
        names[n] = spk
    return list(names), [np.stack(groups[s]) for s in names.values()]


def name_clusters(
    diarization: Diarization,
    windows: Sequence[Window],
    x: np.ndarray,
    scoring: Scoring,
    gallery: Gallery,
    *,
    domain: np.ndarray | None = None,
    min_speech: float = MIN_SPEECH,
    threshold: float = NAME_THRESHOLD,
) -> tuple[Diarization, list[Naming]]:
    """``diarization`` with each cluster renamed (see the module doc), and what each was called.
    ``windows`` and their raw embeddings ``x`` are those the diarization was clustered from;
    ``threshold``: the LLR a name needs."""
    if scoring.calibration is None:
        raise ValueError(
            "naming speakers by a gallery needs the model's calibration (scoring.yaml with a calibration): "
            "without calibrated LLRs there is no evidence to name a speaker by"
        )
    clusters = diarization.speakers
    if not clusters:
        return diarization, []
    names, groups = enrolled_models(gallery, min_speech)
    x = np.asarray(x, dtype=np.float64)
    spk = np.array(window_speakers(windows, diarization.turns))
    tests = np.stack([x[spk == c].mean(axis=0) if (spk == c).any() else np.full(x.shape[1], np.nan) for c in clusters])
    if domain is not None:
        dom: np.ndarray | str | None = domain
    else:  # as identify's auto: the enrolment and the test recordings, if enough
        pool = np.concatenate([gallery.emb.astype(np.float64), x])
        dom = pool if len(pool) >= MIN_DOMAIN else PAIR
    if not scoring.centres:
        dom = None
    found = np.isfinite(tests).all(axis=1)
    llr = np.full((len(clusters), len(names)), -np.inf)
    if found.any():
        models = scoring.enrol(groups, dom)
        got = scoring.llr(scoring.score_models(tests[found], models, dom))
        assert got is not None
        llr[found] = np.where(np.isfinite(got), got, -np.inf)
    stop = float(threshold)
    gain = np.where(llr > stop, llr - stop, 0.0)
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(gain, maximize=True)
    chosen = {int(i): int(j) for i, j in zip(rows, cols, strict=True) if gain[i, j] > 0}
    taken = set(names)
    k = 0
    out: list[Naming] = []
    rename: dict[str, str] = {}
    for i, c in enumerate(clusters):
        j = chosen.get(i, int(np.argmax(llr[i])) if names else None)
        best = None if j is None or not np.isfinite(llr[i, j]) else float(llr[i, j])
        if i in chosen and best is not None and best > stop:
            rename[c] = names[j]
        else:
            k += 1
            while f"{UNKNOWN}_{k}" in taken:
                k += 1
            rename[c] = f"{UNKNOWN}_{k}"
        out.append(Naming(c, rename[c], None if j is None else names[j], best))
    renamed = Diarization.of(diarization.recording, (t._replace(speaker=rename[t.speaker]) for t in diarization.turns))
    return renamed, out
