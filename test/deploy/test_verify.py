"""Verification and identification of recordings with a model (spkflow.deploy.verify, the
commands spkflow.bin.verify and identify, Embedder.verify / score): real audio files made here,
stage 5 for real (extract_embeddings.sh), stage 6 for real (score.sh), a tiny model with random
weights whose scoring (WCCN backend, AS-norm cohort, calibration) is fitted here."""

from __future__ import annotations

import json
import math
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.audio import make_speakers
from helpers.models import make_spkflow_model_dir
from helpers.paths import ROOT
from helpers.recipes import run
from spkflow.score.scoring import read_embeddings

PY = sys.executable
SCRIPTS = ROOT / "scripts" / "spk"


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model dir with a fitted scoring (stage 6's steps for real) and its pack; data dirs of
    synthetic speakers (train: backend and cohort, dev: calibration, test: scored here)."""
    root = tmp_path_factory.mktemp("scored")
    d: dict[str, Path] = {"model": make_spkflow_model_dir(root / "exp" / "spk_tiny")}
    for name, seed, n_spk in (("train", 0, 6), ("dev", 1, 5), ("test", 2, 5)):
        d[name] = make_speakers(root / name, num_spk=n_spk, num_utt=3, seed=seed)
        run([SCRIPTS / "extract_embeddings.sh", "--nj", 2, "--model-dir", d["model"], d[name], root / "embed" / name])
        d[f"{name}_scp"] = root / "embed" / name / "xvector.scp"
    for name in ("dev", "test"):
        run([PY, "-m", "spkflow.bin.make_trials", "--nontarget-ratio", 100, d[name]])
    backend = root / "exp" / "spk_tiny" / "backend" / "wccn.npz"
    run([PY, "-m", "spkflow.bin.fit_backend", "--backend", "wccn", "--xvector-scp", d["train_scp"],
         "--utt2spk", d["train"] / "utt2spk", "--out", backend])  # fmt: skip
    d["fit"] = [
        "--backend", backend, "--cohort-scp", root / "embed" / "train" / "spk_xvector.scp", "--cohort-size", 3,
    ]  # fmt: skip
    run([PY, "-m", "spkflow.bin.calibrate", "--trials", d["dev"] / "trials", "--xvector-scp", d["dev_scp"],
         *d["fit"], "--set-name", "dev", "--out-dir", d["model"]])  # fmt: skip
    d["pack"] = root / "spk_tiny.zip"
    run([PY, "-m", "spkflow.bin.pack", "--model-dir", d["model"], "--out", d["pack"]])
    d["root"] = root
    return d


def wav_scp(data: Path) -> dict[str, str]:
    return dict(line.split(None, 1) for line in (data / "wav.scp").read_text().splitlines())


def stage6(d: dict[str, Path], out: Path, eval_mean: bool) -> dict[tuple[str, str], float]:
    run([SCRIPTS / "score.sh", "--scoring-dir", d["model"], "--eval-mean", str(eval_mean).lower(),
         d["test"] / "trials", d["test_scp"], out])  # fmt: skip
    return {(a, b): float(s) for a, b, s, _ in (ln.split() for ln in (out / "scores").read_text().splitlines())}


def test_verify_pairs_equal_stage6_and_the_api(scored, tmp_path):
    """verify over stage 5's embeddings gives stage 6's scores (centred on the set, as stage 6's
    --score_eval_mean true; --domain-mean train as stage 6's default) within 1e-5, and the API
    gives the command's numbers within 1e-4."""
    from spkflow import Embedder

    d = scored
    rows = jsonl(
        run(
            [
                PY,
                "-m",
                "spkflow.bin.verify",
                "--model",
                d["pack"],
                "--xvector-scp",
                d["test_scp"],
                "--pairs",
                d["test"] / "trials",
            ]
        ).stdout  # fmt: skip
    )
    own = stage6(d, tmp_path / "own", eval_mean=True)
    assert len(rows) == len(own) and {"score", "norm_score", "llr", "same_speaker", "label"} <= set(rows[0])
    assert max(abs(r["norm_score"] - own[(r["a"], r["b"])]) for r in rows) <= 1e-5
    train_rows = jsonl(
        run(
            [
                PY,
                "-m",
                "spkflow.bin.verify",
                "--model",
                d["model"],
                "--xvector-scp",
                d["test_scp"],
                "--pairs",
                d["test"] / "trials",
                "--domain-mean",
                "train",
            ]
        ).stdout  # fmt: skip
    )
    plain = stage6(d, tmp_path / "plain", eval_mean=False)
    assert max(abs(r["norm_score"] - plain[(r["a"], r["b"])]) for r in train_rows) <= 1e-5
    assert max(abs(r["norm_score"] - t["norm_score"]) for r, t in zip(rows, train_rows, strict=True)) > 1e-3
    # the API on the same embeddings, centred on the same recordings
    emb = Embedder.from_pretrained(d["pack"])
    vec = read_embeddings(d["test_scp"])
    v = emb.score(
        np.stack([vec[r["a"]] for r in rows]),
        np.stack([vec[r["b"]] for r in rows]),
        domain=np.stack(list(vec.values())),
    )
    for key in ("score", "norm_score", "llr"):
        assert np.abs(np.asarray(getattr(v, key)) - [r[key] for r in rows]).max() <= 1e-4, key
    assert [bool(x) for x in v.same_speaker] == [r["same_speaker"] for r in rows]
    assert all(r["same_speaker"] == (r["llr"] > 0) for r in rows)
    # the score is the model's plain cosine of the raw embeddings
    r0 = rows[0]
    a, b = vec[r0["a"]], vec[r0["b"]]
    assert r0["score"] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-6)


def test_verify_two_files_equals_the_api_and_audio_equals_embeddings(scored):
    from spkflow import Embedder

    d = scored
    wavs = wav_scp(d["test"])
    utts = sorted(wavs)
    a, b = wavs[utts[0]], wavs[utts[4]]
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], a, b])
    (row,) = jsonl(p.stdout)
    assert row["a"] == a and row["b"] == b and "label" not in row
    assert "centred on the training mean" in p.stderr and "WCCN, AS-norm (top 3)" in p.stderr
    v = Embedder.from_pretrained(d["pack"]).verify(a, b)
    assert isinstance(v.llr, float) and isinstance(v.same_speaker, bool)
    for key in ("score", "norm_score", "llr"):
        assert abs(getattr(v, key) - row[key]) <= 1e-4
    # one pair centred on other recordings like it (a data dir, or their embeddings): as the API
    (dom_row,) = jsonl(
        run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--domain-mean", d["test"], a, b]).stdout
    )
    vec = read_embeddings(d["test_scp"])
    api = Embedder.from_pretrained(d["pack"]).verify(a, b, domain=np.stack(list(vec.values())))
    assert abs(api.llr - dom_row["llr"]) <= 1e-4 and abs(dom_row["norm_score"] - row["norm_score"]) > 1e-3
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--domain-mean", d["dev"] / "utt2spk", a, b], False)
    assert p.returncode == 1 and "utt2spk:1: cannot read embedding" in p.stderr
    # the data dir's audio (--data) gives what stage 5's embeddings give
    pairs = d["test"] / "trials"
    from_audio = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["model"], "--data", d["test"],
                            "--pairs", pairs]).stdout)  # fmt: skip
    from_scp = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["model"], "--xvector-scp", d["test_scp"],
                          "--pairs", pairs]).stdout)  # fmt: skip
    assert max(abs(x["llr"] - y["llr"]) for x, y in zip(from_audio, from_scp, strict=True)) <= 1e-4


def test_verify_summary_of_labelled_pairs_and_a_prior(scored, tmp_path):
    d = scored
    out = tmp_path / "scores.jsonl"
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--xvector-scp", d["test_scp"],
             "--pairs", d["test"] / "trials", "--out", out, "--p-target", 0.01])  # fmt: skip
    rows = jsonl(out.read_text())
    assert p.stdout == "" and "labelled: EER" in p.stderr and "Cllr" in p.stderr
    thr = math.log(99)  # -logit(0.01)
    assert all(r["same_speaker"] == (r["llr"] > thr) for r in rows)
    miss = 100 * np.mean([not r["same_speaker"] for r in rows if r["label"] == "target"])
    assert f"miss {miss:.2f}%" in p.stderr


def test_verify_bad_input_is_named(scored, tmp_path):
    d = scored
    wavs = wav_scp(d["test"])
    good = sorted(wavs.values())[0]
    missing = tmp_path / "nope.wav"
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], good, missing], check=False)
    assert p.returncode == 1 and str(missing) in p.stderr and "not found" in p.stderr and p.stdout == ""
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF....WAVEfmt garbage")
    pairs = tmp_path / "pairs"
    pairs.write_text(f"{good} {sorted(wavs.values())[1]}\n{good} {broken}\n")
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--pairs", pairs], check=False)
    assert p.returncode == 1 and str(broken) in p.stderr
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--pairs", pairs, "--skip-bad", "true"])
    assert len(jsonl(p.stdout)) == 1 and "1 pairs left out" in p.stderr and str(broken) in p.stderr
    pairs.write_text(f"{good} {good} target\n{good}\n")
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--pairs", pairs], check=False)
    assert p.returncode == 1 and f"{pairs}:2:" in p.stderr
    pairs.write_text("no-such-utt spk000-utt00\n")
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--data", d["test"], "--pairs", pairs], check=False)
    assert p.returncode == 1 and "no utterance 'no-such-utt'" in p.stderr and "wav.scp" in p.stderr
    # the packed/ folder instead of the zip: a hint
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"].parent, good, good], check=False)
    assert p.returncode == 1 and f"give that file ({d['pack']})" in p.stderr
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], good], check=False)
    assert p.returncode == 2 and "give two recordings A B, or --pairs FILE" in p.stderr


def test_an_older_pack_without_scoring_gives_plain_cosine_and_says_so(scored, tmp_path):
    from spkflow import Embedder

    d = scored
    old = tmp_path / "old.zip"
    old_dir = tmp_path / "old_model"
    old_dir.mkdir()
    for f in ("config.yaml", "model.pth"):
        (old_dir / f).write_bytes((d["model"] / f).read_bytes())
    run([PY, "-m", "spkflow.bin.pack", "--model-dir", old_dir, "--out", old])
    assert "scoring.yaml" not in zipfile.ZipFile(old).namelist()
    a, b = sorted(wav_scp(d["test"]).values())[:2]
    p = run([PY, "-m", "spkflow.bin.verify", "--model", old, a, b])
    (row,) = jsonl(p.stdout)
    assert row["llr"] is None and row["same_speaker"] is None and row["score"] == row["norm_score"]
    assert "holds no scoring" in p.stderr and "plain cosine" in p.stderr
    emb = Embedder.from_pretrained(old)
    assert emb.scoring.is_plain and "plain cosine" in emb.scoring_note
    assert abs(emb.verify(a, b).score - row["score"]) <= 1e-4


def test_an_onnx_model_verifies_with_plain_cosine(scored, tmp_path):
    pytest.importorskip("onnxruntime")
    d = scored
    onnx = tmp_path / "tiny.onnx"
    run([PY, "-m", "spkflow.bin.export", "--model-dir", d["model"], "--out", onnx])
    a, b = sorted(wav_scp(d["test"]).values())[:2]
    p = run([PY, "-m", "spkflow.bin.verify", "--model", onnx, a, b])
    (row,) = jsonl(p.stdout)
    (ref,) = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["model"], a, b]).stdout)
    assert row["llr"] is None and abs(row["score"] - ref["score"]) <= 1e-4


def test_identify_ranks_enrolled_speakers_and_says_unknown(scored, tmp_path):
    from spkflow import Embedder
    from spkflow.deploy.verify import open_set_threshold

    d = scored
    wavs = wav_scp(d["test"])
    tests = [wavs[u] for u in sorted(wavs)[::3]]
    p = run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", d["dev"], "--top-k", 5, *tests])
    rows = jsonl(p.stdout)
    assert [r["file"] for r in rows] == tests and "5 enrolled speakers" in p.stderr
    thr = open_set_threshold(5, 0.5)
    for r in rows:
        top = r["top"]
        assert [t["norm_score"] for t in top] == sorted((t["norm_score"] for t in top), reverse=True)
        assert sum(t["posterior"] for t in top) + r["p_unknown"] == pytest.approx(1.0, abs=1e-5)
        assert (r["speaker"] == "unknown") == (top[0]["llr"] <= thr)
        assert r["speaker"] in ("unknown", top[0]["speaker"])
    # the scores are the model's: a speaker enrolled from one utterance scores as verify scores the pair
    one = tmp_path / "enrol1"
    one.mkdir()
    u = sorted(wav_scp(d["dev"]))[0]
    (one / "wav.scp").write_text(f"{u} {wav_scp(d['dev'])[u]}")
    (one / "utt2spk").write_text(f"{u} {u.split('-')[0]}\n")
    (one / "spk2utt").write_text(f"{u.split('-')[0]} {u}\n")
    (r,) = jsonl(run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", one, tests[0]]).stdout)
    v = Embedder.from_pretrained(d["pack"]).verify(wav_scp(d["dev"])[u].strip(), tests[0])
    assert abs(r["top"][0]["llr"] - v.llr) <= 1e-4
    # a fixed threshold; --data with --list; bad input
    high = jsonl(run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", d["dev"],
                      "--threshold", 1e6, *tests[:2]]).stdout)  # fmt: skip
    assert all(r["speaker"] == "unknown" for r in high)
    lst = tmp_path / "list"
    lst.write_text(sorted(wavs)[0] + "\n")
    (r,) = jsonl(run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", d["dev"],
                      "--data", d["test"], "--list", lst]).stdout)  # fmt: skip
    assert r["file"] == sorted(wavs)[0]
    p = run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", tmp_path / "none", tests[0]], False)
    assert p.returncode == 1 and str(tmp_path / "none") in p.stderr
    p = run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", d["dev"], tmp_path / "x.wav"], False)
    assert p.returncode == 1 and str(tmp_path / "x.wav") in p.stderr


def test_thousands_of_pairs_are_scored_at_once(scored, tmp_path):
    """Every pair of 60 recordings (1,770 pairs): each recording embedded once, scores in one go."""
    d = scored
    rng = np.random.default_rng(0)
    files = []
    for i in range(60):
        f = tmp_path / f"r{i:02d}.wav"
        sf.write(f, (0.1 * rng.standard_normal(4000)).astype(np.float32), 16000)
        files.append(str(f))
    pairs = tmp_path / "pairs"
    pairs.write_text("".join(f"{a} {b}\n" for i, a in enumerate(files) for b in files[i + 1 :]))
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--pairs", pairs])
    assert len(jsonl(p.stdout)) == 1770 and "1770 pairs of 60 recordings" in p.stderr
    assert "centred on the 60 recordings of the pairs" in p.stderr
