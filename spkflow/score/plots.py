"""Figures a person would rather look at than read: DET curves, score histograms, training curves.

Every function draws with matplotlib's object-oriented API on an Agg canvas (no pyplot,
no global backend switch, so importing or calling this module never touches a display and
never changes another module's matplotlib state) and writes its PNG atomically.

Compared with the anchor (ESPnet's ``egs2/TEMPLATE/spk1`` stops at printing EER/minDCF;
Kaldi ships no plots): the DET curve is drawn on normal-deviate axes as in NIST evaluations,
with the EER and minDCF operating points marked; the histogram marks the EER threshold; the
training-curve plot takes the trainer's per-epoch history as it is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spkflow.core.atomic import atomic_write
from spkflow.score.metrics import DetCurve, eer_from_det, min_dcf_with_threshold

__all__ = ["plot_confusion", "plot_det", "plot_score_hist", "plot_training_curves"]

_DET_TICKS = [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8]
_DET_LIMITS = (0.0005, 0.9)


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | os.PathLike[str]) -> None:
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png")


def _ppf(p: np.ndarray) -> np.ndarray:
    from scipy.special import ndtri

    return ndtri(np.clip(p, 1e-6, 1 - 1e-6))


def _thin(x: np.ndarray, y: np.ndarray, max_points: int = 20000) -> tuple[np.ndarray, np.ndarray]:
    if x.size <= max_points:
        return x, y
    keep = np.unique(np.concatenate([np.linspace(0, x.size - 1, max_points).astype(int), [0, x.size - 1]]))
    return x[keep], y[keep]


def _pct(p: float) -> str:
    return f"{100 * p:g}"


def plot_det(
    curves: Mapping[str, DetCurve],
    path: str | os.PathLike[str],
    title: str = "DET curve",
    p_targets: Sequence[float] = (0.01, 0.05),
) -> None:
    """DET curves (miss vs false-alarm probability on normal-deviate axes), one per entry
    of ``curves`` (label -> :class:`DetCurve`), each with its EER point (circle) and its
    minDCF operating points (triangles) marked."""
    fig = _figure(5.6, 5.6 + 0.2 * len(curves) * (1 + len(p_targets)))
    ax = fig.add_subplot()
    lo, hi = _ppf(np.array(_DET_LIMITS))
    for i, (label, det) in enumerate(curves.items()):
        color = f"C{i}"
        x, y = _thin(_ppf(det.p_fa), _ppf(det.p_miss))
        eer, _ = eer_from_det(det)
        ax.plot(x, y, color=color, lw=1.6, label=f"{label}: EER {eer:.2f}%")
        ax.plot(*_ppf(np.array([eer / 100, eer / 100])), "o", color=color, ms=6)
        for p, marker in zip(p_targets, "^v<>", strict=False):  # at most 4 operating points get a marker
            value, thr = min_dcf_with_threshold(det, p)
            k = int(np.searchsorted(det.thresholds, thr))
            # an operating point beyond the axes (e.g. a false-alarm rate of 1e-5, or 0) is
            # drawn on the border it lies beyond, and the legend says so
            px, py = float(_ppf(det.p_fa[k])), float(_ppf(det.p_miss[k]))
            cx, cy = min(max(px, lo), hi), min(max(py, lo), hi)
            where = (
                ""
                if (cx, cy) == (px, py)
                else (f", at {100 * det.p_fa[k]:.2g}% FA / {100 * det.p_miss[k]:.2g}% miss (off scale)")
            )
            ax.plot(
                cx,
                cy,
                marker,
                color=color,
                ms=7,
                mfc="none",
                clip_on=False,
                label=f"{label}: minDCF(p={p:g}) {value:.3f}{where}",
            )
    ax.plot([lo, hi], [lo, hi], color="0.6", lw=0.8, ls="--")
    ticks = _ppf(np.array(_DET_TICKS))
    labels = [_pct(p) for p in _DET_TICKS]
    ax.set_xticks(ticks, labels)
    ax.set_yticks(ticks, labels)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("False-alarm probability (%)")
    ax.set_ylabel("Miss probability (%)")
    ax.set_title(title)
    ax.grid(True, color="0.85", lw=0.6)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8, ncols=1, frameon=False)
    _save(fig, path)


def plot_score_hist(
    scores: np.ndarray,
    labels: np.ndarray,
    path: str | os.PathLike[str],
    title: str = "Score distributions",
    threshold: float | None = None,
    xlabel: str = "score",
) -> None:
    """Density histograms of target and non-target scores on shared bins (spanning each
    class's 0.1-99.9 percentiles; scores outside fall into the edge bins), with the decision
    ``threshold`` (e.g. the EER threshold) as a vertical line."""
    scores = np.asarray(scores, dtype=float)
    labels = np.asarray(labels).astype(bool)
    fig = _figure(6.4, 4.0)
    ax = fig.add_subplot()
    # a few outliers must not squash the histogram: per class 0.1-99.9 percentiles, union
    ranges = [np.percentile(scores[m], [0.1, 99.9]) for m in (labels, ~labels) if m.any()]
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    if hi <= lo:
        lo, hi = scores.min() - 0.5, scores.max() + 0.5
    bins = np.linspace(lo, hi, 61)
    scores = np.clip(scores, lo, hi)  # outliers land in the edge bins
    ax.hist(
        scores[~labels], bins=bins, density=True, alpha=0.55, color="C3", label=f"non-target ({int((~labels).sum())})"
    )
    ax.hist(scores[labels], bins=bins, density=True, alpha=0.55, color="C0", label=f"target ({int(labels.sum())})")
    if threshold is not None and np.isfinite(threshold):
        ax.axvline(threshold, color="k", ls="--", lw=1.0, label=f"EER threshold {threshold:.3f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend(fontsize=8)
    _save(fig, path)


def _numeric(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, row in enumerate(history):
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v):
            xs.append(float(row.get("epoch", i + 1)))
            ys.append(float(v))
    return xs, ys


def plot_training_curves(
    history: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], title: str = "Training"
) -> None:
    """Per-epoch curves from the trainer's history (one dict per epoch, e.g. ``{"epoch": 3,
    "train_loss": 1.2, "valid_loss": 1.4, "valid_eer": 7.5, "lr": 1e-3}``).

    Keys containing ``loss`` share the left panel; keys containing ``eer`` (percent) the
    middle one, with the best epoch marked; ``lr`` (log scale) the right one when present.
    ``epoch`` is the x axis (row number when absent); non-numeric values are ignored.
    """
    if not history:
        raise ValueError("empty training history")
    keys = list(dict.fromkeys(k for row in history for k in row if k != "epoch"))
    groups = [
        ("loss", [k for k in keys if "loss" in k.lower()]),
        ("EER (%)", [k for k in keys if "eer" in k.lower()]),
        ("learning rate", [k for k in keys if k.lower() in ("lr", "learning_rate")]),
    ]
    groups = [(name, ks) for name, ks in groups if any(_numeric(history, k)[0] for k in ks)]
    if not groups:
        raise ValueError(f"no loss, eer or lr values in the history (keys: {keys})")
    fig = _figure(4.2 * len(groups), 3.6)
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, (name, ks) in zip(axes, groups, strict=True):
        for k in ks:
            xs, ys = _numeric(history, k)
            if not xs:
                continue
            (line,) = ax.plot(xs, ys, "o-", ms=3, lw=1.4, label=k)
            if name.startswith("EER"):
                best = int(np.argmin(ys))
                ax.plot(
                    xs[best],
                    ys[best],
                    "*",
                    ms=12,
                    color=line.get_color(),
                    label=f"best {ys[best]:.2f}% (epoch {xs[best]:g})",
                )
        if name == "learning rate":
            ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.grid(True, color="0.88", lw=0.6)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    _save(fig, path)


def plot_confusion(
    counts: np.ndarray, labels: Sequence[str], path: str | os.PathLike[str], title: str = "Speaker confusion"
) -> None:
    """Speaker-identification confusion matrix (rows: true speaker, columns: predicted), each
    row as a fraction of its trials; speaker names on the axes when there are at most 40."""
    counts = np.asarray(counts, dtype=float)
    frac = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    n = len(labels)
    side = min(4.0 + 0.12 * n, 11.0)
    fig = _figure(side + 1.2, side)
    ax = fig.add_subplot()
    im = ax.imshow(frac, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    if n <= 40:
        ax.set_xticks(range(n), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(n), labels, fontsize=6)
    ax.set_xlabel(f"predicted speaker ({n})")
    ax.set_ylabel("true speaker")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, shrink=0.8, label="fraction of the speaker's test utterances")
    _save(fig, path)
