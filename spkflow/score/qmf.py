"""Quality-measure functions (QMF): scores calibrated with what makes a trial hard.

A QMF maps a trial's score and its quality measures to a log-likelihood ratio with one linear
logistic regression (:func:`spkflow.score.calibration.fit_logistic`, the project's one
calibration mechanism), fitted on trials drawn from the *training* set, never from a test list.
WeSpeaker (``examples/voxceleb/v2`` stage 7) and ESPnet (``spk.sh``'s ``qmf_func``) do the same
with their own quality measures; we take the three they use:

* ``duration``: log seconds of speech of each side (``utt2dur``),
* ``magnitude``: the L2 norm of each side's raw embedding (before centring and normalisation),
* ``imposter``: each side's AS-norm cohort mean (the mean of its top-K cohort scores),

each as the smaller and the larger of the two sides (a trial's features do not depend on which
side is the enrolment), after the score itself: ``[score, duration_min, duration_max, ...]``.

What this version guarantees:

* :func:`draw_trials` is deterministic (a seed), draws target pairs of two different
  utterances of one speaker and non-target pairs of two speakers, no pair twice, and says how
  many it could draw; a set with fewer than two speakers or no speaker of two utterances is an
  :class:`~spkflow.core.errors.InputError` naming the file.
* The calibration trials are scored exactly as a test set is (same centring, backend, AS-norm
  cohort and top-K), except that an utterance's own speaker is left out of its cohort: a test
  speaker is never in the training cohort, so its imposter statistics must not be either.
  (WeSpeaker's and ESPnet's recipes score training trials against a cohort that holds the
  trial's own speaker.)
* The fitted map is a JSON file (:meth:`LogisticCalibration.to_dict` plus the measures and the
  trial counts); applying it to a set that lacks a measure it was fitted with is an error
  naming the missing file, not a silently different model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spkflow.core import jsonsafe
from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError
from spkflow.data.tables import read_kv
from spkflow.score.calibration import LogisticCalibration, fit_logistic
from spkflow.score.trial_scoring import ScoreResult, Trials

__all__ = ["MEASURES", "draw_trials", "load_qmf", "qmf_features", "read_durations", "save_qmf", "fit_qmf"]

#: the quality measures, in the order of the feature columns
MEASURES = ("duration", "magnitude", "imposter")


def read_durations(path: str | os.PathLike[str]) -> dict[str, float]:
    """``utt2dur`` as floats; a bad line is an :class:`InputError` naming the file and line."""
    out = {}
    for n, (utt, value) in enumerate(read_kv(path).items(), start=1):
        try:
            out[utt] = float(value)
        except ValueError:
            raise InputError(path, n, f"duration of {utt!r} is not a number: {value!r}") from None
        if not out[utt] > 0:
            raise InputError(path, n, f"duration of {utt!r} must be > 0, got {value!r}")
    return out


def draw_trials(
    utt2spk: Mapping[str, str], n_target: int, n_nontarget: int, seed: int = 0, source: str = "utt2spk"
) -> Trials:
    """Target and non-target trials among the utterances of ``utt2spk`` (sorted first, so the
    draw depends on the seed only): each target pair two different utterances of one speaker
    (speakers drawn in proportion to their utterances), each non-target pair two speakers."""
    utts = sorted(utt2spk)
    spk_of = np.array([utt2spk[u] for u in utts])
    speakers, inverse = np.unique(spk_of, return_inverse=True)
    by_spk = [np.flatnonzero(inverse == i) for i in range(len(speakers))]
    multi = [g for g in by_spk if len(g) >= 2]
    if len(speakers) < 2 or not multi:
        raise InputError(source, None, "QMF trials need two speakers and a speaker with two utterances")
    rng = np.random.default_rng([int(seed), 0x716D66])  # "qmf"
    possible = sum(len(g) * (len(g) - 1) // 2 for g in multi)  # distinct target pairs there are
    n_target = min(int(n_target), possible)
    n_nontarget = min(int(n_nontarget), len(utts) * (len(utts) - 1) // 2 - possible)
    weights = np.array([len(g) for g in multi], dtype=np.float64)
    pairs: dict[tuple[int, int], bool] = {}
    counts = [0, 0]  # non-target, target
    tries = 0
    while counts[1] < n_target and tries < 20 * n_target + 100:
        tries += 1
        g = multi[int(rng.choice(len(multi), p=weights / weights.sum()))]
        a, b = sorted(int(v) for v in rng.choice(g, size=2, replace=False))
        if (a, b) not in pairs:
            pairs[(a, b)] = True
            counts[1] += 1
    tries = 0
    while counts[0] < n_nontarget and tries < 20 * n_nontarget + 100:
        tries += 1
        a, b = sorted(int(v) for v in rng.integers(len(utts), size=2))
        if inverse[a] != inverse[b] and (a, b) not in pairs:
            pairs[(a, b)] = False
            counts[0] += 1
    order = sorted(pairs)
    return Trials.from_pairs(((utts[a], utts[b], pairs[(a, b)]) for a, b in order), path=f"<QMF trials of {source}>")


def qmf_features(
    result: ScoreResult,
    measures: Sequence[str],
    *,
    durations: Mapping[str, float] | None = None,
    magnitudes: Mapping[str, float] | None = None,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """The ``[n, 1 + 2 x len(measures)]`` features of ``result``'s trials (score, then the smaller
    and the larger of each measure over the two sides) and their names."""
    t = result.trials
    cols, names = [result.scores], ["score"]
    for m in measures:
        if m == "imposter":
            if result.enroll_mu is None:
                raise ValueError("the 'imposter' measure needs AS-norm (a cohort)")
            a, b = result.enroll_mu, result.test_mu
        else:
            table = durations if m == "duration" else magnitudes
            if table is None:
                raise ValueError(f"the {m!r} measure needs its values")
            a = np.array([table[u] for u in t.enroll], dtype=np.float64)
            b = np.array([table[u] for u in t.test], dtype=np.float64)
            if m == "duration":
                a, b = np.log(a), np.log(b)
        cols += [np.minimum(a, b), np.maximum(a, b)]
        names += [f"{m}_min", f"{m}_max"]
    return np.stack(cols, axis=1), tuple(names)


def fit_qmf(
    result: ScoreResult,
    measures: Sequence[str],
    *,
    durations: Mapping[str, float] | None = None,
    magnitudes: Mapping[str, float] | None = None,
    fitted_on: str = "",
    extra: Mapping[str, Any] | None = None,
) -> LogisticCalibration:
    """The QMF of ``measures`` fitted on the scored calibration trials ``result``."""
    x, names = qmf_features(result, measures, durations=durations, magnitudes=magnitudes)
    cal = fit_logistic(x, result.labels, names=names, fitted_on=fitted_on)
    return LogisticCalibration(cal.weights, cal.bias, cal.prior, cal.names, cal.fitted_on, dict(extra or {}))


def save_qmf(path: str | os.PathLike[str], cal: LogisticCalibration, measures: Sequence[str]) -> None:
    """Write the fitted QMF (and its measures) as JSON, atomically."""
    write_text_atomic(path, jsonsafe.dumps({"measures": list(measures), **cal.to_dict()}, indent=2) + "\n")


def load_qmf(path: str | os.PathLike[str]) -> tuple[LogisticCalibration, tuple[str, ...]]:
    """A QMF written by :func:`save_qmf`: (the calibration, its measures)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        measures = tuple(str(m) for m in d["measures"])
        cal = LogisticCalibration.from_dict(d)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(path, None, f"not a QMF file ({err}); re-run stage 6's QMF fit") from None
    unknown = [m for m in measures if m not in MEASURES]
    if unknown:
        raise InputError(path, None, f"unknown quality measure(s) {unknown}; known: {', '.join(MEASURES)}")
    return cal, measures
