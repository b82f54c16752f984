"""spkflow.score.backend: WCCN / LDA fitted on labelled embeddings, saved, applied before scoring."""

from __future__ import annotations

import subprocess
import sys

import kaldiio
import numpy as np
import pytest

from helpers.paths import ROOT
from spkflow.core.errors import InputError
from spkflow.score.backend import Backend, fit_backend, fit_backend_on, l2_rows
from spkflow.score.metrics import compute_eer


def channel_set(seed: int, num_spk: int, num_utt: int, dim: int = 16, nuisance: float = 3.0):
    """Speaker centre + small noise + a large random offset along a few shared 'channel'
    directions that change from utterance to utterance (within-speaker variability that
    cosine scoring cannot tell from identity)."""
    rng = np.random.default_rng(seed)
    chan = np.random.default_rng(99).normal(size=(3, dim))
    out, labels = [], []
    for s in range(num_spk):
        centre = rng.normal(size=dim)
        for _ in range(num_utt):
            out.append(centre + 0.3 * rng.normal(size=dim) + nuisance * rng.normal(size=3) @ chan)
            labels.append(f"s{s:03d}")
    return np.stack(out), labels


def pair_eer(x: np.ndarray, labels: list[str]) -> float:
    x = l2_rows(x)
    i, j = np.triu_indices(len(x), 1)
    lab = np.array(labels)
    return compute_eer(np.einsum("nd,nd->n", x[i], x[j]), (lab[i] == lab[j]).astype(int))[0]


def test_wccn_whitens_the_within_class_covariance_of_its_training_set():
    x, labels = channel_set(0, 40, 6)
    b = fit_backend("wccn", x, labels, reg=0.0)
    z = (l2_rows(x) - b.mean) @ b.proj  # before the final length normalisation
    y = np.array(labels)
    within = np.concatenate([z[y == s] - z[y == s].mean(0) for s in sorted(set(labels))])
    assert np.allclose(within.T @ within / len(z), np.eye(x.shape[1]), atol=1e-8)
    assert b.name == "wccn" and b.proj.shape == (16, 16)
    # shrinkage keeps it invertible with fewer utterances than dimensions
    b2 = fit_backend("wccn", x[:12], labels[:12], reg=0.1)
    assert np.all(np.isfinite(b2.proj))


def test_wccn_and_lda_fitted_on_other_speakers_remove_a_channel_nuisance():
    train, tl = channel_set(1, 60, 8)
    test, sl = channel_set(2, 20, 6)  # other speakers, the same kind of channel
    cos = pair_eer(test, sl)
    wccn = pair_eer(fit_backend("wccn", train, tl).transform(test), sl)
    lda = pair_eer(fit_backend("lda", train, tl).transform(test), sl)
    assert cos > 20.0 and wccn < cos / 2 and lda < cos / 2, (cos, wccn, lda)
    ident = fit_backend("cosine", train, tl)
    assert np.allclose(ident.transform(test), l2_rows(test))


def test_save_load_roundtrip_and_a_bad_file_is_named(tmp_path):
    x, labels = channel_set(3, 10, 4)
    b = fit_backend("lda", x, labels, lda_dim=5)
    b.save(tmp_path / "b.npz")
    c = Backend.load(tmp_path / "b.npz")
    assert c.name == "lda" and c.proj.shape == (16, 5)
    assert np.array_equal(c.transform(x), b.transform(x))
    assert not list(tmp_path.glob(".*.tmp"))
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="bad.npz.*not a backend file"):
        Backend.load(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="expects 16-dim embeddings, got 8"):
        b.transform(np.ones((2, 8)))


def test_fit_backend_on_names_what_is_wrong():
    x, labels = channel_set(4, 5, 3)
    emb = {f"u{i:02d}": v for i, v in enumerate(x)}
    u2s = {f"u{i:02d}": s for i, s in enumerate(labels)}
    b = fit_backend_on("wccn", emb, u2s)
    assert np.allclose(b.transform(x[:1]), fit_backend("wccn", x, labels).transform(x[:1]))
    with pytest.raises(InputError, match=r"data/utt2spk: 1 utterance\(s\) of emb.scp have no speaker, e.g. 'u03'"):
        fit_backend_on(
            "wccn",
            emb,
            {k: v for k, v in u2s.items() if k != "u03"},
            emb_source="emb.scp",
            utt2spk_source="data/utt2spk",
        )
    one = {k: v for k, v in emb.items() if u2s[k] == "s000"}
    with pytest.raises(InputError, match="emb.scp.*needs >= 2 speakers"):
        fit_backend_on("wccn", one, u2s, emb_source="emb.scp")
    with pytest.raises(ValueError, match="unknown backend 'plda'"):
        fit_backend("plda", x, labels)


def test_fit_backend_cli(tmp_path):
    x, labels = channel_set(5, 8, 4)
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/x.ark,{tmp_path}/x.scp") as w:
        for i, v in enumerate(x):
            w(f"u{i:02d}", v.astype(np.float32))
    (tmp_path / "utt2spk").write_text("".join(f"u{i:02d} {s}\n" for i, s in enumerate(labels)))
    cmd = [sys.executable, "-m", "spkflow.bin.fit_backend", "--backend", "wccn", "--xvector-scp", f"{tmp_path}/x.scp"]
    out = tmp_path / "backend" / "wccn.npz"
    p = subprocess.run(
        cmd + ["--utt2spk", f"{tmp_path}/utt2spk", "--out", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    b = Backend.load(out)
    want = fit_backend("wccn", x.astype(np.float32), labels)
    assert b.name == "wccn" and np.allclose(b.proj, want.proj, atol=1e-6)
    # an utterance missing from utt2spk: exit 1, one line naming the file, no output
    (tmp_path / "utt2spk").write_text("".join(f"u{i:02d} {s}\n" for i, s in enumerate(labels) if i != 7))
    out.unlink()
    p = subprocess.run(
        cmd + ["--utt2spk", f"{tmp_path}/utt2spk", "--out", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 1 and "utt2spk: 1 utterance(s)" in p.stderr and "'u07'" in p.stderr and not out.exists()


def test_evaluate_set_refuses_a_backend_with_centring(tmp_path):
    from spkflow.score.eval_report import evaluate_set

    x, labels = channel_set(6, 4, 3)
    fit_backend("wccn", x, labels).save(tmp_path / "wccn.npz")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.json").write_text("{}")  # an earlier run's result stays untouched
    with pytest.raises(ValueError, match="wccn.npz: a backend subtracts its own training mean; do not centre on m.scp"):
        evaluate_set(
            "trials", "x.scp", str(tmp_path / "out"), mean_scp="m.scp", backend_path=str(tmp_path / "wccn.npz")
        )
    assert (tmp_path / "out" / "metrics.json").read_text() == "{}"
