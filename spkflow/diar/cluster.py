"""Clustering one recording's window embeddings into speakers.

* :func:`spectral_labels`: Google's ``spectralcluster`` (the library of turn-to-diarize, imported
  when first used) with the refinement of "Speaker diarization with LSTM" (crop diagonal,
  Gaussian blur along time, row-wise threshold, symmetrise, diffuse, row-normalise) and its
  p-percentile auto-tuned by the normalised maximum eigengap (Park et al. 2019, the AutoTune of
  turn-to-diarize), and the speaker count bounded by
  ``[min_speakers, max_speakers]`` (fixed when ``num_speakers`` is given).  Whether there is
  more than one speaker is decided by the library's BIC test on the affinities (1 vs 2 Gaussian
  components), which skips the two nearest diagonals since neighbouring windows overlap; more
  than :data:`MAX_SPECTRAL` windows are first averaged in groups of consecutive windows (neighbours
  in time are mostly one speaker; resegmentation then refines the group boundaries), so an hour of
  windows costs seconds, not an eigen-decomposition of a 4,800 x 4,800 matrix per tuning step (the
  library's own reduction, k-means to ``max_spectral_size`` points, took 479 s on an hour of
  windows on the loaded 2-core VM).  (turn-to-diarize's own configuration, graph-cut Laplacian and
  percentile binarisation, is built for its speaker-turn constraints; without them it found 2 of 4
  and 3 of 6 well-separated speakers in ``test/diar/test_cluster.py``'s vectors, this one all.)
* :func:`ahc_labels`: average-linkage agglomerative clustering on the *calibrated* log-likelihood
  ratios of the model's own scoring (:class:`spkflow.score.model_scoring.Scoring`: backend,
  centring, AS-norm, calibration), stopped when the best remaining average LLR falls below the
  scoring's Bayes threshold (0 at the default prior), or at ``num_speakers`` when given; at most
  ``max_speakers`` clusters.  Kaldi's ``callhome_diarization`` stops PLDA-scored AHC at a
  threshold tuned on held-out data; here the threshold is the model's calibrated decision.
* :func:`resegment`: k-means-style refinement of any labelling in the same space: each window goes
  to the speaker whose centroid it is nearest to, the similarities smoothed over neighbouring
  windows in time (a window's neighbours are likely the same speaker), repeated until nothing
  moves; a cluster left with fewer than ``min_windows`` windows is dissolved into the others.

Inputs are rows of the scoring's space (L2-normalised), outputs integer labels ``0..K-1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MAX_SPECTRAL", "MIN_SHARE", "ahc_labels", "resegment", "spectral_labels"]

#: windows above which spectral clustering averages groups of consecutive windows first
MAX_SPECTRAL = 600

#: with a forced count, the smallest cluster AHC counts as a speaker, as a share of the windows:
#: average linkage leaves a few outlying windows (overlap, noise) as clusters of their own until
#: the last merges, so a cut at exactly K clusters gave an hour of 8 speakers 1,503 of its 3,995
#: windows in one cluster of 3 speakers and 72 in the smallest (the catch-all; pyannote's
#: ``min_cluster_size`` is the same idea)
MIN_SHARE = 0.005


def _clusterer(min_k: int, max_k: int) -> Any:
    try:
        from spectralcluster import (
            AutoTune,
            FallbackOptions,
            RefinementName,
            RefinementOptions,
            SpectralClusterer,
            ThresholdType,
        )
        from spectralcluster.fallback_clusterer import FallbackClustererType, SingleClusterCondition
    except ImportError:
        raise RuntimeError(
            "clustering 'spectral' needs the spectralcluster package (pip install spectralcluster)"
        ) from None
    refinement = RefinementOptions(
        gaussian_blur_sigma=1,
        thresholding_soft_multiplier=0.01,
        thresholding_type=ThresholdType.RowMax,
        refinement_sequence=[
            RefinementName.CropDiagonal,
            RefinementName.GaussianBlur,
            RefinementName.RowWiseThreshold,
            RefinementName.Symmetrize,
            RefinementName.Diffuse,
            RefinementName.RowWiseNormalize,
        ],
    )
    return SpectralClusterer(
        min_clusters=min_k,
        max_clusters=max_k,
        refinement_options=refinement,
        autotune=AutoTune(p_percentile_min=0.40, p_percentile_max=0.95, init_search_step=0.05, search_level=1),
        fallback_options=FallbackOptions(
            spectral_min_embeddings=8,
            single_cluster_condition=SingleClusterCondition.AffinityGmmBic,
            single_cluster_affinity_diagonal_offset=2,
            fallback_clusterer_type=FallbackClustererType.Agglomerative,
            agglomerative_threshold=0.5,
        ),
        laplacian_type=None,
        custom_dist="cosine",
    )


def spectral_labels(
    x: np.ndarray, *, num_speakers: int | None = None, min_speakers: int = 1, max_speakers: int = 8
) -> np.ndarray:
    """Spectral clustering of rows ``x`` ``[N, D]`` (see the module doc); labels ``[N]``."""
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    lo, hi = (num_speakers, num_speakers) if num_speakers else (min_speakers, max_speakers)
    hi = max(1, min(hi, n))
    lo = max(1, min(lo, hi))
    if hi == 1:
        return np.zeros(n, dtype=np.int64)
    g = -(-n // MAX_SPECTRAL)  # rows per group: consecutive windows averaged when there are too many
    y = np.asarray(x, dtype=np.float64)
    if g > 1:
        pad = (-n) % g
        y = np.vstack([y, np.repeat(y[-1:], pad, axis=0)]).reshape(-1, g, y.shape[1]).mean(axis=1)
        y /= np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
    with np.errstate(all="ignore"):
        labels = _clusterer(lo, min(hi, len(y))).predict(np.ascontiguousarray(y))
    return np.repeat(np.asarray(labels, dtype=np.int64), g)[:n]


def ahc_labels(
    llr: np.ndarray,
    threshold: float,
    *,
    num_speakers: int | None = None,
    max_speakers: int = 8,
    min_share: float = MIN_SHARE,
) -> np.ndarray:
    """Average-linkage clustering of a symmetric LLR matrix ``[N, N]``: merged while the average
    LLR between two clusters exceeds ``threshold``, at most ``max_speakers`` clusters; labels
    ``[N]``.  With ``num_speakers`` (a forced count, at most ``N``): the tree cut at the first
    level with that many clusters of at least ``min_share`` of the windows (and 2), the windows of
    the smaller ones given to the cluster whose windows they score highest on average (see
    :data:`MIN_SHARE`); exactly ``min(num_speakers, N)`` labels."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    n = len(llr)
    if n <= 1:
        return np.zeros(n, dtype=np.int64)
    dist = llr + llr.T  # made symmetric, then turned into distances in place (one [N, N] array)
    dist *= 0.5
    top = float(np.max(dist)) + 1.0
    np.subtract(top, dist, out=dist)  # >= 1 > 0 off the diagonal; average linkage of top - llr is top - average llr
    np.fill_diagonal(dist, 0.0)
    condensed = squareform(dist, checks=False)
    del dist
    z = linkage(condensed, method="average")
    if num_speakers:
        return _big_clusters(z, llr, min(num_speakers, n), max(2, int(np.ceil(min_share * n))))
    labels = fcluster(z, t=top - threshold, criterion="distance")
    if labels.max() > max_speakers:
        labels = fcluster(z, t=max_speakers, criterion="maxclust")
    return labels.astype(np.int64) - 1


def _big_clusters(z: np.ndarray, scores: np.ndarray, k: int, min_size: int) -> np.ndarray:
    """``k`` labels from linkage ``z``: the first cut (fewest clusters) with ``k`` clusters of at
    least ``min_size`` windows (the cut with the most, when none has ``k``: then the biggest
    clusters are topped up to ``k``), the other windows given to the big cluster they score
    highest on average (``scores`` ``[N, N]``)."""
    from scipy.cluster.hierarchy import fcluster

    n = len(scores)
    best: tuple[int, np.ndarray] | None = None
    for t in range(k, n + 1):
        lab = fcluster(z, t=t, criterion="maxclust") - 1
        sizes = np.bincount(lab)
        big = np.flatnonzero(sizes >= min_size)
        if best is None or len(big) > best[0]:
            best = (len(big), lab)
        if len(big) >= k:
            break
    assert best is not None
    lab = best[1]
    sizes = np.bincount(lab)
    big = np.argsort(-sizes, kind="stable")[:k]  # the k biggest: the big ones, topped up by size
    small = ~np.isin(lab, big)
    if small.any():
        aff = np.stack([scores[np.ix_(small, lab == b)].mean(axis=1) for b in big], axis=1)
        lab = lab.copy()
        lab[small] = big[np.argmax(aff, axis=1)]
    return np.unique(lab, return_inverse=True)[1].astype(np.int64)


def _smooth(sim: np.ndarray, width: int) -> np.ndarray:
    """Each row averaged with its ``width`` neighbours on either side (rows in time order)."""
    if width <= 0 or len(sim) < 2:
        return sim
    k = np.ones(2 * width + 1)
    pad = np.pad(sim, ((width, width), (0, 0)), mode="edge")
    csum = np.cumsum(np.vstack([np.zeros((1, sim.shape[1])), pad]), axis=0)
    return (csum[len(k) :] - csum[: -len(k)]) / len(k)


def resegment(
    x: np.ndarray,
    labels: np.ndarray,
    *,
    iterations: int = 10,
    smooth: int = 1,
    min_windows: int = 2,
    keep: bool = False,
) -> np.ndarray:
    """Refine ``labels`` of rows ``x`` (L2-normalised, in time order) as in the module doc;
    ``keep``: the number of clusters is kept (a forced count): a pass that would empty one is not
    taken, refinement stops at the labelling before it."""
    lab = np.asarray(labels, dtype=np.int64).copy()
    if len(x) < 3:
        return lab
    for _ in range(iterations):
        ks, counts = np.unique(lab, return_counts=True)
        keep_ks = ks if keep else (ks[counts >= min_windows] if np.any(counts >= min_windows) else ks)
        cent = np.stack([x[lab == k].mean(axis=0) for k in keep_ks])
        cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)
        new = keep_ks[np.argmax(_smooth(x @ cent.T, smooth), axis=1)]
        if np.array_equal(new, lab) or (keep and len(np.unique(new)) < len(ks)):
            break
        lab = new
    return lab
