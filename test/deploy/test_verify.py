"""Verification and identification of recordings with a model (spkflow.deploy.decisions, the
commands spkflow.bin.verify and identify, Embedder.verify / score): real audio files made here,
stage 5 for real (extract_embeddings.sh), stage 6 for real (score.sh), a tiny model with random
weights whose scoring (WCCN backend, AS-norm cohort, calibration) is fitted here."""

from __future__ import annotations

import json
import math
import subprocess
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
from helpers.spread import THREADS, permuted, within
from spkflow.score.trial_scoring import read_embeddings

PY = sys.executable
SCRIPTS = ROOT / "scripts" / "spk"


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def scaled(x: float, y: float, key: str, scale: dict[str, float]) -> float:
    """How far two paths' ``key`` of a pair are apart: the cosine as it is, ``norm_score`` and ``llr``
    over their range in ``scale`` (AS-norm's 1 / cohort std and the calibration slope multiply the
    cosine's rounding as they multiply the scores; with this tiny model's cosines all within 0.06 of
    each other they make 1e-6 of cosine 5e-4 of LLR, which says nothing of either path)."""
    return abs(x - y) / scale.get(key, 1.0)


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
    scale = {k: max(r[k] for r in rows) - min(r[k] for r in rows) for k in ("norm_score", "llr")}
    worst = max(scaled(r["norm_score"], own[(r["a"], r["b"])], "norm_score", scale) for r in rows)
    # the same embeddings through the same Scoring in two processes: measured 0 (6 decimals written)
    within("verify --xvector-scp vs stage 6, centred on the set: norm_score", worst, 1e-5)
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
    worst = max(scaled(r["norm_score"], plain[(r["a"], r["b"])], "norm_score", scale) for r in train_rows)
    within("verify --xvector-scp vs stage 6, centred on the training mean: norm_score", worst, 1e-5)
    assert max(abs(r["norm_score"] - t["norm_score"]) for r, t in zip(rows, train_rows, strict=True)) > 1e-3
    # the API on the same embeddings, centred on the same recordings
    emb = Embedder.from_pretrained(d["pack"])
    vec = read_embeddings(d["test_scp"])
    v = emb.score(
        np.stack([vec[r["a"]] for r in rows]),
        np.stack([vec[r["b"]] for r in rows]),
        domain=np.stack(list(vec.values())),
    )
    # measured: cosine 4.9e-7 (the 6 decimals written), norm_score 4.4e-8 and llr 4.0e-9 of their range
    for key in ("score", "norm_score", "llr"):
        worst = max(scaled(x, r[key], key, scale) for x, r in zip(getattr(v, key), rows, strict=True))
        within(f"Embedder.score vs verify on the same embeddings: {key}", worst, 2e-5 if key == "score" else 1e-5)
    assert [bool(x) for x in v.same_speaker] == [r["same_speaker"] for r in rows]
    assert all(r["same_speaker"] == (r["llr"] > 0) for r in rows)
    # the score is the model's plain cosine of the raw embeddings
    r0 = rows[0]
    a, b = vec[r0["a"]], vec[r0["b"]]
    assert r0["score"] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-6)


def test_verify_two_files_equals_the_api_and_audio_equals_embeddings(scored, tmp_path):
    import torch

    from spkflow import Embedder
    from spkflow.deploy.decisions import Recordings

    torch.set_num_threads(THREADS)
    d = scored
    wavs = wav_scp(d["test"])
    utts = sorted(wavs)
    pairs = tmp_path / "pairs"  # in the batch order under test (helpers.spread)
    pairs.write_text("".join(permuted((d["test"] / "trials").read_text().splitlines(keepends=True))))
    from_scp = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["model"], "--xvector-scp", d["test_scp"],
                          "--pairs", pairs]).stdout)  # fmt: skip
    scale = {k: max(r[k] for r in from_scp) - min(r[k] for r in from_scp) for k in ("norm_score", "llr")}
    a, b = wavs[utts[0]], wavs[utts[4]]
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], a, b])
    (row,) = jsonl(p.stdout)
    assert row["a"] == a and row["b"] == b and "label" not in row
    assert "centred on the calibration set's mean" in p.stderr and "WCCN, AS-norm (top 3)" in p.stderr
    # one pair keeps the model's calibration, and the log says so
    assert "calibration: 1 pairs of 2 recordings: too few for the batch's own calibration" in p.stderr
    v = Embedder.from_pretrained(d["pack"]).verify(a, b)
    assert isinstance(v.llr, float) and isinstance(v.same_speaker, bool)
    # the API in this process, the command in another: the same code on the same two files.
    # Measured (1 and 2 threads): cosine <= 3.5e-7 (written with 6 decimals: 5e-7 of rounding
    # either side, hence 2e-5), norm_score <= 1.9e-7 and llr <= 2.1e-7 of their range
    for key, bound in (("score", 2e-5), ("norm_score", 1e-4), ("llr", 1e-4)):
        within(f"verify A B, API vs command: {key}", scaled(getattr(v, key), row[key], key, scale), bound)
    # one pair centred on other recordings like it (a data dir, or their embeddings): as the API
    (dom_row,) = jsonl(
        run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--domain-mean", d["test"], a, b]).stdout
    )
    vec = read_embeddings(d["test_scp"])
    api = Embedder.from_pretrained(d["pack"]).verify(a, b, domain=np.stack(list(vec.values())))
    assert abs(dom_row["norm_score"] - row["norm_score"]) > 1e-3
    # measured <= 5.3e-7 of the LLR range (1 and 2 threads)
    within("verify A B --domain-mean, API vs command: llr", scaled(api.llr, dom_row["llr"], "llr", scale), 1e-4)
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--domain-mean", d["dev"] / "utt2spk", a, b], False)
    assert p.returncode == 1 and "utt2spk:1: cannot read embedding" in p.stderr
    # the data dir's audio (--data) gives what stage 5's embeddings give: first the embeddings
    # --data makes (its own code, all recordings in one padded batch) against stage 5's (two jobs,
    # batched by length), L2-normalised: measured <= 5.1e-7 (1 and 2 threads, batch order permuted)
    got, _ = Recordings(str(d["test"])).embed(Embedder.from_pretrained(d["model"]), permuted(utts), progress=False)
    worst = max(float(np.abs(got[u] / np.linalg.norm(got[u]) - vec[u] / np.linalg.norm(vec[u])).max()) for u in utts)
    within("verify --data embeddings vs stage 5's (L2-normalised)", worst, 1e-5)
    # then the scores, which AS-norm and the calibration scale by ~500 here: measured <= 6.9e-6 of
    # the LLR range (norm_score: 6.9e-6 of its range; cosine 1.0e-6, the rounding of two writes)
    from_audio = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["model"], "--data", d["test"],
                            "--pairs", pairs]).stdout)  # fmt: skip
    assert [(x["a"], x["b"]) for x in from_audio] == [(y["a"], y["b"]) for y in from_scp]
    for key, bound in (("score", 2e-5), ("norm_score", 1e-4), ("llr", 1e-4)):
        worst = max(scaled(x[key], y[key], key, scale) for x, y in zip(from_audio, from_scp, strict=True))
        within(f"verify --data vs --xvector-scp: {key}", worst, bound)


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
    assert "centred on nothing: the model's scoring does not centre" in p.stderr  # not "the training mean"
    emb = Embedder.from_pretrained(old)
    assert emb.scoring.is_plain and "plain cosine" in emb.scoring_note
    # measured 3.6e-7 (6 decimals written: 5e-7 of rounding)
    within("verify A B, API vs command, plain cosine", abs(emb.verify(a, b).score - row["score"]), 2e-5)


def test_an_onnx_model_verifies_with_plain_cosine(scored, tmp_path):
    pytest.importorskip("onnxruntime")
    d = scored
    onnx = tmp_path / "tiny.onnx"
    run([PY, "-m", "spkflow.bin.export", "--model-dir", d["model"], "--out", onnx])
    a, b = sorted(wav_scp(d["test"]).values())[:2]
    p = run([PY, "-m", "spkflow.bin.verify", "--model", onnx, a, b])
    (row,) = jsonl(p.stdout)
    (ref,) = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["model"], a, b]).stdout)
    assert row["llr"] is None
    # measured 0 at 6 decimals (the embeddings: within 1e-5 of their norm, test_export.py)
    within("verify A B, ONNX vs torch model dir, plain cosine", abs(row["score"] - ref["score"]), 2e-5)


def test_identify_ranks_enrolled_speakers_and_says_unknown(scored, tmp_path):
    from spkflow import Embedder
    from spkflow.deploy.decisions import open_set_threshold

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
    llrs = [t["llr"] for x in rows for t in x["top"]]  # the LLR scale of this model on these recordings
    spread = scaled(r["top"][0]["llr"], v.llr, "llr", {"llr": max(llrs) - min(llrs)})
    within("identify one enrolled utterance vs Embedder.verify: llr", spread, 1e-4)  # measured 2.5e-9
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


def test_domain_mean_pairs_is_refused_below_ten_recordings(scored, tmp_path):
    """Two recordings centred on their own mean are opposite vectors (cosine -1, LLR far below 0 for
    two recordings of one speaker): refused, naming the rule; auto keeps the model's centring."""
    from spkflow import Embedder

    d = scored
    wavs = wav_scp(d["test"])
    utts = sorted(wavs)
    a, b = wavs[utts[0]], wavs[utts[1]]  # one speaker
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--domain-mean", "pairs", a, b], check=False)
    assert p.returncode == 1 and p.stdout == ""
    assert "--domain-mean pairs: 2 recordings" in p.stderr and "at least 10" in p.stderr
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], a, b])
    (auto,) = jsonl(p.stdout)
    assert auto["norm_score"] > -0.5
    # a lone pair: centred on the calibration set's mean (the pack's pair_mean), and the log says what holds
    assert "centred on the calibration set's mean" in p.stderr and "too few to centre on" in p.stderr
    one = tmp_path / "enrol1"
    one.mkdir()
    (one / "wav.scp").write_text(f"e1 {b}\n")
    (one / "utt2spk").write_text("e1 s1\n")
    (one / "spk2utt").write_text("s1 e1\n")
    p = run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", one, "--domain-mean", "pairs", a],
            check=False)  # fmt: skip
    assert p.returncode == 1 and "--domain-mean pairs" in p.stderr and "at least 10" in p.stderr
    emb = Embedder.from_pretrained(d["pack"])
    ea, eb = emb.embed_file(a), emb.embed_file(b)
    with pytest.raises(ValueError, match="at least 10"):
        emb.score(ea, eb, domain=np.stack([ea, eb]))


def _to_m4a(src: str, out: Path) -> Path:
    from spkflow.data.ffmpeg import default_ffmpeg

    subprocess.run([default_ffmpeg(), "-nostdin", "-v", "error", "-i", src, "-c:a", "aac", out], check=True)
    return out


def test_m4a_works_on_every_entry_point_and_identify_checks_tests_first(scored, tmp_path):
    """verify a.m4a b.m4a, identify x.m4a and Embedder.embed_file / embed_files read m4a (the pinned
    ffmpeg) and give what make_data_dir's wav.scp pipe gives; identify fails on an unreadable test
    recording before it embeds the enrolment (a pipe in the enrolment's wav.scp would leave a mark)."""
    from spkflow import Embedder
    from spkflow.data.audio import read_audio
    from spkflow.data.ffmpeg import default_ffmpeg, ffmpeg_pipe

    d = scored
    wavs = wav_scp(d["test"])
    utts = sorted(wavs)
    a = _to_m4a(wavs[utts[0]].strip(), tmp_path / "a b.m4a")
    b = _to_m4a(wavs[utts[4]].strip(), tmp_path / "b.m4a")
    (row,) = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], a, b]).stdout)
    emb = Embedder.from_pretrained(d["pack"])
    piped = emb.embed(*read_audio(ffmpeg_pipe(default_ffmpeg(), str(a), 16000), table=True))  # a wav.scp's pipe
    assert np.abs(emb.embed_file(a) - piped).max() <= 1e-5 * np.linalg.norm(piped)
    both = emb.embed_files([a, b])
    assert both.shape == (2, emb.dim) and np.abs(both[0] - piped).max() <= 1e-4 * np.linalg.norm(piped)
    assert abs(emb.verify(str(a), str(b)).llr - row["llr"]) <= 1e-4
    m = emb.score_matrix([a, b])
    assert m.llr.shape == (2, 2) and abs(m.llr[0, 1] - row["llr"]) <= 1e-4 and m.llr[0, 1] == m.llr[1, 0]
    (r,) = jsonl(run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", d["dev"], b]).stdout)
    assert r["file"] == str(b) and r["top"]
    # an unreadable test recording: named, and the enrolment is never read
    enrol = tmp_path / "enrol"
    enrol.mkdir()
    mark = tmp_path / "enrolment-was-read"
    dev = wav_scp(d["dev"])
    u = sorted(dev)[0]
    (enrol / "wav.scp").write_text(f"{u} touch {mark}; cat {dev[u].strip()} |\n")
    (enrol / "utt2spk").write_text(f"{u} s1\n")
    (enrol / "spk2utt").write_text(f"s1 {u}\n")
    bad = tmp_path / "bad.m4a"
    bad.write_bytes(b"\x00" * 300)
    p = run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", enrol, b, bad], check=False)
    assert p.returncode == 1 and str(bad) in p.stderr and "ffmpeg cannot decode it" in p.stderr
    assert not mark.exists()


def test_too_little_speech_is_flagged_or_refused_never_decided(scored, tmp_path):
    """A silent 2 s file, a 30 ms clip and a 200 ms clip of speech: verify and identify give a
    null decision with a warning naming the file (or refuse it, named), the API refuses; a
    whole recording is decided as before."""
    from spkflow import Embedder
    from spkflow.core.errors import UtteranceError
    from spkflow.features.speech import MIN_SPEECH

    d = scored
    wavs = wav_scp(d["test"])
    utts = sorted(wavs)
    good, other = wavs[utts[0]].strip(), wavs[utts[1]].strip()
    x, rate = sf.read(other, dtype="float32")
    silent, clip30, clip200 = tmp_path / "silent.wav", tmp_path / "clip30.wav", tmp_path / "clip200.wav"
    sf.write(silent, np.zeros(2 * rate, dtype=np.float32), rate)
    mid = len(x) // 2
    sf.write(clip30, x[mid : mid + int(0.03 * rate)], rate)
    sf.write(clip200, x[mid : mid + int(0.2 * rate)], rate)
    pairs = tmp_path / "pairs"
    pairs.write_text(f"{good} {other}\n{good} {clip200}\n{good} {clip30}\n{good} {silent}\n")
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--pairs", pairs], check=False)
    if p.returncode == 0:
        rows = jsonl(p.stdout)
        assert len(rows) == 4 and isinstance(rows[0]["same_speaker"], bool) and "warning" not in rows[0]
        for r in rows[1:]:
            assert r["same_speaker"] is None and r["b"] in r["warning"] and "too little speech" in r["warning"]
        assert "3 pairs with a recording of fewer than 0.25 s of voiced speech" in p.stderr
    else:  # the model's VAD leaves nothing of the silent file: refused, named
        assert p.returncode == 1 and str(silent) in p.stderr and "no speech" in p.stderr and p.stdout == ""
        p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--pairs", pairs, "--skip-bad", "true"])
        rows = jsonl(p.stdout)
        assert len(rows) == 3 and all(r["same_speaker"] is None for r in rows[1:]) and "1 pairs left out" in p.stderr
    (r,) = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--min-speech", 0, good, clip200]).stdout)
    assert isinstance(r["same_speaker"], bool) and "warning" not in r
    rows = jsonl(
        run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", d["dev"], good, clip200]).stdout
    )
    assert rows[0]["speaker"] is not None and rows[1]["speaker"] is None and str(clip200) in rows[1]["warning"]
    emb = Embedder.from_pretrained(d["pack"])
    for short in (clip200, clip30, silent):
        with pytest.raises(UtteranceError, match="too little speech") as err:
            emb.verify(good, short)
        assert str(short) in str(err.value)
    assert isinstance(emb.verify(good, clip200, min_speech=0).same_speaker, bool)
    assert isinstance(emb.verify(good, other).same_speaker, bool) and MIN_SPEECH == 0.25


def test_pairs_of_paths_take_the_fast_route_quoted_or_tab_separated(scored, tmp_path):
    """A pairs file of file paths (with spaces: quoted or tab-separated; an m4a behind make_data_dir's
    ffmpeg pipe) is scored from stage 5's embeddings via the data dir's wav.scp, as the same pairs
    by utterance id; bad lines name file and line."""
    from spkflow.data.ffmpeg import default_ffmpeg, ffmpeg_pipe

    d = scored
    src = wav_scp(d["test"])
    utts = sorted(src)
    folder = tmp_path / "my recordings"
    folder.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    files, lines = {}, []
    for i, u in enumerate(utts):
        if i == 0:
            f = _to_m4a(src[u].strip(), folder / f"take {i}.m4a")
            lines.append(f"{u} {ffmpeg_pipe(default_ffmpeg(), str(f), 16000)}\n")
        else:
            f = folder / f"take {i}.wav"
            f.write_bytes(Path(src[u].strip()).read_bytes())
            lines.append(f"{u} {f}\n")
        files[u] = str(f)
    (data / "wav.scp").write_text("".join(lines))
    (data / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in utts))
    run([SCRIPTS / "extract_embeddings.sh", "--nj", 1, "--model-dir", d["model"], data, tmp_path / "emb"])
    scp = tmp_path / "emb" / "xvector.scp"
    by_id = tmp_path / "by_id"
    by_id.write_text("".join(f"{a} {b}\n" for a, b in zip(utts, utts[1:], strict=False)))
    by_path = tmp_path / "by_path"
    by_path.write_text(
        "".join(
            f"{files[a]}\t{files[b]}\n" if i % 2 else f'"{files[a]}" "{files[b]}"\n'
            for i, (a, b) in enumerate(zip(utts, utts[1:], strict=False))
        )
    )
    ref = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--xvector-scp", scp,
                     "--pairs", by_id]).stdout)  # fmt: skip
    got = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--xvector-scp", scp, "--data", data,
                     "--pairs", by_path]).stdout)  # fmt: skip
    assert [r["a"] for r in got] == [files[u] for u in utts[:-1]]
    assert [r["llr"] for r in got] == [r["llr"] for r in ref]
    # without --data: a hint; the audio route reads the same files (the m4a by ffmpeg)
    p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--xvector-scp", scp, "--pairs", by_path], False)
    assert p.returncode == 1 and "give --data DATA_DIR" in p.stderr
    audio = jsonl(run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--pairs", by_path]).stdout)
    assert max(abs(x["llr"] - y["llr"]) for x, y in zip(audio, got, strict=True)) <= 1e-3
    for text, why in ((f"{files[utts[0]]} {files[utts[1]]}\n", "quote names with spaces"),
                      (f'"{files[utts[0]]} {files[utts[1]]}\n', "No closing quotation")):  # fmt: skip
        by_path.write_text(f'"{files[utts[0]]}" "{files[utts[1]]}"\n' + text)
        p = run([PY, "-m", "spkflow.bin.verify", "--model", d["pack"], "--pairs", by_path], check=False)
        assert p.returncode == 1 and f"{by_path}:2:" in p.stderr and why in p.stderr and p.stdout == ""


def test_saved_enrolment_gives_the_same_answers_and_belongs_to_its_model(scored, tmp_path):
    """identify --enrol D --save G once, then --gallery G: the same JSON lines (speaker first) as
    enrolling on the spot; the pack's gallery serves its model dir (same stamp) and is refused by
    another model; a speaker removed and one added without touching the others' embeddings."""
    from spkflow.deploy.gallery import Gallery

    d = scored
    wavs = wav_scp(d["test"])
    tests = [wavs[u].strip() for u in sorted(wavs)[::4]]
    g = tmp_path / "gallery.npz"
    p = run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", d["dev"], "--save", g])
    assert p.stdout == "" and g.is_file() and "gallery of 5 speakers (15 utterances)" in p.stderr
    fresh = run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--enrol", d["dev"], *tests]).stdout
    saved = run([PY, "-m", "spkflow.bin.identify", "--model", d["model"], "--gallery", g, *tests]).stdout
    assert saved == fresh and list(jsonl(saved)[0])[:2] == ["speaker", "file"]
    other = make_spkflow_model_dir(tmp_path / "other", seed=5)
    p = run([PY, "-m", "spkflow.bin.identify", "--model", other, "--gallery", g, *tests], check=False)
    assert p.returncode == 1 and str(g) in p.stderr and "made with another model" in p.stderr
    # remove one speaker, add a new one (a data dir of one test speaker): the rest untouched
    gal = Gallery.load(g)
    gone = gal.speaker_names()[0]
    new = tmp_path / "new"
    new.mkdir()
    spk_new = sorted(wavs)[0].split("-")[0]
    new_utts = [u for u in sorted(wavs) if u.startswith(spk_new)]
    (new / "wav.scp").write_text("".join(f"{u} {wavs[u].strip()}\n" for u in new_utts))
    (new / "utt2spk").write_text("".join(f"{u} new-{spk_new}\n" for u in new_utts))
    (new / "spk2utt").write_text(f"new-{spk_new} {' '.join(new_utts)}\n")
    g2 = tmp_path / "g2.npz"
    run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--gallery", g, "--enrol", new, "--remove", gone,
         "--save", g2])  # fmt: skip
    gal2 = Gallery.load(g2)
    assert gone not in gal2.speakers and f"new-{spk_new}" in gal2.speakers and len(gal2.speaker_names()) == 5
    before = {(s, u): v for s, u, v in zip(gal.speakers, gal.utts, gal.emb, strict=True)}
    kept = [(s, u, v) for s, u, v in zip(gal2.speakers, gal2.utts, gal2.emb, strict=True) if (s, u) in before]
    assert len(kept) == 12 and all(np.array_equal(v, before[(s, u)]) for s, u, v in kept)
    probe = wavs[new_utts[0]].strip()
    rows = jsonl(run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--gallery", g2, probe,
                      "--top-k", 5]).stdout)  # fmt: skip
    assert all(t["speaker"] != gone for t in rows[0]["top"]) and rows[0]["top"][0]["speaker"] == f"new-{spk_new}"
    p = run([PY, "-m", "spkflow.bin.identify", "--model", d["pack"], "--gallery", g2, "--remove", "nobody",
             "--save", g2], check=False)  # fmt: skip
    assert p.returncode == 1 and "no speaker 'nobody'" in p.stderr


def test_output_is_valid_json_even_when_a_score_is_not_a_number(scored):
    """A calibration that gives NaN (a broken pack) makes null LLRs and no decision, never a bare
    NaN in the JSON lines of verify or identify."""
    import io
    from dataclasses import replace

    from spkflow import Embedder
    from spkflow.data.datadir import DataDir
    from spkflow.deploy.decisions import Recordings, enrol_gallery, identify, verify_pairs
    from spkflow.score.calibration import LogisticCalibration
    from spkflow.score.trial_scoring import read_pairs

    d = scored
    emb = Embedder.from_pretrained(d["pack"])
    # a NaN calibration is refused when fitted or loaded (test_calibration_guards); here the output
    # guard behind that refusal is checked, so the NaN is put past the constructor's check
    broken = LogisticCalibration((1.0,), 0.0)
    object.__setattr__(broken, "weights", (float("nan"),))
    emb.scoring = replace(emb.scoring, calibration=broken)
    strict = {"parse_constant": lambda c: pytest.fail(f"{c} in a JSON line")}
    out = io.StringIO()
    verify_pairs(emb, read_pairs(d["test"] / "trials"), out, source=Recordings(xvector_scp=str(d["test_scp"])))
    rows = [json.loads(line, **strict) for line in out.getvalue().splitlines()]
    assert rows and all(
        r["llr"] is None and r["same_speaker"] is None and "no finite LLR" in r["warning"] for r in rows
    )
    out = io.StringIO()
    wavs = wav_scp(d["test"])

    def enrol():
        return enrol_gallery(emb, DataDir(d["dev"]), Recordings(str(d["dev"])))

    identify(emb, [wavs[u].strip() for u in sorted(wavs)[:2]], out, test_source=Recordings(), enrol=enrol)
    rows = [json.loads(line, **strict) for line in out.getvalue().splitlines()]
    assert len(rows) == 2 and all(t["llr"] is None for r in rows for t in r["top"])
    assert all(r["speaker"] is None and "no finite LLR" in r["warning"] for r in rows)


def test_a_batch_the_models_calibration_does_not_fit_is_decided_by_its_own(tmp_path):
    """verify_pairs over an embedding scp (kaldiio arks written here): 30 speakers x 4 recordings,
    all 7,140 labelled pairs, a model calibration whose threshold is far too low (cosine 0.1 for
    cosines of unrelated vectors ~ N(0, 0.18)).  ``auto`` decides by the batch's own calibration,
    fitted without the labels, and says so; ``model`` keeps the model's; a lone pair keeps it too."""
    import io

    import kaldiio

    from spkflow.deploy.decisions import Recordings, verify_pairs
    from spkflow.score.calibration import LogisticCalibration
    from spkflow.score.model_scoring import Scoring
    from spkflow.score.trial_scoring import read_pairs

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((30, 32))
    names = [f"s{s:02d}-r{r}" for s in range(30) for r in range(4)]
    vecs = {n: centres[int(n[1:3])] + 0.8 * rng.standard_normal(32) for n in names}
    scp = tmp_path / "xvector.scp"
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'xvector.ark'},{scp}") as w:
        for n in names:
            w(n, vecs[n].astype(np.float32))
    pairs = tmp_path / "pairs"
    pairs.write_text("".join(f"{a} {b} {'target' if a[:3] == b[:3] else 'nontarget'}\n"
                             for i, a in enumerate(names) for b in names[i + 1 :]))  # fmt: skip
    scoring = Scoring(calibration=LogisticCalibration((20.0,), -2.0, fitted_on="another corpus"))

    def run_verify(mode: str, trials: Path = pairs) -> tuple[list[dict], dict]:
        out = io.StringIO()
        s = verify_pairs(None, read_pairs(trials), out, source=Recordings(xvector_scp=str(scp)), scoring=scoring,
                         progress=False, calibration=mode)  # fmt: skip
        return jsonl(out.getvalue()), s

    rows, s = run_verify("auto")
    assert len(rows) == 7140 and s["calibration"]["by"] == "batch"
    assert "the batch's own calibration decides" in s["calibration"]["reason"]
    cal = LogisticCalibration.from_dict(s["calibration"]["calibration"])
    assert cal.weights[0] > 0 and -cal.bias / cal.weights[0] > 0.2  # the threshold moved up, from cosine 0.1
    assert all(r["same_speaker"] == (r["llr"] > 0) for r in rows)
    tol = 1e-6 * cal.weights[0] + 2e-6  # the JSON's 6 decimals of norm_score and llr
    assert all(abs(r["llr"] - float(cal.llr([r["norm_score"]])[0])) < tol for r in rows[:50])
    model_rows, m = run_verify("model")
    assert m["calibration"]["by"] == "model" and "--calibration model" in m["calibration"]["reason"]
    assert all(abs(r["llr"] - (20.0 * r["norm_score"] - 2.0)) < 3e-5 for r in model_rows[:50])
    assert s["hter"] < 0.5 * m["hter"]  # measured: 5.8 against 15.8 (%)
    one = tmp_path / "one"
    one.write_text(f"{names[0]} {names[4]}\n")
    (row,), s1 = run_verify("auto", one)
    assert s1["calibration"]["by"] == "model" and "1 pairs of 2 recordings: too few" in s1["calibration"]["reason"]
    assert row["llr"] == pytest.approx(20.0 * row["norm_score"] - 2.0, abs=1e-5)


def test_the_apis_score_matrix_of_a_large_list_is_calibrated_on_it(scored):
    """Embedder.score_matrix over 120 raw embeddings of 30 well-separated speakers, with a model
    calibration whose threshold is far too low: the list's own calibration decides (as verify's
    batch), ``calibration="model"`` keeps the model's, and a list of 3 keeps it too."""
    from spkflow import Embedder
    from spkflow.score.calibration import LogisticCalibration
    from spkflow.score.model_scoring import Scoring

    emb = Embedder.from_pretrained(scored["pack"])
    emb.scoring = Scoring(calibration=LogisticCalibration((20.0,), -2.0))
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((30, emb.dim))
    spk = np.repeat(np.arange(30), 4)
    vecs = centres[spk] + 0.5 * rng.standard_normal((120, emb.dim))  # the tiny model's 16 dims: closer speakers
    own, model = emb.score_matrix(vecs), emb.score_matrix(vecs, calibration="model")
    off = ~np.eye(120, dtype=bool)
    assert np.allclose(model.llr, 20.0 * model.norm_score - 2.0)
    same = spk[:, None] == spk[None, :]
    fa_own, fa_model = own.same_speaker[off & ~same].mean(), model.same_speaker[off & ~same].mean()
    assert fa_own < 0.5 * fa_model  # the threshold moved up (measured: 0.6 % against 33.7 % false alarms)
    assert np.allclose(emb.score_matrix(vecs[:3]).llr, 20.0 * model.norm_score[:3, :3] - 2.0)
