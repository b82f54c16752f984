"""The scoring that travels with a model (spkflow.score.model_scoring) and stage 6 through it:
real kaldiio arks of embeddings made here, trials files, the calibrate and score commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.paths import ROOT
from helpers.vectors import all_trials, speaker_set, write_vectors
from spkflow.core.errors import InputError
from spkflow.score.backend import fit_backend
from spkflow.score.calibration import cllr
from spkflow.score.eval_report import evaluate_set, write_results_md
from spkflow.score.metrics import compute_eer
from spkflow.score.model_scoring import (
    Decision,
    Scoring,
    calibrate_trials,
    decision_metrics,
    fit_scoring,
)
from spkflow.score.trial_scoring import Trials, read_embeddings, read_pairs, read_trials, resolve_ark

PY = sys.executable


def run(args: list, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LC_ALL="C")
    p = subprocess.run(list(map(str, args)), env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture
def exp(tmp_path: Path) -> dict[str, Path]:
    """A stage-6 layout: training embeddings (cohort, backend), a development set and a test set
    whose embeddings carry a channel offset the training set lacks (a domain shift)."""
    shift = np.random.default_rng(7).normal(size=24) / np.sqrt(24) * 1.5
    train = speaker_set(0, 12, 6, nuisance=0.6, prefix="tr")
    dev = speaker_set(1, 10, 5, nuisance=0.6, prefix="dv")
    test = {k: v + shift for k, v in speaker_set(2, 10, 5, nuisance=0.6, prefix="ts").items()}
    d = {"root": tmp_path}
    d["train_scp"] = write_vectors(tmp_path / "embed" / "train" / "xvector", train)
    means = {s: np.mean([v for k, v in train.items() if k.startswith(s)], axis=0) for s in {k[:5] for k in train}}
    d["cohort_scp"] = write_vectors(tmp_path / "embed" / "train" / "spk_xvector", means)
    d["utt2spk"] = tmp_path / "utt2spk"
    d["utt2spk"].write_text("".join(f"{k} {k.split('-')[0]}\n" for k in sorted(train)))
    backend = fit_backend("wccn", np.stack([train[k] for k in sorted(train)]), [k[:5] for k in sorted(train)])
    d["backend"] = tmp_path / "backend" / "wccn.npz"
    d["backend"].parent.mkdir(parents=True)
    backend.save(d["backend"])
    for name, emb in (("dev", dev), ("test", test)):
        d[f"{name}_scp"] = write_vectors(tmp_path / "embed" / name / "xvector", emb)
        d[f"{name}_trials"] = tmp_path / "data" / name / "trials"
        all_trials(sorted(emb), d[f"{name}_trials"])
    return d


def scores_file(path: Path) -> np.ndarray:
    return np.array([float(line.split()[2]) for line in path.read_text().splitlines()])


def test_save_load_round_trip_and_bad_files_are_named(exp, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    s = fit_scoring(
        str(exp["dev_trials"]),
        str(exp["dev_scp"]),
        backend_path=str(exp["backend"]),
        cohort_scp=str(exp["cohort_scp"]),
        cohort_size=5,
        set_name="dev",
    )
    s.save(model)
    back = Scoring.load(model)
    assert back.label == s.label == "WCCN, AS-norm (top 5)" and back.cohort_size == 5
    assert back.calibration == s.calibration and back.decision == s.decision
    assert back.fitted["set"] == "dev" and back.fitted["n_target"] == 10 * 10 and back.fitted["n_nontarget"] == 45 * 25
    np.testing.assert_array_equal(back.backend.proj, s.backend.proj)
    np.testing.assert_array_equal(back.cohort, s.cohort)
    a, b = np.random.default_rng(3).normal(size=(2, 5, 24))
    assert np.array_equal(back.score(a, b).llr, s.score(a, b).llr)
    # the npz of another run, a yaml of another format, a missing file: named
    other = tmp_path / "other"
    other.mkdir()
    Scoring(s.backend).save(other)
    (model / "scoring.npz").write_bytes((other / "scoring.npz").read_bytes())
    with pytest.raises(InputError, match=r"scoring.yaml: scoring.npz is not the file"):
        Scoring.load(model)
    (model / "scoring.yaml").write_text("format: something\n")
    with pytest.raises(InputError, match="not a scoring file"):
        Scoring.load(model)
    (model / "scoring.npz").unlink()
    with pytest.raises(InputError, match=r"scoring.npz: not found"):
        Scoring.load(model)


def test_stage6_scores_through_the_scoring_equal_the_options(exp, tmp_path):
    """evaluate_set with a model's scoring dir gives what the backend/cohort options give, and
    its calibrated section is what verify computes: the LLRs of the set centred on itself."""
    opts = dict(backend_path=str(exp["backend"]), cohort_scp=str(exp["cohort_scp"]), cohort_size=5)
    by_options = evaluate_set(str(exp["test_trials"]), str(exp["test_scp"]), str(tmp_path / "a"), plots=False, **opts)
    model = tmp_path / "model"
    model.mkdir()
    fit_scoring(str(exp["dev_trials"]), str(exp["dev_scp"]), **opts, set_name="dev").save(model)
    by_scoring = evaluate_set(
        str(exp["test_trials"]), str(exp["test_scp"]), str(tmp_path / "b"), scoring_dir=str(model), plots=False
    )
    np.testing.assert_array_equal(scores_file(tmp_path / "a" / "scores"), scores_file(tmp_path / "b" / "scores"))
    assert by_scoring["eer"] == by_options["eer"] and by_scoring["scoring"] == "WCCN, AS-norm (top 5)"
    c = by_scoring["calibrated"]
    assert not c["in_sample"] and c["centred_on"] == "the set (50 recordings)"
    # by hand: the set centred on its own mean, through the calibration
    s = Scoring.load(model)
    trials = read_trials(exp["test_trials"])
    emb = read_embeddings(exp["test_scp"])
    own = s.score_trials(trials, emb, domain=np.stack(list(emb.values())))
    llr = s.llr(own.scores)
    assert c["cllr"] == pytest.approx(cllr(llr, own.labels), abs=1e-12)
    assert c["eer"] == pytest.approx(compute_eer(llr, own.labels)[0], abs=1e-9)
    accept = llr > 0
    assert c["hter"] == pytest.approx(50 * ((~accept[own.labels == 1]).mean() + accept[own.labels == 0].mean()))
    # the domain shift: centred on the training mean the same calibration misplaces the threshold
    plain_llr = s.llr(s.score_trials(trials, emb).scores)
    shifted = decision_metrics(plain_llr, own.labels, Decision())
    assert shifted["hter"] > 1.5 * compute_eer(plain_llr, own.labels)[0] > 0
    assert c["hter"] < shifted["hter"]
    # the calibration's own trials are marked, and RESULTS.md shows both tables
    evaluate_set(str(exp["dev_trials"]), str(exp["dev_scp"]), str(tmp_path / "eval" / "dev"), scoring_dir=str(model))
    m = json.loads((tmp_path / "eval" / "dev" / "metrics.json").read_text())
    assert m["calibrated"]["in_sample"]
    text = Path(write_results_md(str(tmp_path))).read_text()
    assert "| WCCN, AS-norm (top 5) |" in text and "the calibration's own trials (in-sample)" in text
    assert f"| {m['calibrated']['cllr']:.3f} | {m['calibrated']['eer']:.2f} |" in text


def test_domain_centring_is_stage6_eval_mean(exp, tmp_path):
    opts = dict(backend_path=str(exp["backend"]), cohort_scp=str(exp["cohort_scp"]), cohort_size=5)
    evaluate_set(
        str(exp["test_trials"]), str(exp["test_scp"]), str(tmp_path / "e"), eval_mean=True, plots=False, **opts
    )
    s = Scoring.from_options(**opts)
    emb = read_embeddings(exp["test_scp"])
    got = s.score_trials(read_trials(exp["test_trials"]), emb, domain=np.stack(list(emb.values()))).scores
    np.testing.assert_allclose(got, scores_file(tmp_path / "e" / "scores"), rtol=0, atol=1e-6)  # 6 decimals written
    # score() on row pairs equals score_trials on the same pairs
    trials = read_trials(exp["test_trials"])
    a = np.stack([emb[u] for u in trials.enroll])
    b = np.stack([emb[u] for u in trials.test])
    v = s.score(a, b, domain=np.stack(list(emb.values())))
    np.testing.assert_allclose(v.norm_score, got, rtol=0, atol=1e-12)
    one = s.score(a[0], b[0])
    assert isinstance(one.norm_score, float) and one.llr is None and one.same_speaker is None


def test_a_single_speaker_model_scores_like_a_pair(exp):
    """identify's speaker models: one enrolment utterance scores as verification of that pair."""
    s = Scoring.from_options(backend_path=str(exp["backend"]), cohort_scp=str(exp["cohort_scp"]), cohort_size=5)
    emb = read_embeddings(exp["dev_scp"])
    keys = sorted(emb)
    x = np.stack([emb[k] for k in keys])
    models = s.enrol([x[i : i + 1] for i in range(5)])
    got = s.score_models(x[5:8], models)
    want = s.score(np.repeat(x[5:8], 5, axis=0), np.tile(x[:5], (3, 1))).norm_score.reshape(3, 5)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_plain_and_uncentred_scorings_are_never_domain_centred(exp, tmp_path):
    s = fit_scoring(str(exp["dev_trials"]), str(exp["dev_scp"]))
    assert not s.centres and s.label == "cosine" and s.fitted["centred_on"] == "nothing (the scoring does not centre)"
    assert "No centring" in s.describe()
    model = tmp_path / "m"
    model.mkdir()
    s.save(model)
    m = evaluate_set(str(exp["test_trials"]), str(exp["test_scp"]), str(tmp_path / "t"), scoring_dir=str(model))
    assert m["calibrated"]["centred_on"] == "nothing"


def test_calibration_needs_labelled_trials_of_both_kinds(exp):
    s = Scoring()
    emb = read_embeddings(exp["dev_scp"])
    keys = sorted(emb)
    pairs = Trials.from_pairs([(keys[0], keys[6], False)], labelled=False)
    with pytest.raises(InputError, match="labelled trials"):
        calibrate_trials(s.score_trials(pairs, emb))
    one = Trials.from_pairs([(keys[0], keys[1], True)])
    with pytest.raises(InputError, match="1 target and 0 non-target"):
        s.score_trials(one, emb)


def test_options_that_cannot_go_together(exp, tmp_path):
    with pytest.raises(ValueError, match="replaces --backend"):
        evaluate_set("t", "x", str(tmp_path / "o"), scoring_dir=str(tmp_path), backend_path=str(exp["backend"]))
    with pytest.raises(ValueError, match="no second mean"):
        Scoring(fit_backend("cosine", np.zeros((2, 3)), ["a", "b"]), np.zeros(3))


def test_pairs_with_and_without_labels(tmp_path):
    p = tmp_path / "pairs"
    p.write_text("a b\nc d\n")
    t = read_pairs(p)
    assert not t.labelled and t.enroll == ["a", "c"]
    p.write_text("a b target\nc d nontarget\n")
    assert read_pairs(p).labelled and list(read_pairs(p).target) == [True, False]
    p.write_text("a b target\nc d\n")
    with pytest.raises(InputError, match=r"pairs:2: 2 fields, line 1 has 3"):
        read_pairs(p)
    p.write_text("a b maybe\n")
    with pytest.raises(InputError, match=r"pairs:1: label must be"):
        read_pairs(p)


def test_an_scp_read_from_elsewhere_finds_its_arks(exp, tmp_path):
    """Stage 5 writes ark paths relative to the recipe dir; read from another folder they are
    found through the scp's own folder and those above it."""
    recipe = tmp_path / "recipe"
    (recipe / "exp" / "embed").mkdir(parents=True)
    emb = speaker_set(5, 3, 2)
    cwd = os.getcwd()
    try:
        os.chdir(recipe)
        write_vectors(Path("exp/embed/xvector"), emb)
        os.chdir(tmp_path)
        got = read_embeddings(recipe / "exp" / "embed" / "xvector.scp")
        assert sorted(got) == sorted(emb)
        np.testing.assert_allclose(got[sorted(emb)[0]], emb[sorted(emb)[0]], rtol=1e-6)
        assert resolve_ark("no/such.ark:12", recipe / "exp" / "embed" / "xvector.scp") == "no/such.ark:12"
        assert resolve_ark("cmd |", "x.scp") == "cmd |"
        (recipe / "exp" / "embed" / "xvector.ark").unlink()
        with pytest.raises(InputError, match=r"xvector.scp:1: cannot read embedding"):
            read_embeddings(recipe / "exp" / "embed" / "xvector.scp")
    finally:
        os.chdir(cwd)


def test_calibrate_and_score_commands(exp, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    p = run(
        [PY, "-m", "spkflow.bin.calibrate", "--trials", exp["dev_trials"], "--xvector-scp", exp["dev_scp"],
         "--backend", exp["backend"], "--cohort-scp", exp["cohort_scp"], "--cohort-size", 5,
         "--p-target", 0.2, "--set-name", "dev", "--out-dir", model]
    )  # fmt: skip
    assert "calibration of WCCN, AS-norm (top 5) scores" in p.stderr and "in-sample Cllr" in p.stderr
    s = Scoring.load(model)
    assert s.decision.p_target == 0.2 and s.decision.threshold == pytest.approx(np.log(4))
    p = run(
        [PY, "-m", "spkflow.bin.score", "--trials", exp["test_trials"], "--xvector-scp", exp["test_scp"],
         "--outdir", tmp_path / "eval" / "test", "--scoring-dir", model, "--plots", "false",
         "--results-md", tmp_path, "--results-file", tmp_path / "eval" / "RESULTS.md"]
    )  # fmt: skip
    assert "scoring: WCCN, AS-norm (top 5)" in p.stderr and "test calibrated (centred on the set" in p.stderr
    assert (tmp_path / "eval" / "RESULTS.md").is_file() and not (tmp_path / "RESULTS.md").exists()
    # bad input: trials of one label, a calibration needs both; nothing is written
    one = tmp_path / "one"
    one.write_text(exp["dev_trials"].read_text().splitlines()[0] + "\n")
    bad = tmp_path / "bad"
    bad.mkdir()
    p = run(
        [PY, "-m", "spkflow.bin.calibrate", "--trials", one, "--xvector-scp", exp["dev_scp"], "--out-dir", bad],
        check=False,
    )
    assert p.returncode == 1 and f"{one}: 1 target and 0 non-target" in p.stderr and not list(bad.iterdir())


def test_a_lone_pair_is_centred_on_the_calibration_set(exp, tmp_path):
    """fit_scoring keeps the mean of the calibration's recordings (pair_mean, saved and loaded);
    domain=PAIR centres on it exactly as on those recordings.  With a calibration set from the
    scored data's domain (here: the same channel offset), lone pairs' decisions are as good as the
    batch's (HTER within 1.2 x), where the training mean's are not."""
    from spkflow.score.model_scoring import PAIR

    shift = np.random.default_rng(7).normal(size=24) / np.sqrt(24) * 1.5
    dev = {k: v + shift for k, v in speaker_set(1, 10, 5, nuisance=0.6, prefix="dv").items()}
    dev_scp = write_vectors(tmp_path / "shifted_dev" / "xvector", dev)
    dev_trials = tmp_path / "shifted_dev" / "trials"
    all_trials(sorted(dev), dev_trials)
    s = fit_scoring(str(dev_trials), str(dev_scp), backend_path=str(exp["backend"]),
                    cohort_scp=str(exp["cohort_scp"]), cohort_size=5)  # fmt: skip
    assert s.pair_mean is not None and s.pair_mean.shape == (2, 24)
    s.save(tmp_path / "model")
    loaded = Scoring.load(tmp_path / "model")
    np.testing.assert_array_equal(loaded.pair_mean, s.pair_mean)
    assert "calibration set's mean" in loaded.describe()
    trials = read_trials(exp["test_trials"])
    emb = read_embeddings(exp["test_scp"])
    a = np.stack([emb[u] for u in trials.enroll])
    b = np.stack([emb[u] for u in trials.test])
    pair = loaded.score(a, b, domain=PAIR)
    on_dev = loaded.score(a, b, domain=np.stack(list(dev.values())))
    np.testing.assert_allclose(pair.llr, on_dev.llr, rtol=0, atol=1e-5)  # dev on disk: float32
    batch = loaded.score(a, b, domain=np.stack(list(emb.values())))
    train = loaded.score(a, b)
    labels = trials.target
    hter = {k: decision_metrics(v.llr, labels, loaded.decision)["hter"] for k, v in
            (("pair", pair), ("batch", batch), ("train", train))}  # fmt: skip
    assert hter["pair"] <= 1.2 * hter["batch"] + 0.5 and hter["train"] > 1.2 * hter["batch"] + 0.5, hter
    # without a calibration set's mean (an older scoring), PAIR is the training mean
    older = Scoring(loaded.backend, None, loaded.cohort, loaded.cohort_size, loaded.calibration)
    np.testing.assert_array_equal(older.score(a, b, domain=PAIR).llr, older.score(a, b).llr)


def test_pairs_with_spaces_in_names_quoted_or_tab_separated(tmp_path):
    p = tmp_path / "pairs"
    p.write_text('"my dir/a b.wav" c.wav target\nx y.wav\t"q.wav"\ttarget\n')
    t = read_pairs(p)
    assert t.enroll == ["my dir/a b.wav", "x y.wav"] and t.test == ["c.wav", '"q.wav"'] and t.target.all()
    p.write_text("a.wav b.wav\nmy dir/a b.wav c.wav\n")
    with pytest.raises(
        InputError, match=r"pairs:2: .*4 fields; quote names with spaces or separate the fields by tabs"
    ):
        read_pairs(p)
    p.write_text('"a.wav b.wav\n')
    with pytest.raises(InputError, match=r"pairs:1: No closing quotation"):
        read_pairs(p)
