"""What a calibration and its outputs refuse or warn about: a NaN calibration (refused where it
is read, so no ``"llr": NaN`` line), JSON that stays JSON when a score is not a number, too few
trials to calibrate on, a log that says what was centred, and stage 6 naming its backend.  Real
processes (``spkflow.bin.calibrate``, ``score``, ``verify``) on real kaldiio arks made here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers.models import make_spkflow_model_dir
from helpers.paths import ROOT
from helpers.vectors import all_trials, speaker_set, write_vectors
from spkflow.core import jsonsafe
from spkflow.core.errors import InputError
from spkflow.score.backend import fit_backend
from spkflow.score.calibration import MIN_CALIBRATION_TRIALS, LogisticCalibration
from spkflow.score.model_scoring import Scoring

PY = sys.executable


def run(args: list, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LC_ALL="C", OMP_NUM_THREADS="1")
    p = subprocess.run(list(map(str, args)), env=env, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture
def sets(tmp_path: Path) -> dict[str, Path]:
    d: dict[str, Path] = {}
    for name, seed, n_spk, n_utt in (("train", 0, 8, 5), ("dev", 1, 10, 5), ("small", 2, 4, 4)):
        emb = speaker_set(seed, n_spk, n_utt, nuisance=0.5, prefix=name[:2])
        d[f"{name}_scp"] = write_vectors(tmp_path / "embed" / name / "xvector", emb)
        d[f"{name}_trials"] = tmp_path / "data" / name / "trials"
        all_trials(sorted(emb), d[f"{name}_trials"])
        d[f"{name}_emb"] = emb  # type: ignore[assignment]
    train = d["train_emb"]  # type: ignore[assignment]
    keys = sorted(train)
    d["backend"] = tmp_path / "backend" / "wccn.npz"
    d["backend"].parent.mkdir()
    fit_backend("wccn", np.stack([train[k] for k in keys]), [k.split("-")[0] for k in keys]).save(d["backend"])
    return d


def test_a_nan_calibration_is_refused_where_it_is_read(sets, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    run([PY, "-m", "spkflow.bin.calibrate", "--trials", sets["dev_trials"], "--xvector-scp", sets["dev_scp"],
         "--out-dir", model])  # fmt: skip
    meta = yaml.safe_load((model / "scoring.yaml").read_text())
    meta["calibration"]["bias"] = float("nan")
    (model / "scoring.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    with pytest.raises(InputError, match=r"scoring.yaml: bad scoring: .*not all finite numbers"):
        Scoring.load(model)
    p = run([PY, "-m", "spkflow.bin.score", "--trials", sets["small_trials"], "--xvector-scp", sets["small_scp"],
             "--outdir", tmp_path / "eval", "--scoring-dir", model, "--plots", "false"], check=False)  # fmt: skip
    errors = [line for line in p.stderr.splitlines() if "ERROR" in line]
    assert p.returncode == 1 and "Traceback" not in p.stderr and len(errors) == 1
    assert "scoring.yaml: bad scoring" in errors[0] and "not all finite" in errors[0]
    with pytest.raises(ValueError, match="not all finite"):
        LogisticCalibration((float("inf"),), 0.0)


def test_verify_with_a_nan_calibration_writes_no_nan(tmp_path):
    """The issue's case: a model whose calibration holds a NaN gave ``"llr": NaN`` lines (not
    JSON); now verify refuses the model in one line, and JSON output never holds NaN."""
    model = make_spkflow_model_dir(tmp_path / "model")
    emb = speaker_set(3, 6, 4, dim=16, prefix="s")
    scp = write_vectors(tmp_path / "emb", emb)
    trials = tmp_path / "trials"
    all_trials(sorted(emb), trials)
    run([PY, "-m", "spkflow.bin.calibrate", "--trials", trials, "--xvector-scp", scp, "--out-dir", model])
    meta = yaml.safe_load((model / "scoring.yaml").read_text())
    meta["calibration"]["weights"] = [float("nan")]
    (model / "scoring.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    pairs = tmp_path / "pairs"
    pairs.write_text("s000-u00 s000-u01\ns000-u00 s001-u00\n")
    p = run([PY, "-m", "spkflow.bin.verify", "--model", model, "--xvector-scp", scp, "--pairs", pairs], check=False)
    assert p.returncode == 1 and "NaN" not in p.stdout and not p.stdout.strip()
    assert "scoring.yaml: bad scoring" in p.stderr and "not all finite" in p.stderr and "Traceback" not in p.stderr
    assert json.loads(jsonsafe.dumps({"x": float("nan"), "y": [float("inf"), 1.5]})) == {"x": None, "y": [None, 1.5]}


def test_calibration_on_too_few_trials_is_refused_and_on_few_warned(sets, tmp_path):
    two = tmp_path / "two"
    lines = sets["dev_trials"].read_text().splitlines()
    two.write_text(
        next(x for x in lines if x.endswith(" target")) + "\n" + next(x for x in lines if "nontarget" in x) + "\n"
    )
    out = tmp_path / "model"
    out.mkdir()
    p = run([PY, "-m", "spkflow.bin.calibrate", "--trials", two, "--xvector-scp", sets["dev_scp"], "--out-dir", out],
            check=False)  # fmt: skip
    assert p.returncode == 1 and f"{two}: 1 target and 1 non-target trials" in p.stderr
    assert f"at least {MIN_CALIBRATION_TRIALS} of each" in p.stderr and not list(out.iterdir())
    # 4 speakers x 4 recordings: 24 target trials, enough to fit, few enough to warn
    p = run([PY, "-m", "spkflow.bin.calibrate", "--trials", sets["small_trials"], "--xvector-scp", sets["small_scp"],
             "--out-dir", out])  # fmt: skip
    assert "WARNING" in p.stderr and "calibration fitted on only 24 target and 96 non-target trials" in p.stderr
    p = run([PY, "-m", "spkflow.bin.calibrate", "--trials", sets["dev_trials"], "--xvector-scp", sets["dev_scp"],
             "--out-dir", out])  # fmt: skip
    assert "fitted on only" not in p.stderr


def test_the_logs_say_what_was_centred_and_which_backend(sets, tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    p = run([PY, "-m", "spkflow.bin.calibrate", "--trials", sets["dev_trials"], "--xvector-scp", sets["dev_scp"],
             "--out-dir", out])  # fmt: skip
    assert "centred on nothing (the scoring does not centre)" in p.stderr and "training mean" not in p.stderr
    assert "No centring" in Scoring.load(out).describe() and "training mean" not in Scoring.load(out).describe()
    cohort = write_vectors(tmp_path / "cohort", {k: v for k, v in sets["train_emb"].items() if k.endswith("u00")})
    p = run([PY, "-m", "spkflow.bin.score", "--trials", sets["small_trials"], "--xvector-scp", sets["small_scp"],
             "--outdir", tmp_path / "eval", "--backend", sets["backend"], "--cohort-scp", cohort, "--cohort-size", 4,
             "--plots", "false"])  # fmt: skip
    assert "(WCCN, cosine before AS-norm: EER" in p.stderr and "(cosine: EER" not in p.stderr


def test_qmf_with_a_cohort_size_above_the_training_speakers_clamps_and_says_so(tmp_path):
    """egs/voxceleb/spk1's cohort_size 300 on a training set of 40 speakers: stage 6's QMF fit
    failed after training ("needs more than top-40 entries"); now top-39 with a warning."""
    train = speaker_set(5, 40, 3, prefix="t")
    scp = write_vectors(tmp_path / "train" / "xvector", train)
    u2s = tmp_path / "utt2spk"
    u2s.write_text("".join(f"{k} {k.split('-')[0]}\n" for k in sorted(train)))
    means = {
        s: np.mean([v for k, v in train.items() if k.startswith(s + "-")], axis=0)
        for s in {k.split("-")[0] for k in train}
    }
    cohort = write_vectors(tmp_path / "train" / "spk_xvector", means)
    out = tmp_path / "qmf.json"
    p = run([PY, "-m", "spkflow.bin.fit_qmf", "--xvector-scp", scp, "--utt2spk", u2s, "--cohort-scp", cohort,
             "--cohort-size", 300, "--num-trials", 200, "--out", out])  # fmt: skip
    assert (
        "cohort has 40 entries, fewer than cohort_size=300: using top-39 (each trial's own speaker left out)"
        in p.stderr
    )
    assert json.loads(out.read_text())["measures"]


def test_a_calibration_on_training_trials_warns_with_the_measured_risk(sets, tmp_path):
    """spk.sh's default calibration set is the training set ("<set> (seen in training)"): stage 6's
    scoring of each test set then warns with the decisions' HTER against the EER it measured."""
    for name, set_name in (("seen", "train (seen in training)"), ("held", "dev")):
        model = tmp_path / name
        model.mkdir()
        src = "train" if name == "seen" else "dev"
        run([PY, "-m", "spkflow.bin.calibrate", "--trials", sets[f"{src}_trials"], "--xvector-scp", sets[f"{src}_scp"],
             "--set-name", set_name, "--out-dir", model])  # fmt: skip
        p = run([PY, "-m", "spkflow.bin.score", "--trials", sets["small_trials"], "--xvector-scp", sets["small_scp"],
                 "--outdir", tmp_path / "eval" / name, "--scoring-dir", model, "--plots", "false"])  # fmt: skip
        c = json.loads((tmp_path / "eval" / name / "metrics.json").read_text())["calibrated"]
        if name == "seen":
            assert "WARNING" in p.stderr and "the calibration was fitted on trials of the training set" in p.stderr
            assert f"HTER is {c['hter']:.2f}% against EER {c['eer']:.2f}%" in p.stderr and "--calib_set" in p.stderr
        else:
            assert "fitted on trials of the training set" not in p.stderr
