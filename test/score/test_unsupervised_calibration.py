"""The batch's own calibration (spkflow.score.unsupervised_calibration, Scoring.on_batch): on a
batch whose scores moved away from the model's calibration it moves the threshold the way they
moved; a small batch keeps the model's and says so; bad input is named."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spkflow.score.calibration import LogisticCalibration, fit_logistic
from spkflow.score.model_scoring import Decision, Scoring
from spkflow.score.unsupervised_calibration import (
    GATE,
    MIN_PAIRS,
    MIN_RECORDINGS,
    calibrate_batch,
    fit_score_mixture,
)


def two_gaussians(n: int, p: float = 0.1, mu_t: float = 2.0, mu_n: float = -1.0, seed: int = 0):
    """Scores of ``n`` pairs, a proportion ``p`` of targets ~ N(mu_t, 1), the rest ~ N(mu_n, 1)."""
    rng = np.random.default_rng(seed)
    lab = rng.random(n) < p
    return np.where(lab, rng.normal(mu_t, 1.0, n), rng.normal(mu_n, 1.0, n)), lab


def crossing(cal: LogisticCalibration, threshold: float = 0.0) -> float:
    """The score at which ``cal``'s LLR is ``threshold``."""
    return (threshold - cal.bias) / cal.weights[0]


def hter(llr: np.ndarray, lab: np.ndarray) -> float:
    return 50.0 * (float((llr[lab] <= 0).mean()) + float((llr[~lab] > 0).mean()))


@pytest.fixture(scope="module")
def model() -> LogisticCalibration:
    """The model's calibration: fitted on labelled scores of the unshifted distributions
    (true LLR 3 s - 1.5: threshold 0.5)."""
    s, lab = two_gaussians(20000, seed=1)
    return fit_logistic(s, lab)


def test_recovers_the_llr_of_two_gaussians_without_labels(model):
    s, lab = two_gaussians(20000, seed=2)
    mix = fit_score_mixture(s, start_llr=model.llr(s), max_fit=20000)
    assert mix.converged and mix.p_target == pytest.approx(lab.mean(), abs=0.01)
    assert (mix.target_mean, mix.nontarget_mean) == pytest.approx((2.0, -1.0), abs=0.05)
    cal = mix.calibration(s)
    assert cal.weights[0] == pytest.approx(3.0, rel=0.05) and crossing(cal) == pytest.approx(0.5, abs=0.05)
    # without a model's calibration to start from: the same fit
    assert fit_score_mixture(s, max_fit=20000).target_mean == pytest.approx(mix.target_mean, abs=1e-3)


@pytest.mark.parametrize("shift", [1.5, -1.5])
def test_a_shifted_batch_moves_the_threshold_the_way_the_scores_moved(model, shift):
    s, lab = two_gaussians(8000, seed=3)
    s = s + shift  # the batch's scores moved: the model's threshold no longer lies between them
    b = calibrate_batch(s, n_recordings=200, model=model, gate=-math.inf)  # the batch's own whenever trusted
    assert b.used and b.calibration is not None and b.shift is not None
    moved = crossing(b.calibration) - crossing(model)
    assert moved == pytest.approx(shift, abs=0.35)  # the fit's own sampling error: 0.26 measured on 4,000
    assert hter(b.calibration.llr(s), lab) < hter(model.llr(s), lab) - 3.0
    # auto (the default gate) takes a raised threshold only: the lowered one stays the model's, said
    auto = calibrate_batch(s, n_recordings=200, model=model)
    assert auto.used == (shift > 0)
    assert ("the batch's own calibration decides" if shift > 0 else "the model's calibration decides") in auto.reason
    assert ("above" if shift > 0 else "below") in auto.reason


def test_an_unshifted_batch_keeps_the_models_calibration(model):
    s, _ = two_gaussians(4000, seed=4)
    b = calibrate_batch(s, n_recordings=100, model=model)
    assert not b.used and b.shift is not None and abs(b.shift) < GATE
    assert "the model's calibration decides" in b.reason


@pytest.mark.parametrize(
    ("n_pairs", "n_rec", "said"),
    [
        (1, 2, "1 pairs of 2 recordings: too few"),
        (MIN_PAIRS - 1, 50, f"{MIN_PAIRS - 1} pairs of 50 recordings: too few"),
        (4000, MIN_RECORDINGS - 1, f"4000 pairs of {MIN_RECORDINGS - 1} recordings: too few"),
    ],
)
def test_a_small_batch_keeps_the_models_calibration_and_says_so(model, n_pairs, n_rec, said):
    s, _ = two_gaussians(n_pairs, seed=5)
    b = calibrate_batch(s + 3.0, n_recordings=n_rec, model=model, gate=-math.inf)  # shifted: it would move
    assert not b.used and b.calibration is None and said in b.reason and "the model's calibration decides" in b.reason
    scoring = Scoring(calibration=model)
    same, outcome = scoring.on_batch(s + 3.0, n_rec, "batch")
    assert same is scoring and outcome is not None and said in outcome.reason


def test_a_batch_without_two_kinds_of_pairs_is_not_trusted(model):
    rng = np.random.default_rng(6)
    one_kind = rng.normal(0.0, 1.0, 5000)  # one speaker's pairs, or no repeated speaker: one Gaussian
    b = calibrate_batch(one_kind, n_recordings=100, model=model, gate=-math.inf)
    assert not b.used and "the model's calibration decides" in b.reason
    assert "apart" in b.reason or "bound" in b.reason or "expected" in b.reason


def test_on_batch_replaces_the_calibration_only_when_used(model):
    s, _ = two_gaussians(4000, seed=7)
    scoring = Scoring(calibration=model, decision=Decision(0.5))
    raised, b = scoring.on_batch(s + 1.5, 100, "auto")
    assert b is not None and b.used and raised.calibration == b.calibration and raised.calibration != model
    lowered, b = scoring.on_batch(s - 1.5, 100, "auto")  # fitted, but a lower threshold is not taken
    assert b is not None and b.calibration is not None and not b.used and lowered is scoring
    assert scoring.on_batch(s + 1.5, 100, "model") == (scoring, None)
    assert Scoring().on_batch(s, 100, "auto") == (Scoring(), None)  # no calibration: nothing to replace
    with pytest.raises(ValueError, match="calibration must be one of auto, batch, model, got 'batchy'"):
        scoring.on_batch(s, 100, "batchy")


def test_bad_scores_are_left_out_or_named(model):
    s, _ = two_gaussians(4000, seed=8)
    with_nan = np.r_[s, np.nan, np.inf]
    a = fit_score_mixture(s, start_llr=model.llr(s))
    b = fit_score_mixture(with_nan, start_llr=model.llr(np.where(np.isfinite(with_nan), with_nan, 0.0)))
    assert b.n == a.n == 4000 and b.target_mean == pytest.approx(a.target_mean)
    said = calibrate_batch(np.r_[np.full(500, 0.3), np.full(100, np.nan)], n_recordings=50, model=model).reason
    assert "no mixture fitted (500 finite scores, all equal" in said and "the model's calibration decides" in said
    assert "0 pairs of 50 recordings: too few" in calibrate_batch(np.full(500, np.nan), n_recordings=50).reason
    with pytest.raises(ValueError, match="4000 scores but 3 starting LLRs"):
        fit_score_mixture(s, start_llr=[0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="all equal or fewer than two"):
        fit_score_mixture(np.ones(300))
    with pytest.raises(ValueError, match="prior bounds"):
        fit_score_mixture(s, prior_bounds=(0.5, 0.2))
    with pytest.raises(ValueError, match="weights must be finite"):
        fit_logistic(s[:4], [1, 0, 1, 0], weights=[1.0, -1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="4 rows of scores but 3 weights"):
        fit_logistic(s[:4], [1, 0, 1, 0], weights=[1.0, 1.0, 1.0])


def test_many_scores_are_thinned_deterministically(model):
    s, _ = two_gaussians(30000, seed=9)
    a = fit_score_mixture(s, start_llr=model.llr(s), max_fit=10000)
    b = fit_score_mixture(s[::-1], start_llr=model.llr(s[::-1]), max_fit=10000)
    assert a.n == 10000 and a == b  # the order of the pairs does not matter
    full = fit_score_mixture(s, start_llr=model.llr(s), max_fit=30000)
    assert full.n == 30000 and a.target_mean == pytest.approx(full.target_mean, abs=0.1)
