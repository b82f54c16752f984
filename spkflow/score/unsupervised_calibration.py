"""The batch's own calibration: a score -> LLR map fitted on the scored batch, without its labels.

A calibration fitted on labelled trials of one corpus (the pack's, :mod:`spkflow.score.calibration`)
puts the decision threshold where that corpus's target and non-target scores cross.  On recordings
unlike it the two score distributions can move and spread differently, and the threshold no longer
sits between them (measured: a batch centred on the training mean, `verify --domain-mean train`,
decides LibriSpeech with 3.1 x its EER).  After Brümmer & Garcia-Romero 2014 ("Generative modelling
for unsupervised score calibration", ICASSP) the batch's final scores are modelled as a mixture

    p(s) = P N(s; mu_t, v_t) + (1 - P) N(s; mu_n, v_n)

of a target and a non-target Gaussian, fitted by EM, with the proportion of targets ``P`` estimated
within :data:`PRIOR_BOUNDS`.  The map itself is the project's one calibration,
:class:`~spkflow.score.calibration.LogisticCalibration` fitted by
:func:`~spkflow.score.calibration.fit_logistic`: every score counted once as a target and once
as a non-target, weighted by its posterior under the mixture (so the fit is the linear LLR closest
to the mixture's, independent of ``P``); the decision's prior stays the user's.

What it guarantees
------------------
* **Deterministic**: EM starts from the model's own calibrated LLRs (posteriors at
  :data:`START_PRIOR`), or without one from the top :data:`START_PRIOR` of the scores; no random
  start; more than :data:`MAX_FIT` scores are thinned to evenly spaced quantiles, not sampled.
  The target component is the one with the higher mean.
* **Used only when it can be trusted** (:func:`calibrate_batch`): at least :data:`MIN_PAIRS`
  pairs of at least :data:`MIN_RECORDINGS` recordings, EM converged, the estimated prior inside
  :data:`PRIOR_BOUNDS` (not held at a bound), at least :data:`MIN_TARGETS` expected target pairs,
  components at least :data:`MIN_SEPARATION` pooled standard deviations apart, a positive slope.
  Otherwise the result says why (``reason``) and the caller keeps the model's calibration: one
  pair, a handful of recordings, a batch of one speaker or of no repeated speaker.
* **The model's calibration is the fallback and the default**: the batch's map replaces the
  model's only when it puts the threshold higher than the model's by more than ``gate``
  (:data:`GATE`) pooled standard deviations: the model's calibration then accepts far more pairs
  than the batch's own scores hold targets (a batch centred on the training mean accepts 66-78 %
  of the pairs of DSPSpeech-20 at 8 kHz, LibriSpeech and FSDD).  A lower threshold is never
  taken from the batch: wherever its fit was trusted the mixture over-estimated the proportion of
  targets (0.19 against 0.09 on speechocean762, 0.58 against 0.11 on LibriSpeech, the scores'
  tails are not Gaussian), which lowers its threshold wrongly.  Rule and gate chosen
  leave-one-corpus-out (egs/speechocean762/spk1/RESULTS.md, "The batch's own calibration").
* **Bad numbers**: non-finite scores are left out of the fit; fewer than two finite, distinct
  scores fit nothing (``reason`` says so).

Anchors: BOSARIS and Kaldi calibrate only on labelled trials (``train_linear_calibration``,
``logistic-regression``); WeSpeaker and SpeechBrain do not calibrate.  The unsupervised mixture is
the paper's; the start from the supervised calibration, the linear map and the trust rules and
gate are this project's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from spkflow.score.calibration import LogisticCalibration, fit_logistic

__all__ = [
    "GATE",
    "MAX_FIT",
    "MIN_PAIRS",
    "MIN_RECORDINGS",
    "MIN_SEPARATION",
    "MIN_TARGETS",
    "PRIOR_BOUNDS",
    "START_PRIOR",
    "BatchCalibration",
    "ScoreMixture",
    "calibrate_batch",
    "fit_score_mixture",
]

#: the proportion of target pairs a batch may be estimated to hold; an estimate held at a bound
#: is not trusted (a batch of one speaker, or of no repeated speaker)
PRIOR_BOUNDS = (0.002, 0.7)
#: prior of the starting posteriors (the model's LLR + logit of it)
START_PRIOR = 0.1
#: fewest pairs, recordings and expected target pairs for the batch's own calibration
MIN_PAIRS = 200
MIN_RECORDINGS = 10
MIN_TARGETS = 20.0
#: fewest pooled standard deviations between the two components' means
MIN_SEPARATION = 1.0
#: the batch's map replaces the model's when it puts the threshold higher than the model's by more
#: than this many pooled standard deviations of the batch's scores (leave-one-corpus-out: RESULTS.md)
GATE = 0.5
#: most scores EM is fitted on (more are thinned to evenly spaced quantiles)
MAX_FIT = 5_000
_VAR_FLOOR = 1e-4  # of the batch's score variance: a component never collapses onto a few scores


def _log_normal(x: np.ndarray, mean: float, var: float) -> np.ndarray:
    return -0.5 * (math.log(2.0 * math.pi * var) + (x - mean) ** 2 / var)


@dataclass(frozen=True)
class ScoreMixture:
    """A fitted two-Gaussian model of a batch's scores: the proportion of targets, each
    component's mean and variance, how many scores it was fitted on and EM's iterations."""

    p_target: float
    target_mean: float
    target_var: float
    nontarget_mean: float
    nontarget_var: float
    n: int
    iterations: int
    converged: bool

    @property
    def pooled_std(self) -> float:
        return math.sqrt(0.5 * (self.target_var + self.nontarget_var))

    @property
    def separation(self) -> float:
        """``(mu_t - mu_n) / sqrt((v_t + v_n) / 2)``: the components' distance in pooled std."""
        return (self.target_mean - self.nontarget_mean) / self.pooled_std

    def posterior(self, scores: ArrayLike) -> np.ndarray:
        """P(target | score) under the mixture (its own ``p_target``)."""
        s = np.asarray(scores, dtype=np.float64)
        lt = math.log(self.p_target) + _log_normal(s, self.target_mean, self.target_var)
        ln = math.log1p(-self.p_target) + _log_normal(s, self.nontarget_mean, self.nontarget_var)
        return np.exp(lt - np.logaddexp(lt, ln))

    def calibration(self, scores: ArrayLike, fitted_on: str = "") -> LogisticCalibration:
        """The linear LLR map closest to the mixture's on ``scores`` (finite ones):
        :func:`~spkflow.score.calibration.fit_logistic` with each score a target and a
        non-target, weighted by its posterior and the rest."""
        s = np.asarray(scores, dtype=np.float64).reshape(-1)
        s = s[np.isfinite(s)]
        r = self.posterior(s)
        labels = np.r_[np.ones(s.shape[0], dtype=bool), np.zeros(s.shape[0], dtype=bool)]
        return fit_logistic(np.r_[s, s], labels, weights=np.r_[r, 1.0 - r], fitted_on=fitted_on)

    def to_dict(self) -> dict[str, Any]:
        return {
            "p_target": self.p_target,
            "target": {"mean": self.target_mean, "var": self.target_var},
            "nontarget": {"mean": self.nontarget_mean, "var": self.nontarget_var},
            "separation": self.separation,
            "pairs": self.n,
            "iterations": self.iterations,
            "converged": self.converged,
        }


def fit_score_mixture(
    scores: ArrayLike,
    *,
    start_llr: ArrayLike | None = None,
    start_prior: float = START_PRIOR,
    prior_bounds: tuple[float, float] = PRIOR_BOUNDS,
    max_iter: int = 3000,
    tol: float = 1e-5,
    max_fit: int = MAX_FIT,
) -> ScoreMixture:
    """Fit the two-Gaussian mixture to the finite ``scores`` by EM (module docstring).

    ``start_llr``: LLRs of the same scores from another calibration (the model's), whose posteriors
    at ``start_prior`` start EM; without it the top ``start_prior`` of the scores start as targets.
    Stops when no parameter moves by more than ``tol`` (relative to the scores' std) or after
    ``max_iter`` iterations (``converged`` False)."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    finite = np.isfinite(s)
    start = None
    if start_llr is not None:
        start = np.asarray(start_llr, dtype=np.float64).reshape(-1)
        if start.shape != s.shape:
            raise ValueError(f"{s.shape[0]} scores but {start.shape[0]} starting LLRs")
        finite &= np.isfinite(start)
        start = start[finite]
    s = s[finite]
    if s.shape[0] < 2 or not np.ptp(s) > 0:
        raise ValueError(f"{s.shape[0]} finite scores, all equal or fewer than two: no mixture to fit")
    lo, hi = prior_bounds
    if not 0.0 < lo < hi < 1.0:
        raise ValueError(f"prior bounds must satisfy 0 < lo < hi < 1, got {prior_bounds}")
    if s.shape[0] > max_fit:  # evenly spaced quantiles: the same distribution, deterministic
        keep = np.argsort(s, kind="stable")[np.linspace(0, s.shape[0] - 1, max_fit).round().astype(np.int64)]
        s = s[keep]
        start = None if start is None else start[keep]
    if start is not None:
        z = start + math.log(start_prior / (1.0 - start_prior))
        r = 0.5 * (1.0 + np.tanh(0.5 * z))  # sigmoid, stable
    else:
        r = (s > np.quantile(s, 1.0 - start_prior)).astype(np.float64)
    n = s.shape[0]
    scale = float(s.std())
    floor = _VAR_FLOOR * scale**2
    params = np.full(5, np.inf)
    converged = False
    it = 0
    p = mt = mn = vt = vn = 0.0
    while it < max_iter:
        it += 1
        wt = min(max(float(r.sum()), 1e-9 * n), n - 1e-9 * n)  # neither component empty
        wn = n - wt
        p = min(max(wt / n, lo), hi)
        mt = float(r @ s) / wt
        mn = float((1.0 - r) @ s) / wn
        vt = max(float(r @ (s - mt) ** 2) / wt, floor)
        vn = max(float((1.0 - r) @ (s - mn) ** 2) / wn, floor)
        new = np.array([p, mt / scale, mn / scale, math.sqrt(vt) / scale, math.sqrt(vn) / scale])
        if np.abs(new - params).max() < tol:
            converged = True
            break
        params = new
        lt = math.log(p) + _log_normal(s, mt, vt)
        ln = math.log1p(-p) + _log_normal(s, mn, vn)
        r = np.exp(lt - np.logaddexp(lt, ln))
    if mt < mn:  # the component with the higher mean is the target one
        p, mt, vt, mn, vn = 1.0 - p, mn, vn, mt, vt
    return ScoreMixture(p, mt, vt, mn, vn, n, it, converged)


@dataclass(frozen=True)
class BatchCalibration:
    """The outcome of :func:`calibrate_batch`: ``calibration`` the batch's own map (None when
    none was fitted), ``used`` whether it replaces the model's, ``reason`` why (or why not),
    ``shift`` how far the model's threshold lies above the batch's (pooled std; negative: the
    batch's is higher)."""

    calibration: LogisticCalibration | None
    used: bool
    reason: str
    mixture: ScoreMixture | None = None
    shift: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"used": self.used, "reason": self.reason}
        if self.shift is not None:
            out["shift_std"] = self.shift
        if self.calibration is not None:
            out["calibration"] = self.calibration.to_dict()
        if self.mixture is not None:
            out["mixture"] = self.mixture.to_dict()
        return out


def calibrate_batch(
    scores: ArrayLike,
    *,
    n_recordings: int,
    model: LogisticCalibration | None = None,
    threshold: float = 0.0,
    gate: float = GATE,
    min_pairs: int = MIN_PAIRS,
    min_recordings: int = MIN_RECORDINGS,
    min_targets: float = MIN_TARGETS,
    min_separation: float = MIN_SEPARATION,
    prior_bounds: tuple[float, float] = PRIOR_BOUNDS,
) -> BatchCalibration:
    """The batch's own calibration when it can be trusted and (with a ``model`` calibration) its
    threshold for ``threshold`` lies more than ``gate`` pooled std above the model's (module
    docstring); else ``used`` False and the reason.  ``scores``: the final scores of the batch's
    pairs; ``n_recordings``: how many distinct recordings they name.  ``calibration`` and
    ``shift`` are returned whenever a trusted map was fitted, used or not."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = int(np.isfinite(s).sum())
    if n < min_pairs or n_recordings < min_recordings:
        return BatchCalibration(
            None,
            False,
            f"{n} pairs of {n_recordings} recordings: too few for the batch's own calibration (it needs >= "
            f"{min_pairs} pairs of >= {min_recordings} recordings); the model's calibration decides",
        )
    start = None if model is None else model.llr(np.where(np.isfinite(s), s, 0.0))
    try:
        mix = fit_score_mixture(s, start_llr=start, prior_bounds=prior_bounds)
    except ValueError as exc:
        return BatchCalibration(None, False, f"no mixture fitted ({exc}); the model's calibration decides")
    lo, hi = prior_bounds
    fitted = f"{n} pairs of {n_recordings} recordings, target proportion {mix.p_target:.3f}"
    problem = None
    if not mix.converged:
        problem = f"EM did not converge in {mix.iterations} iterations"
    elif not lo < mix.p_target < hi:
        problem = f"the estimated target proportion {mix.p_target:.3g} is held at its bound ({lo:g}, {hi:g})"
    elif mix.p_target * n < min_targets:
        problem = f"{mix.p_target * n:.1f} target pairs expected, fewer than {min_targets:g}"
    elif mix.separation < min_separation:
        problem = f"the two components are {mix.separation:.2f} std apart, fewer than {min_separation:g}"
    if problem is not None:
        return BatchCalibration(None, False, f"{problem} ({fitted}); the model's calibration decides", mix)
    cal = mix.calibration(s, fitted_on=f"this batch's own scores, unsupervised ({fitted})")
    if not cal.weights[0] > 0:
        return BatchCalibration(None, False, f"the batch's map does not rise with the score ({fitted})", mix)
    if model is None:
        return BatchCalibration(cal, True, f"the batch's own calibration ({fitted}); the model has none", mix)
    at = (threshold - cal.bias) / cal.weights[0]
    shift = ((threshold - model.bias) / model.weights[0] - at) / mix.pooled_std
    where = f"{abs(shift):.2f} std {'above' if shift < 0 else 'below'} the model's"
    if not shift < -gate:
        return BatchCalibration(
            cal,
            False,
            f"the batch's own threshold lies {where} (the batch's replaces it only above, by more than {gate:g}): "
            f"the model's calibration decides ({fitted})",
            mix,
            shift,
        )
    return BatchCalibration(
        cal,
        True,
        f"the batch's own calibration decides: its threshold lies {where} (more than {gate:g}) ({fitted})",
        mix,
        shift,
    )
