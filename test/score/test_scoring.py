"""Scoring and stage 6: real kaldiio arks, the CLI, score.sh, spk.sh stage 6, plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.paths import ROOT
from helpers.recipes import env, template_recipe
from helpers.vectors import all_trials, speaker_set, write_vectors
from spkflow.core.errors import InputError
from spkflow.score.backend import Backend, l2_rows
from spkflow.score.metrics import compute_eer, compute_metrics
from spkflow.score.trial_scoring import (
    Trials,
    asnorm_stats,
    read_cohort,
    read_embeddings,
    read_mean,
    read_scores,
    read_trials,
    score_trials,
    write_scores,
)

PY = sys.executable


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# ---------------------------------------------------------------- library
def test_cosine_scores_from_real_ark(tmp_path):
    emb = speaker_set(0, 4, 3)
    scp = write_vectors(tmp_path / "xvector", emb)
    trials_file = tmp_path / "trials"
    lines = all_trials(sorted(emb), trials_file)
    trials = read_trials(trials_file)
    assert len(trials) == len(lines) and trials.lines.tolist() == list(range(1, len(lines) + 1))
    assert [f"{t.enroll} {t.test} {'target' if t.target else 'nontarget'}\n" for t in trials] == lines
    assert [t.line for t in trials] == list(range(1, len(lines) + 1)) and trials.path == str(trials_file)
    loaded = read_embeddings(scp)
    assert set(loaded) == set(emb)
    for k, v in loaded.items():
        assert np.array_equal(v, emb[k].astype(np.float32).astype(np.float64))
    assert all(abs(np.linalg.norm(v) - 1) < 1e-12 for v in read_embeddings(scp, normalize=True).values())
    res = score_trials(trials, loaded)
    for e, t, s in zip(res.trials.enroll, res.trials.test, res.scores, strict=True):
        expected = cos(emb[e].astype(np.float32).astype(np.float64), emb[t].astype(np.float32).astype(np.float64))
        assert s == pytest.approx(expected, abs=1e-9)
    assert res.labels.tolist() == [int(ln.split()[2] == "target") for ln in lines]
    assert res.score_norm == "none" and res.n_skipped == 0


def test_read_embeddings_only_needed_keys(tmp_path):
    emb = speaker_set(1, 3, 2)
    scp = write_vectors(tmp_path / "xvector", emb)
    keys = sorted(emb)[:2] + ["not-there"]
    got = read_embeddings(scp, keys)
    assert sorted(got) == keys[:2]


def test_missing_utterance_is_an_error_naming_file_line_and_utt(tmp_path):
    emb = speaker_set(2, 3, 2)
    scp = write_vectors(tmp_path / "xvector", emb)
    trials_file = tmp_path / "trials"
    lines = all_trials(sorted(emb))
    lines.insert(3, "spk000-u00 ghost-u01 nontarget\n")
    lines.append("ghost-u02 spk001-u00 nontarget\n")
    trials_file.write_text("".join(lines))
    trials = read_trials(trials_file)
    with pytest.raises(InputError) as err:
        score_trials(trials, read_embeddings(scp), emb_source=str(scp))
    assert err.value.path == str(trials_file) and err.value.line == 4
    assert "'ghost-u01'" in str(err.value) and str(scp) in str(err.value)
    assert "1 more trial" in str(err.value)
    res = score_trials(trials, read_embeddings(scp), skip_missing=True)
    assert res.n_skipped == 2 and res.missing == ["ghost-u01", "ghost-u02"]
    assert len(res.scores) == len(lines) - 2


@pytest.mark.parametrize(
    "line,msg",
    [("a b\n", "expected 'utt1 utt2"), ("a b same\n", "'same'"), ("\n", "expected"), ("a b target x\n", "expected")],
)
def test_malformed_trials_line(tmp_path, line, msg):
    path = tmp_path / "trials"
    path.write_text("x-1 y-1 nontarget\n" + line)
    with pytest.raises(InputError, match=msg) as err:
        read_trials(path)
    assert err.value.line == 2 and err.value.path == str(path)


def test_read_scores_reads_what_write_scores_wrote(tmp_path):
    """Stage 6's scores file read back: the same trials, the scores to their 6 written decimals;
    a bad line is located like a bad trials line."""
    emb = speaker_set(0, 3, 3)
    trials_file = tmp_path / "trials"
    all_trials(sorted(emb), trials_file)
    res = score_trials(read_trials(trials_file), read_embeddings(write_vectors(tmp_path / "xvector", emb)))
    write_scores(tmp_path / "scores", res)
    trials, scores = read_scores(tmp_path / "scores")
    assert trials.enroll == res.trials.enroll and trials.test == res.trials.test
    assert trials.target.tolist() == res.trials.target.tolist()
    np.testing.assert_allclose(scores, res.scores, rtol=0, atol=5e-7)
    for line, msg in (("a b target\n", "expected 'utt1 utt2 score"), ("a b high target\n", "score must be a number")):
        (tmp_path / "bad").write_text("x-1 y-1 0.5 nontarget\n" + line)
        with pytest.raises(InputError, match=msg) as err:
            read_scores(tmp_path / "bad")
        assert err.value.line == 2 and err.value.path == str(tmp_path / "bad")


@pytest.mark.parametrize("label", ["target", "nontarget"])
def test_trials_of_one_label_are_an_error(tmp_path, label):
    path = tmp_path / "trials"
    path.write_text(f"a-1 a-2 {label}\nb-1 b-2 {label}\n")
    with pytest.raises(InputError, match="EER and minDCF need both") as err:
        read_trials(path)
    assert err.value.path == str(path)
    n = "2 target and 0 non-target" if label == "target" else "0 target and 2 non-target"
    assert n in str(err.value)


def test_trials_and_scp_that_are_not_utf8_name_the_line(tmp_path):
    path = tmp_path / "trials"
    path.write_bytes("a-1 \u9ed2-2 target\n".encode() + b"a-1 b-\xe9x nontarget\n")
    with pytest.raises(InputError, match=r"not UTF-8 \(byte e9\)") as err:
        read_trials(path)
    assert err.value.path == str(path) and err.value.line == 2
    scp = write_vectors(tmp_path / "x", {"a-1": np.ones(3)})
    scp.write_bytes(scp.read_bytes() + b"b-\xff1 x.ark:3\n")
    with pytest.raises(InputError, match=r"not UTF-8 \(byte ff\)") as err:
        read_embeddings(scp)
    assert err.value.line == 2


def test_skipping_down_to_one_label_is_an_error(tmp_path):
    emb = speaker_set(3, 2, 2)
    path = tmp_path / "trials"
    path.write_text("spk000-u00 spk000-u01 target\nspk000-u00 ghost-u00 nontarget\n")
    trials = read_trials(path)  # both labels in the file ...
    with pytest.raises(InputError, match=r"1 target and 0 non-target trials left after skipping 1 trial") as err:
        score_trials(trials, emb, skip_missing=True)  # ... but not among the trials with embeddings
    assert err.value.path == str(path)


def test_bad_scp_entries_are_located(tmp_path):
    emb = {"a-1": np.ones(4), "b-1": np.ones(5)}
    scp = write_vectors(tmp_path / "x", emb)
    with pytest.raises(InputError, match="dimension 5") as err:
        read_embeddings(scp)
    assert err.value.line == 2
    scp2 = write_vectors(tmp_path / "z", {"a-1": np.zeros(4)})
    with pytest.raises(InputError, match="all zeros"):
        read_embeddings(scp2)
    scp3 = tmp_path / "dup.scp"
    first = scp2.read_text()
    scp3.write_text(first + first)
    with pytest.raises(InputError, match="duplicate key") as err:
        read_embeddings(scp3)
    assert err.value.line == 2
    scp4 = tmp_path / "broken.scp"
    scp4.write_text(f"a-1 {tmp_path}/nope.ark:12\n")
    with pytest.raises(InputError, match="cannot read") as err:
        read_embeddings(scp4)
    assert err.value.line == 1


def test_asnorm_matches_naive_definition(tmp_path):
    emb = speaker_set(3, 5, 3)
    cohort = speaker_set(4, 12, 1, prefix="coh")
    cohort_mat = np.stack([v / np.linalg.norm(v) for v in cohort.values()])
    trials = Trials.from_pairs((a, b, a[:6] == b[:6]) for a in sorted(emb) for b in sorted(emb) if a < b)
    res = score_trials(trials, emb, cohort=cohort_mat, cohort_size=5)
    assert res.score_norm == "asnorm" and res.cohort_size == 5

    def stats(x: np.ndarray) -> tuple[float, float]:
        top = sorted((cos(x, c) for c in cohort_mat), reverse=True)[:5]
        return float(np.mean(top)), float(np.std(top))

    for e, t, s, raw in zip(trials.enroll, trials.test, res.scores, res.raw_scores, strict=True):
        s_raw = cos(emb[e], emb[t])
        (me, se), (mt, st) = stats(emb[e]), stats(emb[t])
        assert raw == pytest.approx(s_raw, abs=1e-12)
        assert s == pytest.approx(0.5 * ((s_raw - me) / se + (s_raw - mt) / st), abs=1e-9)
    # a cohort smaller than asked: all of it is used
    assert score_trials(trials, emb, cohort=cohort_mat, cohort_size=500).cohort_size == 12
    with pytest.raises(ValueError, match="top_k"):
        asnorm_stats(cohort_mat, cohort_mat, 1)


def test_centring_subtracts_the_mean_everywhere(tmp_path):
    emb = speaker_set(13, 4, 3)
    cohort = speaker_set(14, 10, 1, prefix="coh")
    scp = write_vectors(tmp_path / "coh", cohort)
    mean = read_mean(scp)
    assert np.allclose(mean, np.mean([v.astype(np.float32) for v in cohort.values()], axis=0), atol=1e-6)
    trials = Trials.from_pairs((a, b, a[:6] == b[:6]) for a in sorted(emb) for b in sorted(emb) if a < b)
    res = score_trials(trials, emb, mean=mean, cohort=np.stack(list(cohort.values())), cohort_size=4)
    shifted = {k: v - mean for k, v in emb.items()}
    ref = score_trials(trials, shifted, cohort=np.stack([v - mean for v in cohort.values()]), cohort_size=4)
    assert np.allclose(
        res.raw_scores, [cos(shifted[e], shifted[t]) for e, t in zip(trials.enroll, trials.test, strict=True)]
    )
    assert np.allclose(res.scores, ref.scores)
    with pytest.raises(ValueError, match="dimension"):
        score_trials(trials, emb, mean=mean[:3])


def test_asnorm_removes_a_nuisance_offset():
    """Utterances sharing a nuisance direction get inflated cosine scores; AS-norm's
    per-utterance cohort statistics remove most of it (EER drops)."""
    emb = speaker_set(5, 30, 4, dim=40, noise=0.8, nuisance=1.5)
    cohort_utts = speaker_set(6, 100, 5, dim=40, noise=0.8, nuisance=1.5, prefix="coh")
    cohort = np.stack(
        [np.mean([v for k, v in cohort_utts.items() if k.startswith(f"coh{s:03d}")], axis=0) for s in range(100)]
    )
    keys = sorted(emb)
    trials = Trials.from_pairs((*ln.split()[:2], ln.split()[2] == "target") for ln in all_trials(keys))
    res = score_trials(trials, emb, cohort=cohort, cohort_size=20)
    raw_eer = compute_eer(res.raw_scores, res.labels)[0]
    norm_eer = compute_eer(res.scores, res.labels)[0]
    assert norm_eer < raw_eer - 3.0, (raw_eer, norm_eer)


# ---------------------------------------------------------------- command line and stage 6
def _png_ok(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 200
    assert img[..., :3].std() > 0.05  # not a blank canvas


def test_score_cli_writes_everything(tmp_path):
    emb = speaker_set(7, 6, 4)
    scp = write_vectors(tmp_path / "embed" / "test" / "xvector", emb)
    cohort = write_vectors(tmp_path / "embed" / "train" / "spk_xvector", speaker_set(8, 20, 1, prefix="tr"))
    trials = tmp_path / "data" / "test" / "trials"
    lines = all_trials(sorted(emb), trials)
    exp = tmp_path / "exp"
    (exp / "config.yaml").parent.mkdir(parents=True)
    (exp / "config.yaml").write_text("model:\n  name: ecapa\nloss:\n  name: ge2e_xs\n")
    out = exp / "eval" / "test"
    cmd = [
        PY,
        "-m",
        "spkflow.bin.score",
        "--trials",
        str(trials),
        "--xvector-scp",
        str(scp),
        "--outdir",
        str(out),
        "--model-tag",
        "spk_demo",
        "--results-md",
        str(exp),
    ]
    subprocess.run(cmd, check=True, env=env(), capture_output=True, text=True)
    scores = (out / "scores").read_text().splitlines()
    assert len(scores) == len(lines)
    for got, want in zip(scores, lines, strict=True):
        u1, u2, s, lab = got.split()
        assert [u1, u2, lab] == want.split() and np.isfinite(float(s))
    m = json.loads((out / "metrics.json").read_text())
    labels = np.array([ln.split()[3] == "target" for ln in scores])
    ref = compute_metrics(np.array([float(ln.split()[2]) for ln in scores]), labels)
    for key in ("eer", "min_dcf_p0.01", "min_dcf_p0.05", "n_target", "n_nontarget"):
        assert m[key] == pytest.approx(ref[key], abs=1e-4)
    assert m["n_target"] == 6 * 6 and m["score_norm"] == "none" and m["model_tag"] == "spk_demo"
    _png_ok(out / "det.png")
    _png_ok(out / "score_hist.png")
    assert not list(out.glob(".*.tmp"))

    # AS-norm on a second set; RESULTS.md then has both sets, the test set with one row
    out2 = exp / "eval" / "test_norm"
    subprocess.run(
        cmd[:-4]
        + ["--outdir", str(out2), "--cohort-scp", str(cohort), "--cohort-size", "10", "--results-md", str(exp)],
        check=True,
        env=env(),
        capture_output=True,
    )
    m2 = json.loads((out2 / "metrics.json").read_text())
    assert m2["score_norm"] == "asnorm" and m2["cohort_size"] == 10
    assert m2["raw"]["eer"] == pytest.approx(m["eer"])
    md = (exp / "RESULTS.md").read_text()
    assert "## test\n" in md and "## test_norm\n" in md
    assert f"| {m['eer']:.2f} |" in md and "AS-norm (top 10)" in md and "| ecapa | ge2e_xs |" in md
    assert md.count("| cosine |") == 2


def test_score_cli_failure_removes_previous_outputs(tmp_path):
    """A failed re-score leaves nothing of the earlier run that could pass for its result."""
    emb = speaker_set(9, 3, 3)
    scp = write_vectors(tmp_path / "xvector", emb)
    trials = tmp_path / "trials"
    all_trials(sorted(emb), trials)
    exp = tmp_path / "exp"
    out = exp / "eval" / "test"
    base = [PY, "-m", "spkflow.bin.score", "--xvector-scp", str(scp), "--outdir", str(out)]
    subprocess.run(base + ["--trials", str(trials), "--results-md", str(exp)], check=True, env=env())
    assert {"scores", "metrics.json", "det.png", "score_hist.png"} <= {p.name for p in out.iterdir()}
    assert "## test\n" in (exp / "RESULTS.md").read_text()
    bad = tmp_path / "trials.bad"
    bad.write_text(trials.read_text() + "spk000-u00 lost-u9 nontarget\n")
    n_lines = len(bad.read_text().splitlines())
    proc = subprocess.run(base + ["--trials", str(bad)], env=env(), capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{bad}:{n_lines}: utterance 'lost-u9' has no embedding" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == []
    ok = subprocess.run(base + ["--trials", str(bad), "--skip-missing"], env=env(), capture_output=True, text=True)
    assert ok.returncode == 0 and "1 skipped" in ok.stderr
    assert json.loads((out / "metrics.json").read_text())["n_skipped"] == 1
    # only targets: one clear line, no traceback; no scores without metrics.json, and the
    # set's row leaves RESULTS.md (the only set: RESULTS.md goes)
    only = tmp_path / "trials.targets"
    only.write_text("".join(ln for ln in trials.read_text().splitlines(True) if ln.endswith(" target\n")))
    proc = subprocess.run(
        base + ["--trials", str(only), "--results-md", str(exp)], env=env(), capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{only}: 9 target and 0 non-target trials: EER and minDCF need both" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == []
    assert not (exp / "RESULTS.md").exists()


def test_results_md_with_a_damaged_metrics_json(tmp_path):
    """Another set's metrics.json cut short: one line naming it, no traceback; this set is scored."""
    emb = speaker_set(11, 3, 3)
    scp = write_vectors(tmp_path / "xvector", emb)
    trials = tmp_path / "trials"
    all_trials(sorted(emb), trials)
    exp = tmp_path / "exp"
    damaged = exp / "eval" / "old" / "metrics.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"eer": 3.5, "min_dcf')
    cmd = [PY, "-m", "spkflow.bin.score", "--trials", str(trials), "--xvector-scp", str(scp), "--no-plots"]
    proc = subprocess.run(
        cmd + ["--outdir", str(exp / "eval" / "test"), "--results-md", str(exp)],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{damaged}: not a metrics file" in proc.stderr and "the scores of test are written" in proc.stderr
    assert (exp / "eval" / "test" / "metrics.json").is_file() and not (exp / "RESULTS.md").exists()
    damaged.write_text('{"set": "old"}\n')
    proc = subprocess.run(
        cmd + ["--outdir", str(exp / "eval" / "test"), "--results-md", str(exp)],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and f"{damaged}: no eer, min_dcf_p0.01" in proc.stderr


def test_score_cli_failure_while_writing_leaves_nothing(tmp_path):
    """A write that fails half way (here: an unwritable plot, as on a full disk) leaves no
    scores without metrics.json and no temporary files."""
    emb = speaker_set(4, 3, 3)
    scp = write_vectors(tmp_path / "xvector", emb)
    trials = tmp_path / "trials"
    all_trials(sorted(emb), trials)
    out = tmp_path / "eval"
    cmd = [PY, "-m", "spkflow.bin.score", "--trials", str(trials), "--xvector-scp", str(scp), "--outdir", str(out)]
    subprocess.run(cmd, check=True, env=env())
    # matplotlib is made to fail the way a full disk makes it fail: OSError(ENOSPC) from savefig
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import errno, matplotlib.figure\n"
        "def _full(self, *a, **k):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "matplotlib.figure.Figure.savefig = _full\n"
    )
    hooked = env()
    hooked["PYTHONPATH"] = f"{hook}{os.pathsep}{hooked['PYTHONPATH']}"
    proc = subprocess.run(cmd, env=hooked, capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "No space left on device" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == []


def test_stage6_in_spk_sh(tmp_path):
    rec = template_recipe(tmp_path / "recipe")
    exp = rec / "exp" / "spk_demo"
    for name, seed in (("test", 10), ("dsp20", 11)):
        emb = speaker_set(seed, 5, 3, prefix=name)
        write_vectors(exp / "embed" / name / "xvector", emb)
        all_trials(sorted(emb), rec / "data" / name / "trials")
    write_vectors(exp / "embed" / "train" / "spk_xvector", speaker_set(12, 30, 1, prefix="tr"))
    args = ["bash", "spk.sh", "--stage", "6", "--stop_stage", "6", "--tag", "demo", "--test_sets", "test dsp20"]
    norm = args + ["--score_norm", "true", "--cohort_size", "8", "--score_center", "true"]
    # the default calibration draws its trials from the training set: without it, a one-line error
    proc = subprocess.run(norm, cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode == 1 and "data/train/utt2spk: no such file" in proc.stderr
    assert "the default calibration trials are drawn from data/train" in proc.stdout
    train = speaker_set(13, 30, 3, prefix="tr")
    write_vectors(exp / "embed" / "train" / "xvector", train)
    (rec / "data" / "train").mkdir(parents=True)
    (rec / "data" / "train" / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in sorted(train)))
    proc = subprocess.run(norm, cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("test", "dsp20"):
        m = json.loads((exp / "eval" / name / "metrics.json").read_text())
        assert m["score_norm"] == "asnorm" and m["cohort_size"] == 8 and m["model_tag"] == "spk_demo"
        assert m["mean_scp"].endswith("embed/train/spk_xvector.scp")
        assert (exp / "eval" / name / "det.png").is_file() and (exp / "eval" / name / "log" / "score.log").is_file()
    md = (exp / "RESULTS.md").read_text()
    assert "## test\n" in md and "## dsp20\n" in md and md.count("AS-norm (top 8), centred") == 2

    # a trials line naming an utterance without an embedding fails stage 6 loudly ...
    trials = rec / "data" / "test" / "trials"
    trials.write_text(trials.read_text() + "test000-u00 nobody-u00 nontarget\n")
    proc = subprocess.run(args, cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode != 0
    assert "'nobody-u00' has no embedding" in proc.stdout + proc.stderr
    # ... unless skipped on purpose
    proc = subprocess.run(args + ["--score_skip_missing", "true"], cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((exp / "eval" / "test" / "metrics.json").read_text())["n_skipped"] == 1
    # a WCCN backend fitted on the training set's utterance embeddings by stage 6 itself
    train = speaker_set(13, 30, 4, prefix="tr", nuisance=2.0)
    write_vectors(exp / "embed" / "train" / "xvector", train)
    (rec / "data" / "train" / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in sorted(train)))
    wccn = args + [
        "--score_backend",
        "wccn",
        "--score_norm",
        "true",
        "--cohort_size",
        "8",
        "--score_skip_missing",
        "true",
    ]
    proc = subprocess.run(wccn + ["--score_center", "false"], cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from spkflow.score.backend import Backend, fit_backend

    backend = Backend.load(exp / "backend" / "wccn.npz")
    want = fit_backend(
        "wccn", np.stack([train[u] for u in sorted(train)]).astype(np.float32), [u.split("-")[0] for u in sorted(train)]
    )
    assert np.allclose(backend.proj, want.proj, atol=1e-5)
    m = json.loads((exp / "eval" / "dsp20" / "metrics.json").read_text())
    assert m["backend"] == "wccn" and m["backend_path"].endswith("backend/wccn.npz") and m["mean_scp"] == ""
    emb = read_embeddings(exp / "embed" / "dsp20" / "xvector.scp")
    cohort = backend.transform(read_cohort(exp / "embed" / "train" / "spk_xvector.scp"))
    ref = score_trials(
        read_trials(rec / "data" / "dsp20" / "trials"),
        {u: backend.transform(v[None])[0] for u, v in emb.items()},
        cohort=cohort,
        cohort_size=8,
    )
    assert m["eer"] == pytest.approx(compute_eer(ref.scores, ref.labels)[0], abs=1e-6)
    assert "WCCN, AS-norm (top 8)" in (exp / "RESULTS.md").read_text()
    # --score_eval_mean true: the backend's training mean replaced by the set's own (its L2-normalised trial utterances)
    proc = subprocess.run(wccn + ["--score_eval_mean", "true"], cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = json.loads((exp / "eval" / "dsp20" / "metrics.json").read_text())
    assert m["eval_mean"] is True and m["mean_scp"] == "" and m["backend"] == "wccn"
    used = {u: v for u, v in emb.items() if u in set(ref.trials.enroll) | set(ref.trials.test)}
    own = backend.centred_on(l2_rows(np.stack(list(used.values()))).mean(axis=0))
    ref_own = score_trials(
        read_trials(rec / "data" / "dsp20" / "trials"),
        {u: own.transform(v[None])[0] for u, v in emb.items()},
        cohort=own.transform(read_cohort(exp / "embed" / "train" / "spk_xvector.scp")),
        cohort_size=8,
    )
    assert m["eer"] == pytest.approx(compute_eer(ref_own.scores, ref_own.labels)[0], abs=1e-6)
    assert "WCCN, AS-norm (top 8), centred on the set" in (exp / "RESULTS.md").read_text()
    # the backend centres on its own mean: asking for centring too is refused before anything runs
    proc = subprocess.run(wccn + ["--score_center", "true"], cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode == 2 and "set --score_center false" in proc.stdout
    both = args + ["--score_center", "true", "--score_eval_mean", "true"]
    proc = subprocess.run(both, cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode == 2 and "not both" in proc.stdout
    proc = subprocess.run(args + ["--score_backend", "plda"], cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode == 2 and "--score_backend must be cosine, wccn or lda, got 'plda'" in proc.stdout
    # score_norm without training-set embeddings: a clear error
    (exp / "embed" / "train" / "spk_xvector.scp").unlink()
    proc = subprocess.run(args + ["--score_norm", "true"], cwd=rec, env=env(), capture_output=True, text=True)
    assert proc.returncode != 0 and "run stage 5 with the same options" in proc.stdout + proc.stderr


def test_eval_mean_removes_a_shift_the_training_mean_does_not_see(tmp_path):
    """An evaluation set whose embeddings all share an offset (another corpus): cosine scores
    see the offset as similarity; centring on the set's own mean (no labels) removes it, the
    training mean does not.  Not combined with a training mean."""
    from spkflow.score.eval_report import evaluate_set

    emb = speaker_set(21, 8, 4, dim=16, noise=1.5)
    shift = 2.5 * np.random.default_rng(5).normal(size=16)
    scp = str(write_vectors(tmp_path / "x", {u: v + shift for u, v in emb.items()}))
    train = str(write_vectors(tmp_path / "tr", speaker_set(22, 20, 1, dim=16, prefix="tr")))
    trials = str(tmp_path / "trials")
    all_trials(sorted(emb), tmp_path / "trials")
    plain = evaluate_set(trials, scp, str(tmp_path / "plain"), plots=False)
    by_train = evaluate_set(trials, scp, str(tmp_path / "tr_c"), mean_scp=train, plots=False)
    own = evaluate_set(trials, scp, str(tmp_path / "own"), eval_mean=True, plots=False)
    unshifted = evaluate_set(trials, str(write_vectors(tmp_path / "y", emb)), str(tmp_path / "y"), plots=False)
    assert own["eer"] < 0.8 * min(plain["eer"], by_train["eer"])  # 19.6 against 28.1 / 27.9
    assert own["eer"] <= unshifted["eer"] + 1.0  # back where the set was before the shift
    assert own["eval_mean"] and not plain["eval_mean"]
    with pytest.raises(ValueError, match="not both"):
        evaluate_set(trials, scp, str(tmp_path / "x2"), mean_scp=train, eval_mean=True)
    with pytest.raises(ValueError, match="16-dim mean, got 3"):
        Backend("wccn", np.zeros(16), np.eye(16)).centred_on(np.zeros(3))


def test_score_sh_usage(tmp_path):
    rec = template_recipe(tmp_path / "recipe")
    proc = subprocess.run(
        ["bash", "scripts/spk/score.sh", "only-one-arg"], cwd=rec, env=env(), capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Usage:" in proc.stderr


def test_score_sh_from_any_directory(tmp_path):
    """score.sh by its path from a directory that is no recipe, with no utils on PATH."""
    emb = speaker_set(5, 3, 3)
    write_vectors(tmp_path / "xvector", emb)
    all_trials(sorted(emb), tmp_path / "trials")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PATH="/usr/bin:/bin", SPKFLOW_PYTHON=PY)
    env.pop("PYTHONPATH", None)
    score = ROOT / "scripts" / "spk" / "score.sh"
    proc = subprocess.run(
        ["bash", str(score), "--set-name", "x", "../trials", "../xvector.scp", "out"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((elsewhere / "out" / "metrics.json").read_text())["set"] == "x"
    # usage errors and bad options from there too
    proc = subprocess.run(["bash", str(score), "one"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and "Usage:" in proc.stderr
    proc = subprocess.run(
        ["bash", str(score), "--skip-missing", "yes", "../trials", "../xvector.scp", "out"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and 'expected "true" or "false": --skip-missing yes' in proc.stderr
    proc = subprocess.run(
        ["bash", str(score), "../trials", "../nothing.scp", "out"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "../nothing.scp not found" in proc.stdout + proc.stderr
    assert not (elsewhere / "out" / "metrics.json").exists()  # a failed re-score removes the old result


def test_two_score_sh_runs_into_one_dir(tmp_path):
    """While one score.sh run scores into a dir, a second into the same dir is refused naming the
    first (pid and command) and removes nothing; the first then finishes and releases the lock.
    The first run's python is a real wrapper that waits for a go file before scoring, so the two
    runs overlap for sure."""
    emb = speaker_set(5, 3, 3)
    scp = write_vectors(tmp_path / "xvector", emb)
    trials = tmp_path / "trials"
    all_trials(sorted(emb), trials)
    started, go = tmp_path / "started", tmp_path / "go"
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = spkflow.bin.score ]; then touch {started}; '
        f"for _ in $(seq 600); do [ -e {go} ] && break; sleep 0.1; done; fi\n"
        f'exec {PY} "$@"\n'
    )
    wrapper.chmod(0o755)
    out = tmp_path / "eval"
    score = ROOT / "scripts" / "spk" / "score.sh"
    first = subprocess.Popen(
        ["bash", str(score), "--python", str(wrapper), str(trials), str(scp), str(out)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):
            if started.exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert started.exists(), first.communicate()
        (out / "scores").write_text("the first run's\n")  # stands for a file the first run is writing
        second = subprocess.run(
            ["bash", str(score), str(trials), str(scp), str(out)], env=env(), capture_output=True, text=True
        )
        assert second.returncode == 1
        assert f"{out} is in use by another run: pid {first.pid} on " in second.stderr, second.stderr
        assert "score.sh" in second.stderr and "EER" not in second.stdout + second.stderr
        assert (out / "scores").read_text() == "the first run's\n"  # the refused run removed nothing
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stdout + stderr
    assert json.loads((out / "metrics.json").read_text())["eer"] >= 0
    assert not (out / ".spkflow.core.lock").exists()


def test_score_sh_one_label_trials(tmp_path):
    emb = speaker_set(6, 3, 3)
    scp = write_vectors(tmp_path / "xvector", emb)
    trials = tmp_path / "trials"
    trials.write_text("".join(ln for ln in all_trials(sorted(emb)) if ln.endswith(" nontarget\n")))
    score = ROOT / "scripts" / "spk" / "score.sh"
    proc = subprocess.run(
        ["bash", str(score), str(trials), str(scp), str(tmp_path / "out")], env=env(), capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert "0 target and 27 non-target trials: EER and minDCF need both" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr + (tmp_path / "out" / "log" / "score.log").read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["log"]


# ---------------------------------------------------------------- plots
def test_training_curves_plot(tmp_path):
    from spkflow.score.plots import plot_training_curves

    history = [
        {"epoch": e, "train_loss": 3.0 / e, "valid_eer": 20.0 / e + 2, "lr": 1e-3 * 0.9**e, "note": "text is ignored"}
        for e in range(1, 8)
    ]
    path = tmp_path / "curves.png"
    plot_training_curves(history, path)
    _png_ok(path)
    with pytest.raises(ValueError, match="no loss, eer or lr"):
        plot_training_curves([{"epoch": 1, "note": "x"}], tmp_path / "x.png")
