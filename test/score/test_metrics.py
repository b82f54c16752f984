"""Metrics: against espnet2.utils.eer on the same scores, hand cases, ties, brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spkflow.score.metrics import compute_eer, compute_metrics, compute_min_dcf, det_curve


def gaussian_trials(seed: int, n: int, p_tar: float, gap: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < p_tar).astype(int)
    labels[:2] = [0, 1]
    scores = rng.normal(size=n) + gap * labels
    return scores, labels


@pytest.mark.parametrize(
    "seed,n,p_tar,gap", [(0, 3000, 0.1, 2.0), (1, 5000, 0.5, 1.0), (2, 800, 0.02, 3.0), (3, 4000, 0.3, 0.2)]
)
def test_against_espnet2_eer(seed, n, p_tar, gap):
    from espnet2.utils.eer import ComputeErrorRates, ComputeMinDcf, tuneThresholdfromScore

    scores, labels = gaussian_trials(seed, n, p_tar, gap)
    n_tar = int(labels.sum())
    step = 100.0 / min(n_tar, n - n_tar)  # one trial's worth of error rate, in percent
    eer, thr = compute_eer(scores, labels)
    _, ref_eer, _, _ = tuneThresholdfromScore(scores, labels, [1])
    # espnet reports max(P_miss, P_fa) at the nearest ROC point; we interpolate the crossing
    assert abs(eer - ref_eer) <= step + 1e-9
    assert eer <= ref_eer + 1e-9
    # the threshold really gives error rates at the EER (within one trial's step)
    p_miss = 100.0 * np.mean(scores[labels == 1] < thr)
    p_fa = 100.0 * np.mean(scores[labels == 0] >= thr)
    assert abs(p_miss - eer) <= step + 1e-9 and abs(p_fa - eer) <= step + 1e-9

    fnrs, fprs, thresholds = ComputeErrorRates(list(scores), list(labels))
    for p in (0.01, 0.05):
        ref, _ = ComputeMinDcf(fnrs, fprs, thresholds, p, 1, 1)
        assert compute_min_dcf(scores, labels, p) == pytest.approx(ref, rel=1e-12, abs=1e-12)
    ref, _ = ComputeMinDcf(fnrs, fprs, thresholds, 0.05, 2.0, 0.5)
    assert compute_min_dcf(scores, labels, 0.05, c_miss=2.0, c_fa=0.5) == pytest.approx(ref, rel=1e-12)


def test_hand_case():
    # sorted: 0.1 n, 0.4 t, 0.5 n, 0.9 t
    scores = [0.9, 0.4, 0.5, 0.1]
    labels = [1, 1, 0, 0]
    det = det_curve(scores, labels)
    assert det.p_miss.tolist() == [0.0, 0.0, 0.5, 0.5, 1.0]
    assert det.p_fa.tolist() == [1.0, 0.5, 0.5, 0.0, 0.0]
    assert det.thresholds.tolist() == [0.1, 0.4, 0.5, 0.9, np.inf]
    eer, thr = compute_eer(scores, labels)
    assert eer == pytest.approx(50.0) and thr == pytest.approx(0.5)
    # p=0.5: costs 0.5, 0.25, 0.5, 0.25, 0.5 -> 0.25 / min(0.5, 0.5)
    assert compute_min_dcf(scores, labels, 0.5) == pytest.approx(0.5)
    # p=0.1: 0.9*pf + 0.1*pm -> min 0.05 (reject up to 0.5) / 0.1
    assert compute_min_dcf(scores, labels, 0.1) == pytest.approx(0.5)


def test_separable_and_reversed():
    labels = np.array([1] * 10 + [0] * 30)
    scores = np.concatenate([np.linspace(2, 3, 10), np.linspace(-1, 1, 30)])
    eer, thr = compute_eer(scores, labels)
    assert eer == 0.0 and 1.0 < thr <= 2.0
    assert compute_min_dcf(scores, labels, 0.01) == 0.0
    assert compute_eer(-scores, labels)[0] == pytest.approx(100.0)
    assert compute_min_dcf(-scores, labels, 0.01) == pytest.approx(1.0)


def test_all_tied_scores_give_chance():
    """Kaldi/espnet split a tie by input order; a tie is one operating point here."""
    labels = np.array([1, 0] * 50)
    scores = np.zeros(100)
    assert compute_eer(scores, labels)[0] == pytest.approx(50.0)
    assert compute_eer(scores, labels[::-1])[0] == pytest.approx(50.0)
    assert compute_min_dcf(scores, labels, 0.01) == pytest.approx(1.0)


def test_monotone_transform_invariance():
    scores, labels = gaussian_trials(5, 2000, 0.2, 1.5)
    a = compute_metrics(scores, labels)
    b = compute_metrics(np.exp(scores) * 3 + 1, labels)
    for key in ("eer", "min_dcf_p0.01", "min_dcf_p0.05", "n_target", "n_nontarget"):
        assert a[key] == pytest.approx(b[key], rel=1e-12)
    assert set(a) >= {"eer", "eer_threshold", "min_dcf_p0.01", "min_dcf_p0.05", "n_target", "n_nontarget"}
    assert a["n_target"] + a["n_nontarget"] == 2000


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=2, max_size=40),
    st.sampled_from([0.01, 0.05, 0.3, 0.5]),
)
def test_brute_force_with_ties(trials, p_target):
    scores = np.array([s for s, _ in trials], dtype=float)
    labels = np.array([int(t) for _, t in trials])
    if labels.sum() in (0, len(labels)):
        with pytest.raises(ValueError, match="both target and non-target"):
            compute_eer(scores, labels)
        return
    tar, non = scores[labels == 1], scores[labels == 0]
    points = []  # every threshold anyone could pick: accept score >= t
    for t in list(np.unique(scores)) + [np.inf]:
        points.append((np.mean(tar < t), np.mean(non >= t)))
    pm = np.array([p for p, _ in points])
    pf = np.array([f for _, f in points])
    dcf = np.min(pm * p_target + pf * (1 - p_target)) / min(p_target, 1 - p_target)
    assert compute_min_dcf(scores, labels, p_target) == pytest.approx(dcf, abs=1e-12)
    eer = compute_eer(scores, labels)[0] / 100
    # the interpolated crossing lies between the best half-total and the best worst-case rate
    assert np.min((pm + pf) / 2) - 1e-12 <= eer <= np.min(np.maximum(pm, pf)) + 1e-12


def test_det_curve_is_monotone():
    scores, labels = gaussian_trials(7, 1000, 0.3, 1.0)
    det = det_curve(scores, labels)
    assert det.p_miss[0] == 0 and det.p_fa[0] == 1 and det.p_miss[-1] == 1 and det.p_fa[-1] == 0
    assert np.all(np.diff(det.p_miss) >= 0) and np.all(np.diff(det.p_fa) <= 0)
    assert np.all(np.diff(det.thresholds) > 0)


def test_bad_input():
    with pytest.raises(ValueError, match="differ in length"):
        compute_eer([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="not finite"):
        compute_eer([0.1, np.nan], [1, 0])
    with pytest.raises(ValueError, match="0/1"):
        compute_eer([0.1, 0.2], [1, 2])
    with pytest.raises(ValueError, match="both target and non-target"):
        compute_min_dcf([0.1, 0.2], [1, 1], 0.01)
    with pytest.raises(ValueError, match="p_target"):
        compute_min_dcf([0.1, 0.2], [1, 0], 1.5)


def test_det_plot_keeps_off_scale_operating_points_visible(tmp_path, monkeypatch):
    """A minDCF operating point beyond the DET axes (false-alarm rate far below 0.05%) is drawn
    on the border and the legend gives its real rates, instead of vanishing from the plot."""
    import spkflow.score.plots as plots

    rng = np.random.default_rng(0)
    labels = np.r_[np.ones(200), np.zeros(200_000)]
    scores = np.r_[rng.normal(1.0, 1.0, 200), rng.normal(0.0, 1.0, 200_000)]
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    plots.plot_det({"sys": det_curve(scores, labels)}, tmp_path / "det.png", p_targets=(0.001,))
    ax = figs[0].axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("minDCF(p=0.001)" in t and "(off scale)" in t for t in texts), texts
    lo, hi = ax.get_xlim()
    marker = [ln for ln in ax.get_lines() if ln.get_marker() == "^"][0]
    x, y = float(marker.get_xdata()[0]), float(marker.get_ydata()[0])
    assert lo <= x <= hi and lo <= y <= hi
