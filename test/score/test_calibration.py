"""Score calibration (spkflow.score.calibration): the logistic fit recovers known log-likelihood
ratios, does not depend on the class ratio, and its costs behave as NIST's definitions say."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from spkflow.score.calibration import LogisticCalibration, actual_dcf, bayes_threshold, cllr, fit_logistic, logit
from spkflow.score.metrics import compute_min_dcf


def gaussian_trials(n_tar: int, n_non: int, mu_tar: float = 2.0, mu_non: float = -1.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    s = np.concatenate([rng.normal(mu_tar, 1.0, n_tar), rng.normal(mu_non, 1.0, n_non)])
    y = np.concatenate([np.ones(n_tar, bool), np.zeros(n_non, bool)])
    return s, y


def test_recovers_the_true_llr_of_two_gaussians():
    # equal-variance Gaussians: llr(s) = (mu_t - mu_n) s - (mu_t^2 - mu_n^2) / 2 = 3 s - 1.5
    s, y = gaussian_trials(20000, 20000)
    cal = fit_logistic(s * 0.1 + 5.0, y)  # an affine distortion of the scores, which the fit must undo
    assert cal.weights[0] == pytest.approx(30.0, rel=0.03)
    assert cal.llr(np.array([0.5 * 0.1 + 5.0]))[0] == pytest.approx(0.0, abs=0.05)
    assert cal.llr(np.array([1.5 * 0.1 + 5.0]))[0] == pytest.approx(3.0, abs=0.15)


def test_the_class_ratio_does_not_move_the_fit():
    s1, y1 = gaussian_trials(5000, 5000, seed=1)
    s2, y2 = gaussian_trials(2000, 60000, seed=1)
    a, b = fit_logistic(s1, y1), fit_logistic(s2, y2)
    assert a.weights[0] == pytest.approx(b.weights[0], rel=0.1)
    assert a.bias == pytest.approx(b.bias, abs=0.2)


def test_prior_makes_llrs_not_posteriors():
    s, y = gaussian_trials(5000, 5000, seed=2)
    a, b = fit_logistic(s, y, prior=0.5), fit_logistic(s, y, prior=0.1)
    # the same data, two training priors: both are LLRs, so they agree up to what the weighting changes
    assert a.llr(np.array([0.5]))[0] == pytest.approx(b.llr(np.array([0.5]))[0], abs=0.2)


def test_costs():
    s, y = gaussian_trials(3000, 3000, seed=3)
    cal = fit_logistic(s, y)
    llr = cal.llr(s)
    assert cllr(llr, y) < cllr(s * 10.0, y)  # overconfident raw scores cost more
    assert cllr(np.zeros_like(s), y) == pytest.approx(1.0)
    for p in (0.5, 0.05, 0.01):
        assert actual_dcf(llr, y, p) >= compute_min_dcf(llr, y, p) - 1e-12
    # calibrated on the same trials: actual DCF at p = 0.5 is close to the minimum
    assert actual_dcf(llr, y, 0.5) <= compute_min_dcf(llr, y, 0.5) + 0.02


def test_bayes_threshold():
    assert bayes_threshold(0.5) == 0.0
    assert bayes_threshold(0.01) == pytest.approx(math.log(99))
    assert bayes_threshold(0.5, c_miss=10.0) == pytest.approx(-math.log(10))
    assert logit(0.75) == pytest.approx(math.log(3))
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        logit(1.0)


def test_several_features_and_round_trip():
    rng = np.random.default_rng(40)  # not the stream of the scores
    s, y = gaussian_trials(4000, 4000, seed=4)
    quality = rng.normal(size=s.shape)
    cal = fit_logistic(np.c_[s, quality], y, names=["score", "noise"], fitted_on="unit test")
    assert abs(cal.weights[1]) < 0.1 * cal.weights[0]  # a quality measure with no information gets ~0 weight
    back = LogisticCalibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back == cal
    np.testing.assert_array_equal(back.llr(np.c_[s, quality]), cal.llr(np.c_[s, quality]))
    with pytest.raises(ValueError, match="takes 2 feature"):
        cal.llr(s)


def test_separable_trials_stay_finite():
    s = np.array([0.0, 0.1, 0.2, 0.8, 0.9, 1.0])
    y = np.array([0, 0, 0, 1, 1, 1])
    cal = fit_logistic(s, y)
    assert np.isfinite(cal.weights).all() and cal.weights[0] > 0


@pytest.mark.parametrize(
    ("scores", "labels", "message"),
    [
        ([0.1, 0.2], [1, 1], "target and non-target"),
        ([0.1, float("nan")], [1, 0], "row 1 is not finite"),
        ([0.1, 0.2, 0.3], [1, 0], "3 rows of scores but 2 labels"),
        ([0.1, 0.2], [1, 2], "labels must be 0 / 1"),
    ],
)
def test_bad_input_says_what(scores, labels, message):
    with pytest.raises(ValueError, match=message):
        fit_logistic(scores, labels)
