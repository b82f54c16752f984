"""Where one recording's own window pairs change from one speaker to two: a two-component
Gaussian fit of their scores, so that the speaker count needs no calibration fitted on other data.

The scores of the window pairs of a recording (cosine in the clustering space; pairs of windows
that overlap in time or touch left out: they share audio) are a mixture of same-speaker pairs (the
upper component) and different-speaker pairs (the lower one).  :func:`fit_threshold` fits one and
two 1-D Gaussians by EM (deterministic: started at the quartiles, no random restarts) and returns
the score between the two means where the upper component's posterior is ``posterior``; ``None``
when BIC prefers one component, or the two are not two modes (:data:`SEPARATION`): one speaker.
:func:`count_labels` clusters by average linkage stopped at that score.

The anchors: Sell & Garcia-Romero 2014 ("Speaker diarization with PLDA i-vector scoring and
unsupervised calibration") calibrate each recording's own PLDA scores by a two-component fit;
Kaldi's ``callhome_diarization``, built after that system, stops AHC at a threshold tuned on
held-out recordings instead.  What ours adds: the one-speaker decision (BIC: the fit must need two
components to say two speakers) and ``posterior`` chosen by leave-one-corpus-out
(egs/speechocean762/diar1/RESULTS.md), not on the set it is reported on.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GAP", "POSTERIOR", "SEPARATION", "count_labels", "fit_threshold", "pair_scores"]

#: the upper (same-speaker) component's posterior at the threshold: leave-one-corpus-out's
#: choice, egs/speechocean762/diar1/RESULTS.md
POSTERIOR = 0.7

#: window pairs fewer than this many windows apart are left out (with 1.5 s windows every 0.75 s,
#: neighbours share audio)
GAP = 2

#: the two components must be this far apart (Ashman's D: sqrt(2) |mu1 - mu2| / sqrt(var1 + var2))
#: to be two modes; with many pairs BIC takes any skew of one speaker's scores for a second component
SEPARATION = 2.0

#: pairs fitted at most (a deterministic subsample beyond: an hour has 8 million pairs)
MAX_PAIRS = 50_000


def pair_scores(sim: np.ndarray, gap: int = GAP) -> np.ndarray:
    """The upper triangle of ``sim`` ``[N, N]`` (windows in time order) at least ``gap`` apart,
    at most :data:`MAX_PAIRS` of them (every k-th beyond that)."""
    i, j = np.triu_indices(len(sim), gap)
    s = np.asarray(sim)[i, j]
    if len(s) > MAX_PAIRS:
        s = s[:: -(-len(s) // MAX_PAIRS)]
    return s


def _em2(s: np.ndarray, iterations: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Two-component 1-D Gaussian mixture by EM: (weights, means, variances, log-likelihood)."""
    w = np.array([0.5, 0.5])
    mu = np.quantile(s, [0.25, 0.75])
    floor = max(1e-6, 1e-4 * float(np.var(s)))
    var = np.full(2, max(float(np.var(s)) / 4, floor))
    ll = -np.inf
    for _ in range(iterations):
        logp = -0.5 * ((s[:, None] - mu) ** 2 / var + np.log(2 * np.pi * var)) + np.log(w)
        top = logp.max(axis=1, keepdims=True)
        tot = top[:, 0] + np.log(np.exp(logp - top).sum(axis=1))
        new_ll = float(tot.sum())
        r = np.exp(logp - tot[:, None])
        n = r.sum(axis=0) + 1e-12
        w, mu = n / len(s), (r * s[:, None]).sum(axis=0) / n
        var = np.maximum((r * (s[:, None] - mu) ** 2).sum(axis=0) / n, floor)
        if new_ll - ll < 1e-8 * abs(new_ll):
            ll = new_ll
            break
        ll = new_ll
    return w, mu, var, ll


def fit_threshold(scores: np.ndarray, posterior: float = POSTERIOR) -> float | None:
    """The score where the upper of two Gaussians fitted to ``scores`` has ``posterior``
    (between the two means); ``None`` when one Gaussian fits better by BIC, when the two are
    closer than :data:`SEPARATION`, or when there are fewer than 10 scores."""
    if not 0.0 < posterior < 1.0:
        raise ValueError(f"posterior must be in (0, 1), got {posterior}")
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if len(s) < 10 or float(np.var(s)) == 0.0:
        return None
    ll1 = float(-0.5 * len(s) * (np.log(2 * np.pi * np.var(s)) + 1.0))
    w, mu, var, ll2 = _em2(s)
    if -2 * ll2 + 5 * np.log(len(s)) >= -2 * ll1 + 2 * np.log(len(s)):
        return None
    lo, hi = int(np.argmin(mu)), int(np.argmax(mu))
    if np.sqrt(2.0) * (mu[hi] - mu[lo]) / np.sqrt(var[lo] + var[hi]) < SEPARATION:
        return None  # two components, but not two modes: one speaker's spread
    grid = np.linspace(mu[lo], mu[hi], 401)
    dens = [w[c] * np.exp(-0.5 * (grid - mu[c]) ** 2 / var[c]) / np.sqrt(var[c]) for c in (lo, hi)]
    post = dens[1] / np.maximum(dens[0] + dens[1], 1e-300)
    above = np.flatnonzero(post >= posterior)
    return float(grid[above[0]]) if len(above) else float(mu[hi])


def count_labels(sim: np.ndarray, *, posterior: float = POSTERIOR, max_speakers: int = 8, gap: int = GAP) -> np.ndarray:
    """Labels ``[N]`` of windows (time order) whose pair scores are ``sim`` ``[N, N]``: one
    speaker when the fit says so, else average linkage stopped at :func:`fit_threshold`'s score
    (at most ``max_speakers`` clusters)."""
    from spkflow.diar.cluster import ahc_labels

    n = len(sim)
    thr = fit_threshold(pair_scores(sim, gap), posterior) if n >= 4 else None
    if thr is None:
        return np.zeros(n, dtype=np.int64)
    return ahc_labels(np.array(sim, dtype=np.float64), thr, max_speakers=max_speakers)
