"""QMF (spkflow.score.qmf, fit_qmf_file / evaluate_set's qmf_path, spkflow.bin.fit_qmf): trials drawn
from a training set, scored as a test set with the own speaker left out of the cohort, a
logistic QMF that learns what the quality measures say, applied to a test set from real kaldiio
arks.

The embeddings are made here with a known quality effect: each utterance is its speaker's
direction plus noise and a component common to all short recordings, both shrinking as the
duration grows, so two short utterances score high whoever speaks, and a QMF with the quality
measures must calibrate them better than the score alone.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from helpers.paths import ROOT


def _write_set(root: Path, name: str, num_spk: int, per_spk: int, seed: int, dim: int = 16) -> dict[str, Path]:
    """A set of utterance embeddings whose noise grows as the duration shrinks, its utt2spk,
    utt2dur, speaker means (spk_xvector.scp) and all its trials."""
    rng = np.random.default_rng(seed)
    d = root / name
    d.mkdir(parents=True)
    centres = rng.standard_normal((num_spk, dim))
    common = np.eye(dim)[0]  # what short recordings share whoever speaks (a channel, silence)
    vectors, u2s, dur = {}, {}, {}
    for s in range(num_spk):
        for k in range(per_spk):
            utt = f"{name}{s:03d}-{k:02d}"
            seconds = float(np.exp(rng.uniform(np.log(0.5), np.log(20.0))))
            noise = rng.standard_normal(dim) * (1.5 / np.sqrt(seconds))
            vectors[utt] = (centres[s] + noise + common * (3.0 / np.sqrt(seconds))).astype(np.float32)
            u2s[utt], dur[utt] = f"{name}{s:03d}", seconds
    with kaldiio.WriteHelper(f"ark,scp:{d / 'xvector.ark'},{d / 'xvector.scp'}") as w:
        for k, v in vectors.items():
            w(k, v)
    with kaldiio.WriteHelper(f"ark,scp:{d / 'spk.ark'},{d / 'spk_xvector.scp'}") as w:
        for s in sorted(set(u2s.values())):
            w(s, np.mean([v for u, v in vectors.items() if u2s[u] == s], axis=0).astype(np.float32))
    (d / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in u2s.items()))
    (d / "utt2dur").write_text("".join(f"{u} {t:.3f}\n" for u, t in dur.items()))
    utts = sorted(vectors)
    trials = [
        f"{a} {b} {'target' if u2s[a] == u2s[b] else 'nontarget'}\n" for i, a in enumerate(utts) for b in utts[i + 1 :]
    ]
    (d / "trials").write_text("".join(trials))
    return {
        "dir": d,
        "scp": d / "xvector.scp",
        "spk": d / "spk_xvector.scp",
        "u2s": d / "utt2spk",
        "dur": d / "utt2dur",
    }


def test_draw_trials_is_deterministic_and_labelled() -> None:
    from spkflow.score.qmf import draw_trials

    u2s = {f"s{s}-{k}": f"s{s}" for s in range(6) for k in range(s + 1)}  # s0 has one utterance
    a, again = draw_trials(u2s, 8, 12, seed=3), draw_trials(dict(reversed(u2s.items())), 8, 12, seed=3)
    assert (a.enroll, a.test, a.target.tolist()) == (again.enroll, again.test, again.target.tolist())
    assert draw_trials(u2s, 8, 12, seed=4).enroll != a.enroll
    pairs = list(zip(a.enroll, a.test, strict=True))
    assert len(set(pairs)) == len(pairs) == 20 and int(a.target.sum()) == 8
    for (e, t), y in zip(pairs, a.target, strict=True):
        assert e != t and (u2s[e] == u2s[t]) == bool(y)
    # more than there are: every target pair (sum of C(n, 2) = 0+1+3+6+10+15 = 35), no repeats
    b = draw_trials(u2s, 1000, 10, seed=0)
    assert int(b.target.sum()) == 35
    from spkflow.core.errors import InputError

    with pytest.raises(InputError, match=r"utt2spk: QMF trials need two speakers"):
        draw_trials({"a-1": "a", "a-2": "a"}, 5, 5)


def test_qmf_learns_the_duration_effect_and_applies_to_a_test_set(tmp_path: Path) -> None:
    """Fitted on trials of the training set (AS-norm with its own speaker left out of the cohort),
    the QMF gives the duration of the shorter side weight, and on a separate test set its calibrated scores
    have a lower Cllr than the same map without quality measures, and an EER no worse than the
    raw scores'.  scores.qmf has the trials of scores; metrics.json's qmf holds the figures."""
    from spkflow.score.calibration import cllr, fit_logistic
    from spkflow.score.eval_report import ScoringSetup, evaluate_set, fit_qmf_file, score_set
    from spkflow.score.qmf import draw_trials, load_qmf
    from spkflow.score.trial_scoring import read_scores

    train = _write_set(tmp_path, "tr", num_spk=40, per_spk=12, seed=0)
    test = _write_set(tmp_path, "te", num_spk=20, per_spk=8, seed=1)
    setup = ScoringSetup(cohort_scp=str(train["spk"]), cohort_size=10)
    qmf_path = tmp_path / "qmf.json"
    info = fit_qmf_file(
        str(train["scp"]), str(train["u2s"]), str(qmf_path), setup, utt2dur=str(train["dur"]), num_trials=2000
    )
    cal, measures = load_qmf(qmf_path)
    assert measures == ("duration", "magnitude", "imposter") and info["n_target"] == 2000
    w = dict(zip(cal.names, cal.weights, strict=True))
    # short sides pull target scores down: at a given score, a shorter trial is more likely a target
    assert w["score"] > 0 and w["duration_min"] < -0.1
    out = tmp_path / "eval"
    score_test = functools.partial(
        evaluate_set,
        str(test["dir"] / "trials"),
        str(test["scp"]),
        str(out),
        cohort_scp=str(train["spk"]),
        cohort_size=10,
        qmf_path=str(qmf_path),
        plots=False,
    )
    m = score_test(utt2dur=str(test["dur"]))
    q = m["qmf"]
    # the score-only calibration fitted on the same training trials, for comparison on the test set
    trials = draw_trials({u: s for u, s in (x.split() for x in train["u2s"].read_text().splitlines())}, 2000, 2000)
    u2s = dict(x.split() for x in train["u2s"].read_text().splitlines())
    res_tr, _, _ = score_set(trials, str(train["scp"]), setup, utt2spk=u2s)
    plain = fit_logistic(res_tr.scores, res_tr.labels)
    tr_test, scores = read_scores(out / "scores")
    assert q["cllr"] < cllr(plain.llr(scores), tr_test.target.astype(int)) - 0.02
    assert q["eer"] <= m["eer"] + 0.5
    qt, _ = read_scores(out / "scores.qmf")
    assert qt.enroll == tr_test.enroll and qt.test == tr_test.test
    assert q["measures"] == list(measures) and {"min_dcf_p0.01", "act_dcf_p0.01", "cllr"} <= set(q)
    # a QMF with durations on a set without them: an error naming what is missing
    from spkflow.core.errors import InputError

    with pytest.raises(InputError, match="this QMF uses durations"):
        score_test()
    short = tmp_path / "short_utt2dur"
    short.write_text("".join(test["dur"].read_text().splitlines(keepends=True)[1:]))
    with pytest.raises(InputError, match=rf"{short}: no duration of"):
        score_test(utt2dur=str(short))


def test_calibration_trials_leave_their_own_speaker_out_of_the_cohort(tmp_path: Path) -> None:
    """An utterance of a cohort speaker is AS-normalised against the cohort without that speaker:
    its cohort mean is the mean of its top-K scores over the other speakers' means."""
    from spkflow.score.eval_report import ScoringSetup, score_set
    from spkflow.score.qmf import draw_trials
    from spkflow.score.trial_scoring import read_embeddings

    train = _write_set(tmp_path, "tr", num_spk=12, per_spk=4, seed=2)
    u2s = dict(x.split() for x in train["u2s"].read_text().splitlines())
    trials = draw_trials(u2s, 20, 20, seed=0)
    setup = ScoringSetup(cohort_scp=str(train["spk"]), cohort_size=3)
    res, mags, _ = score_set(trials, str(train["scp"]), setup, utt2spk=u2s)
    emb = read_embeddings(train["scp"], normalize=True)
    cohort = read_embeddings(train["spk"], normalize=True)
    for i in range(len(trials)):
        u = trials.enroll[i]
        s = sorted((float(emb[u] @ v) for k, v in cohort.items() if k != u2s[u]), reverse=True)[:3]
        assert res.enroll_mu[i] == pytest.approx(np.mean(s), abs=1e-9)
        assert mags[u] == pytest.approx(float(np.linalg.norm(read_embeddings(train["scp"])[u])))
    with_own, _, _ = score_set(trials, str(train["scp"]), setup)  # as a test set: the own speaker counts
    assert np.all(with_own.enroll_mu >= res.enroll_mu) and np.any(with_own.enroll_mu > res.enroll_mu)


def test_fit_qmf_command_and_score_command(tmp_path: Path) -> None:
    """spkflow.bin.fit_qmf writes the QMF (one log line with the before/after figures);
    spkflow.bin.score --qmf applies it; a bad utt2dur line is one error line naming file and line."""
    train = _write_set(tmp_path, "tr", num_spk=10, per_spk=5, seed=3)
    test = _write_set(tmp_path, "te", num_spk=6, per_spk=4, seed=4)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    qmf = tmp_path / "qmf" / "qmf.json"
    qmf.parent.mkdir()
    fit = [
        sys.executable,
        "-m",
        "spkflow.bin.fit_qmf",
        "--xvector-scp",
        str(train["scp"]),
        "--utt2spk",
        str(train["u2s"]),
    ]
    r = subprocess.run(
        [*fit, "--utt2dur", str(train["dur"]), "--num-trials", "50", "--out", str(qmf)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "QMF (duration, magnitude) fitted on 50 target + 50 non-target training trials" in r.stderr
    assert json.loads(qmf.read_text())["measures"] == ["duration", "magnitude"]
    out = tmp_path / "eval"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spkflow.bin.score",
            "--trials",
            str(test["dir"] / "trials"),
            "--xvector-scp",
            str(test["scp"]),
            "--outdir",
            str(out),
            "--qmf",
            str(qmf),
            "--utt2dur",
            str(test["dur"]),
            "--plots",
            "false",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "(QMF: EER" in r.stderr and (out / "scores.qmf").is_file()
    bad = tmp_path / "bad_utt2dur"
    bad.write_text("tr000-00 1.5\ntr000-01 soon\n")
    r = subprocess.run(
        [*fit, "--utt2dur", str(bad), "--out", str(tmp_path / "x.json")], capture_output=True, text=True, env=env
    )
    assert r.returncode == 1 and f"{bad}:2: duration of 'tr000-01' is not a number" in r.stderr
    assert not (tmp_path / "x.json").exists()
