"""Verification metrics: DET curve, equal error rate, normalised minimum DCF.

Conventions (shared by every function here):

* ``scores``: higher means "more likely the same speaker"; a trial is accepted when
  ``score >= threshold``.
* ``labels``: 1 (or True) for target trials, 0 for non-target trials.
* Tied scores are one operating point: the DET curve only contains error rates that some
  threshold really achieves (Kaldi's ``compute_min_dcf.py`` and ``espnet2.utils.eer``
  walk the sorted list one trial at a time and so can split a group of tied scores,
  reporting an operating point no threshold gives).  Without ties, ``compute_min_dcf``
  equals Kaldi's value (the test checks it against ``espnet2.utils.eer.ComputeMinDcf``,
  a copy of Kaldi's function).
* EER is read where the miss and false-alarm curves cross, interpolating linearly between
  the two operating points on either side; ``espnet2.utils.eer.tuneThresholdfromScore``
  instead reports ``max(P_miss, P_fa)`` at the sklearn ROC point nearest the crossing,
  which differs from ours by less than one trial's step (``100 / min(n_tar, n_non)`` %).

Everything is vectorised numpy (one sort, O(n log n)); ``espnet2.utils.eer``'s
``ComputeErrorRates`` is a Python loop over all trials.  Inputs are validated: equal
lengths, finite scores, at least one target and one non-target trial.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "DetCurve",
    "det_curve",
    "compute_eer",
    "eer_from_det",
    "compute_min_dcf",
    "min_dcf_with_threshold",
    "compute_metrics",
]


@dataclass(frozen=True)
class DetCurve:
    """Operating points ordered by increasing threshold.

    ``p_miss[k]`` / ``p_fa[k]``: miss and false-alarm rates when accepting trials with
    ``score >= thresholds[k]``.  The first point accepts everything (``p_miss = 0``,
    ``p_fa = 1``, threshold = lowest score), the last rejects everything
    (``p_miss = 1``, ``p_fa = 0``, threshold = +inf).
    """

    p_miss: np.ndarray
    p_fa: np.ndarray
    thresholds: np.ndarray
    n_target: int
    n_nontarget: int


def _validate(scores: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    lab = np.asarray(labels).reshape(-1)
    if s.shape != lab.shape:
        raise ValueError(f"scores ({s.size}) and labels ({lab.size}) differ in length")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"{int((~np.isfinite(s)).sum())} score(s) are not finite")
    if lab.dtype != bool:
        if not np.all((lab == 0) | (lab == 1)):
            raise ValueError("labels must be 0/1 (non-target/target)")
        lab = lab.astype(bool)
    n_tar = int(lab.sum())
    if n_tar == 0 or n_tar == lab.size:
        raise ValueError(
            f"need both target and non-target trials, got {n_tar} target(s) and {lab.size - n_tar} non-target(s)"
        )
    return s, lab


def det_curve(scores: ArrayLike, labels: ArrayLike) -> DetCurve:
    """Miss / false-alarm rates at every distinct threshold (see :class:`DetCurve`)."""
    s, lab = _validate(scores, labels)
    order = np.argsort(s, kind="mergesort")
    s_sorted, lab_sorted = s[order], lab[order]
    n_tar = int(lab.sum())
    n_non = lab.size - n_tar
    # boundaries between groups of tied scores: point k rejects the first `cut[k]` trials
    new_group = np.flatnonzero(np.diff(s_sorted) > 0) + 1
    cut = np.concatenate([[0], new_group, [s.size]])
    tar_below = np.concatenate([[0], np.cumsum(lab_sorted)])[cut]
    non_below = cut - tar_below
    p_miss = tar_below / n_tar
    p_fa = 1.0 - non_below / n_non
    thresholds = np.concatenate([s_sorted[cut[:-1]], [np.inf]])
    return DetCurve(p_miss, p_fa, thresholds, n_tar, n_non)


def compute_eer(scores: ArrayLike, labels: ArrayLike) -> tuple[float, float]:
    """Equal error rate in percent, and the threshold where it is reached.

    The crossing of P_miss and P_fa is interpolated linearly between the last operating
    point with ``P_miss < P_fa`` and the first with ``P_miss >= P_fa``; the threshold
    is interpolated the same way (the lower point's when the upper one rejects everything).
    """
    det = det_curve(scores, labels)
    return eer_from_det(det)


def eer_from_det(det: DetCurve) -> tuple[float, float]:
    """:func:`compute_eer` on a precomputed DET curve."""
    pm, pf, th = det.p_miss, det.p_fa, det.thresholds
    # first crossing; k >= 1 since point 0 has pm=0 < pf=1 and the last has pm=1 > pf=0
    k = int(np.argmax(pm >= pf))
    d_lo = pf[k - 1] - pm[k - 1]  # > 0
    d_hi = pm[k] - pf[k]  # >= 0
    t = d_lo / (d_lo + d_hi)
    eer = pm[k - 1] + t * (pm[k] - pm[k - 1])
    thr = th[k - 1] + t * (th[k] - th[k - 1]) if np.isfinite(th[k]) else th[k - 1]
    return 100.0 * float(eer), float(thr)


def compute_min_dcf(
    scores: ArrayLike, labels: ArrayLike, p_target: float, c_miss: float = 1.0, c_fa: float = 1.0
) -> float:
    """Normalised minimum detection cost (NIST SRE 2016 plan, Eqs. 2-4; Kaldi's
    ``compute_min_dcf.py``): ``min_t [c_miss P_miss(t) p_target + c_fa P_fa(t) (1 - p_target)]``
    divided by ``min(c_miss p_target, c_fa (1 - p_target))``."""
    value, _ = min_dcf_with_threshold(det_curve(scores, labels), p_target, c_miss, c_fa)
    return value


def min_dcf_with_threshold(
    det: DetCurve, p_target: float, c_miss: float = 1.0, c_fa: float = 1.0
) -> tuple[float, float]:
    """``(normalised minDCF, threshold reaching it)`` from a precomputed DET curve."""
    if not 0.0 < p_target < 1.0:
        raise ValueError(f"p_target must lie in (0, 1), got {p_target}")
    if c_miss <= 0 or c_fa <= 0:
        raise ValueError(f"costs must be > 0, got c_miss={c_miss}, c_fa={c_fa}")
    cost = c_miss * det.p_miss * p_target + c_fa * det.p_fa * (1.0 - p_target)
    k = int(np.argmin(cost))
    c_def = min(c_miss * p_target, c_fa * (1.0 - p_target))
    return float(cost[k] / c_def), float(det.thresholds[k])


def compute_metrics(
    scores: ArrayLike, labels: ArrayLike, p_targets: tuple[float, ...] = (0.01, 0.05)
) -> dict[str, float | int]:
    """All figures stage 6 reports, from one DET curve: ``eer`` (percent),
    ``eer_threshold``, ``min_dcf_p<P>`` and ``min_dcf_p<P>_threshold`` per p_target
    (c_miss = c_fa = 1), ``n_target``, ``n_nontarget``."""
    det = det_curve(scores, labels)
    eer, thr = eer_from_det(det)
    out: dict[str, float | int] = {"eer": eer, "eer_threshold": thr}
    for p in p_targets:
        value, t = min_dcf_with_threshold(det, p)
        out[f"min_dcf_p{p:g}"] = value
        out[f"min_dcf_p{p:g}_threshold"] = t
    out["n_target"] = det.n_target
    out["n_nontarget"] = det.n_nontarget
    return out
