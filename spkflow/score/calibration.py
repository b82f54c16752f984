"""Score calibration: linear logistic regression from scores (and quality measures) to log-likelihood ratios.

The one mechanism for every calibration in the project: the pack's score -> LLR map and the
quality-measure functions (QMF) of stage 6 are both a :class:`LogisticCalibration` fitted by
:func:`fit_logistic`, and judged by :func:`cllr` and :func:`actual_dcf` beside
:mod:`spkflow.score.metrics`' minimum DCF.

The model is BOSARIS' linear calibration (Brümmer's ``train_linear_calibration``, the logistic
regression Kaldi's and NIST SRE's fusion tools fit): ``llr = w . x + b`` minimising the
prior-weighted cross-entropy

    C(w, b) = P * mean_tar log(1 + exp(-(llr + logit P))) + (1 - P) * mean_non log(1 + exp(llr + logit P))

for a training prior ``P`` (default 0.5).  Weighting each class by its own mean makes the fit
independent of the target / non-target ratio of the training trials, and the ``logit P`` offset
makes ``llr`` a log-likelihood ratio, not a posterior log-odds: for any prior ``p`` and costs
the Bayes decision is ``llr > -logit(p_eff)`` (:func:`bayes_threshold`), so one fitted map
serves every operating point.

What this version guarantees beyond a generic logistic regression (scikit-learn's, say, which
the project does not depend on): the fit is Newton's method on a convex objective with a small
L2 term, deterministic (no random start, no iteration-order dependence), converged to a
gradient norm below 1e-10 or a :class:`ValueError`; inputs are checked (finite, one row per
label, both classes present) with errors that say which; and the fitted map is a plain dict
(:meth:`LogisticCalibration.to_dict`) that a model pack or ``metrics.json`` stores and reads back
exactly.  NumPy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "FEW_CALIBRATION_TRIALS",
    "MIN_CALIBRATION_TRIALS",
    "LogisticCalibration",
    "actual_dcf",
    "bayes_threshold",
    "calibration_trials_problem",
    "cllr",
    "fit_logistic",
    "logit",
]


#: fewest target and fewest non-target trials a score calibration is fitted on (fewer are refused:
#: on 1 + 1 trials the fit separates them perfectly and reports Cllr 0 whatever the scores)
MIN_CALIBRATION_TRIALS = 10
#: below this many target or non-target trials a calibration is fitted with a warning: its
#: in-sample Cllr and HTER are optimistic and its threshold moves with a few trials
FEW_CALIBRATION_TRIALS = 50


def calibration_trials_problem(n_target: int, n_nontarget: int) -> tuple[str | None, str | None]:
    """(error, warning) about fitting a calibration on ``n_target`` + ``n_nontarget`` trials:
    an error below :data:`MIN_CALIBRATION_TRIALS` of either kind, a warning below
    :data:`FEW_CALIBRATION_TRIALS`; (None, None) when there are enough."""
    fewest = min(n_target, n_nontarget)
    counts = f"{n_target} target and {n_nontarget} non-target trials"
    if fewest < MIN_CALIBRATION_TRIALS:
        return (
            f"{counts}: a calibration needs at least {MIN_CALIBRATION_TRIALS} of each (fewer are separated "
            "perfectly and give Cllr 0 whatever the scores); give a larger labelled set",
            None,
        )
    if fewest < FEW_CALIBRATION_TRIALS:
        return None, (
            f"calibration fitted on only {counts} (fewer than {FEW_CALIBRATION_TRIALS} of one kind): its in-sample "
            "Cllr and HTER are optimistic and its threshold uncertain; a larger labelled set gives LLRs that hold"
        )
    return None, None


def logit(p: float) -> float:
    """``log(p / (1 - p))`` for ``0 < p < 1``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a prior must be in (0, 1), got {p!r}")
    return math.log(p / (1.0 - p))


def bayes_threshold(p_target: float = 0.5, c_miss: float = 1.0, c_fa: float = 1.0) -> float:
    """The LLR above which "same speaker" has the lower expected cost: ``-logit(p_eff)``,
    ``p_eff = p C_miss / (p C_miss + (1 - p) C_fa)`` (0 for equal priors and costs)."""
    if c_miss <= 0 or c_fa <= 0:
        raise ValueError(f"costs must be > 0, got c_miss={c_miss!r}, c_fa={c_fa!r}")
    p_eff = p_target * c_miss / (p_target * c_miss + (1.0 - p_target) * c_fa)
    return -logit(p_eff)


def _features(x: ArrayLike, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"{what} must be [n] or [n, k] numbers, got shape {a.shape}")
    if not np.isfinite(a).all():
        row = int(np.flatnonzero(~np.isfinite(a).all(axis=1))[0])
        raise ValueError(f"{what}: row {row} is not finite: {a[row].tolist()}")
    return a


def _labels(y: ArrayLike, n: int) -> np.ndarray:
    t = np.asarray(y).reshape(-1)
    if t.shape[0] != n:
        raise ValueError(f"{n} rows of scores but {t.shape[0]} labels")
    if not np.isin(t, (0, 1)).all():
        raise ValueError("labels must be 0 / 1 (non-target / target)")
    t = t.astype(bool)
    if t.all() or not t.any():
        raise ValueError(f"calibration needs target and non-target trials, got {int(t.sum())} / {int((~t).sum())}")
    return t


@dataclass(frozen=True)
class LogisticCalibration:
    """``llr = features @ weights + bias``; ``names`` say what each feature column is (the first
    is the score), ``prior`` the training prior it was fitted for, ``fitted_on`` where its trials
    came from (for the model card)."""

    weights: tuple[float, ...]
    bias: float
    prior: float = 0.5
    names: tuple[str, ...] = ("score",)
    fitted_on: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in (*self.weights, self.bias, self.prior)):
            raise ValueError(
                f"calibration weights {list(self.weights)}, bias {self.bias}, prior {self.prior}: not all finite "
                "numbers (a NaN or infinite calibration would give NaN LLRs); fit it again"
            )

    def llr(self, features: ArrayLike) -> np.ndarray:
        """Log-likelihood ratios of ``features`` ([n] scores or [n, k] score + quality measures)."""
        x = _features(features, "features")
        if x.shape[1] != len(self.weights):
            raise ValueError(f"calibration takes {len(self.weights)} feature(s) {self.names}, got {x.shape[1]}")
        out = x @ np.asarray(self.weights)
        out += self.bias
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "linear_logistic",
            "weights": [float(w) for w in self.weights],
            "bias": float(self.bias),
            "prior": float(self.prior),
            "names": list(self.names),
            "fitted_on": self.fitted_on,
            **({"extra": dict(self.extra)} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LogisticCalibration:
        if d.get("kind") != "linear_logistic":
            raise ValueError(f"not a linear logistic calibration: kind {d.get('kind')!r}")
        weights = tuple(float(w) for w in d["weights"])
        names = tuple(str(n) for n in d.get("names", ("score",)))
        if len(names) != len(weights):
            raise ValueError(f"calibration: {len(weights)} weights but {len(names)} names")
        return cls(
            weights,
            float(d["bias"]),
            float(d.get("prior", 0.5)),
            names,
            str(d.get("fitted_on", "")),
            dict(d.get("extra", {})),
        )


def fit_logistic(
    features: ArrayLike,
    labels: ArrayLike,
    *,
    prior: float = 0.5,
    names: Sequence[str] | None = None,
    reg: float = 1e-6,
    fitted_on: str = "",
    max_iter: int = 100,
    weights: ArrayLike | None = None,
) -> LogisticCalibration:
    """Fit ``llr = w . x + b`` on labelled trials (see the module docstring for the objective).

    ``features``: [n] scores or [n, k] (score first, then quality measures); ``labels``: 1 for
    target trials.  ``reg``: L2 weight on ``w`` (not on ``b``), which keeps the fit finite on
    separable trials.  ``weights``: how much each trial counts within its class (>= 0; default
    1 each); the batch's own calibration (:mod:`spkflow.score.unsupervised_calibration`) gives
    every score twice, as a target and as a non-target, weighted by its estimated posteriors."""
    x = _features(features, "scores")
    t = _labels(labels, x.shape[0])
    c = np.ones(x.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if c.shape[0] != x.shape[0]:
        raise ValueError(f"{x.shape[0]} rows of scores but {c.shape[0]} weights")
    if not (np.isfinite(c).all() and (c >= 0).all()) or not (c[t].sum() > 0 and c[~t].sum() > 0):
        raise ValueError("weights must be finite, >= 0, and give each class a positive total")
    names = tuple(names) if names is not None else ("score",) + tuple(f"q{i}" for i in range(1, x.shape[1]))
    if len(names) != x.shape[1]:
        raise ValueError(f"{x.shape[1]} feature columns but {len(names)} names")
    # standardise the columns for a well-conditioned Newton step; map back at the end
    mu, sd = x.mean(axis=0), x.std(axis=0)
    sd[sd == 0] = 1.0
    z = np.hstack([(x - mu) / sd, np.ones((x.shape[0], 1))])
    off = logit(prior)
    # class weights: P / N_tar for targets, (1 - P) / N_non for non-targets; sign +1 / -1
    wt = c * np.where(t, prior / c[t].sum(), (1.0 - prior) / c[~t].sum())
    sign = np.where(t, 1.0, -1.0)
    penalty = np.full(z.shape[1], reg)
    penalty[-1] = 0.0
    theta = np.zeros(z.shape[1])
    for _ in range(max_iter):
        m = sign * (z @ theta + off)  # margin: positive when the trial is on its side
        p = 0.5 * (1.0 - np.tanh(0.5 * m))  # sigmoid(-m), stable
        grad = -(z.T @ (wt * sign * p)) + penalty * theta
        hess = (z.T * (wt * p * (1.0 - p))) @ z + np.diag(penalty) + 1e-12 * np.eye(z.shape[1])
        step = np.linalg.solve(hess, grad)
        theta = theta - step
        if float(np.abs(grad).max()) < 1e-10 or float(np.abs(step).max()) < 1e-12:
            break
    else:
        raise ValueError(f"logistic calibration did not converge in {max_iter} Newton steps")
    w = theta[:-1] / sd
    b = float(theta[-1] - (w * mu).sum())
    return LogisticCalibration(tuple(float(v) for v in w), b, float(prior), names, fitted_on)


def cllr(llr: ArrayLike, labels: ArrayLike) -> float:
    """The log-likelihood-ratio cost (bits): 0 for perfect LLRs, 1 for LLRs that are always 0
    (no information); above 1 the LLRs are worse than saying nothing (badly calibrated)."""
    s = _features(llr, "llr")[:, 0]
    t = _labels(labels, s.shape[0])
    return float(0.5 * (np.logaddexp(0.0, -s[t]).mean() + np.logaddexp(0.0, s[~t]).mean()) / math.log(2.0))


def actual_dcf(llr: ArrayLike, labels: ArrayLike, p_target: float, c_miss: float = 1.0, c_fa: float = 1.0) -> float:
    """The normalised DCF of the decisions ``llr > bayes_threshold(p_target, c_miss, c_fa)``
    (NIST's actual DCF): compare with :func:`spkflow.score.metrics.compute_min_dcf` at the same
    prior to see what calibration costs."""
    s = _features(llr, "llr")[:, 0]
    t = _labels(labels, s.shape[0])
    accept = s > bayes_threshold(p_target, c_miss, c_fa)
    p_miss = float((~accept[t]).mean())
    p_fa = float(accept[~t].mean())
    dcf = c_miss * p_target * p_miss + c_fa * (1.0 - p_target) * p_fa
    return dcf / min(c_miss * p_target, c_fa * (1.0 - p_target))
