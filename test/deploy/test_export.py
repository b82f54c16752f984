"""ONNX export (spkflow.deploy.export, python -m spkflow.bin.export): onnxruntime equals PyTorch within
1e-4 on real speech of several lengths, for the ECAPA model and the GE2E d-vector LSTM (with and
without projection, whole-utterance and sliding-window inference), batched with padding; the
export's own check (1e-5 of each embedding's norm) passes at any thread count and any norm.

Real speech: the shipped corpora found through db.sh (skipped when absent, failed under CI), and
audio made here for the always-on tests.  Tiny models with random weights."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers.audio import synth_voice
from helpers.models import make_spkflow_model_dir, perturb_batchnorm
from helpers.paths import ROOT
from helpers.recipes import run
from helpers.spread import permuted, within

PY = Path(sys.executable)


def make_dvector_model_dir(path: Path, seed: int = 0, hidden: int = 32, embed_dim: int = 16, window: int = 40) -> Path:
    """A stage-4-style model dir of a small GE2E d-vector LSTM (projection when embed_dim < hidden)."""
    import torch

    from spkflow.features.fbank import FbankOptions
    from spkflow.features.vad import VadOptions
    from spkflow.nnet.models import build_model

    cfg = {
        "frontend": {
            "vad": True,
            "mean_norm": True,
            "fbank": FbankOptions(num_mel_bins=24).to_dict(),
            "vad_conf": dataclasses.asdict(VadOptions()),
        },
        "model": {
            "name": "dvector_lstm",
            "input_dim": 24,
            "hidden": hidden,
            "embed_dim": embed_dim,
            "layers": 2,
            "infer_window": window,
            "infer_hop": 15,
        },
    }
    torch.manual_seed(seed)
    model = build_model(cfg["model"])
    with torch.no_grad():  # non-trivial input statistics, as after training
        model.input_mean.normal_(0.0, 1.0)
        model.input_std.uniform_(0.5, 2.0)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), path / "model.pth")
    return path


def export(model: Path, out: Path) -> Path:
    p = run([PY, "-m", "spkflow.bin.export", "--model-dir", model, "--out", out])
    assert "max |onnxruntime - torch|" in p.stderr
    return out


def parity(onnx_path: Path, model: Path, waves: list[tuple[np.ndarray, int]]) -> float:
    """Largest |onnxruntime - torch| over each utterance alone and all of them in one padded batch,
    relative to the embedding's norm (float errors scale with it; the export's own check)."""
    import onnxruntime as ort
    import torch

    from spkflow import Embedder

    emb = Embedder.from_pretrained(model)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feats = [emb.features(w, r) for w, r in permuted(waves)]
    lens = np.array([len(f) for f in feats], dtype=np.int64)
    assert len(set(lens.tolist())) == len(lens)  # several lengths
    padded = np.zeros((len(feats), int(lens.max()), feats[0].shape[1]), dtype=np.float32)
    for i, f in enumerate(feats):
        padded[i, : len(f)] = f
    with torch.inference_mode():
        ref = emb.model(torch.from_numpy(padded), torch.from_numpy(lens)).numpy()
    norm = np.linalg.norm(ref, axis=1)
    alone = np.stack([emb.embed(w, r) for w, r in permuted(waves)])
    # the PyTorch reference is the API's output (padded batch vs alone)
    # measured <= 2.1e-7 (1 and 2 threads, batch order permuted)
    within("torch padded vs alone (of the norm)", float((np.abs(ref - alone).max(1) / norm).max()), 1e-5)
    worst = 0.0
    for i, f in enumerate(feats):
        got = sess.run(["embedding"], {"feats": f[None], "lengths": lens[i : i + 1]})[0][0]
        worst = max(worst, float(np.abs(got - ref[i]).max() / norm[i]))
    got = sess.run(["embedding"], {"feats": padded, "lengths": lens})[0]
    return max(worst, float((np.abs(got - ref).max(1) / norm).max()))


def made_speech(seconds: list[float], rate: int = 16000) -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(5)
    return [(synth_voice(rng, 120 + 20 * i, (500.0, 1500.0, 2500.0), s, rate), rate) for i, s in enumerate(seconds)]


def corpus_speech(corpus) -> list[tuple[np.ndarray, int]]:
    """Real recordings of 0.3-20 s: FSDD digits (8 kHz), LibriSpeech (16 kHz), speechocean762."""
    import soundfile as sf

    files = sorted((corpus("FSDD") / "recordings").glob("*.flac"))[:1]
    files += sorted(corpus("LIBRISPEECH").rglob("*.flac"))[:2]
    files += sorted((corpus("SPEECHOCEAN762") / "WAVE").rglob("*.flac"))[:2]
    assert len(files) == 5, files
    return [sf.read(p, dtype="float32") for p in files]


@pytest.fixture(scope="module")
def ecapa(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    md = make_spkflow_model_dir(tmp_path_factory.mktemp("ecapa") / "spk_ecapa", seed=2, mean_norm=True)
    return md, export(md, md / "model.onnx")


@pytest.fixture(scope="module", params=["proj_window", "noproj_whole"])
def dvector(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp(request.param) / "spk_dvector"
    md = make_dvector_model_dir(d) if request.param == "proj_window" else make_dvector_model_dir(d, 16, 16, 16, 0)
    return md, export(md, md / "model.onnx")


def test_ecapa_onnx_equals_torch_on_made_speech(ecapa):
    md, onnx_path = ecapa
    # measured <= 2.9e-7 (1 and 2 threads, batch order permuted)
    within("ONNX vs torch (of the norm)", parity(onnx_path, md, made_speech([0.4, 1.3, 3.7, 9.0])), 1e-5)


def test_ecapa_onnx_equals_torch_on_real_speech(ecapa, corpus):
    md, onnx_path = ecapa
    # the demo model on real speech: <= 3.5e-7 (docs/benchmarks.md, bench_export_error.py)
    within("ONNX vs torch on real speech (of the norm)", parity(onnx_path, md, corpus_speech(corpus)), 1e-5)


def test_dvector_onnx_equals_torch_on_made_speech(dvector):
    """Sliding windows (40 frames, hop 15) with projection, and whole-utterance without: lengths
    below, at and far above the window, alone and batched."""
    md, onnx_path = dvector
    # measured <= 2.9e-7 (1 and 2 threads, batch order permuted)
    within("ONNX vs torch (of the norm)", parity(onnx_path, md, made_speech([0.25, 0.6, 2.1, 6.5])), 1e-5)


def test_dvector_onnx_equals_torch_on_real_speech(dvector, corpus):
    md, onnx_path = dvector
    # the demo model on real speech: <= 3.5e-7 (docs/benchmarks.md, bench_export_error.py)
    within("ONNX vs torch on real speech (of the norm)", parity(onnx_path, md, corpus_speech(corpus)), 1e-5)


def test_onnx_metadata_and_packed_input(ecapa, tmp_path):
    import onnx

    md, _ = ecapa
    packed = tmp_path / "ecapa.zip"
    run([PY, "-m", "spkflow.bin.pack", "--model-dir", md, "--out", packed])
    out = export(packed, tmp_path / "sub" / "from_pack.onnx")
    proto = onnx.load(out)
    meta = {p.key: p.value for p in proto.metadata_props}
    fe = json.loads(meta["spkflow.frontend"])
    assert fe["mean_norm"] is True and fe["fbank"]["num_mel_bins"] == 24
    assert meta["spkflow.embed_dim"] == "16"
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    assert dims == {"feats": ["batch", "time", 24], "lengths": ["batch"]}


def test_export_errors_are_named_and_leave_nothing(tmp_path):
    out = tmp_path / "x.onnx"
    p = run([PY, "-m", "spkflow.bin.export", "--model-dir", tmp_path / "missing", "--out", out], check=False)
    assert p.returncode == 1 and "missing" in p.stderr and "model not found" in p.stderr
    assert not out.exists()


def test_export_refuses_a_graph_that_differs(tmp_path):
    """A tolerance no float graph meets: the check runs, fails, and no file is left."""
    from spkflow.api import Embedder
    from spkflow.deploy.export import ExportError, export_onnx

    md = make_spkflow_model_dir(tmp_path / "m", seed=4)
    emb = Embedder.from_pretrained(md)
    perturb_batchnorm(emb.model, 9)
    with pytest.raises(ExportError, match="differs from PyTorch"):
        export_onnx(emb.model, tmp_path / "bad.onnx", tol=0.0)
    assert not list(tmp_path.glob("*.onnx*")) and not list(tmp_path.glob(".bad.onnx*"))


def test_embedder_runs_the_onnx_file_without_torch(ecapa, tmp_path):
    """Embedder.from_pretrained(model.onnx): the frontend from the file's metadata, the graph in
    onnxruntime, torch never imported; vectors equal the PyTorch model's within 1e-4."""
    import soundfile as sf

    from spkflow import Embedder

    md, onnx_path = ecapa
    waves = made_speech([0.7, 2.2, 4.1], rate=22050)
    paths = []
    for i, (w, r) in enumerate(waves):
        paths.append(tmp_path / f"u{i}.flac")
        sf.write(paths[-1], w, r, subtype="PCM_16")
    code = (
        "import json, sys\n"
        "from spkflow import Embedder\n"
        f"e = Embedder.from_pretrained({str(onnx_path)!r})\n"
        f"files = [e.embed_file(p).tolist() for p in {[str(p) for p in paths]!r}]\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'dim': e.dim, 'files': files}))\n"
    )
    got = json.loads(run([PY, "-c", code]).stdout)
    assert got["torch"] is False and got["dim"] == 16
    ref = Embedder.from_pretrained(md)
    want = np.stack([ref.embed_file(p) for p in paths])
    norm = np.linalg.norm(want, axis=1)[:, None]
    onnx_files = np.array(got["files"], dtype=np.float32)
    # measured <= 2.6e-7 (1 and 2 threads)
    within("ONNX Embedder (no torch) vs torch (of the norm)", float((np.abs(onnx_files - want) / norm).max()), 1e-5)
    onnx_emb = Embedder.from_pretrained(onnx_path)
    read = [sf.read(p, dtype="float32") for p in paths]  # the files hold 16-bit samples
    batch = onnx_emb.embed_batch([w for w, _ in read], [r for _, r in read])
    # measured <= 2.5e-7 (1 and 2 threads)
    within("ONNX embed_batch vs torch alone (of the norm)", float((np.abs(batch - want) / norm).max()), 1e-5)
    assert not np.allclose(want[0], want[1], atol=1e-2)


def test_onnx_file_without_spkflow_metadata_is_refused(ecapa, tmp_path):
    import onnx

    from spkflow import Embedder
    from spkflow.core.errors import InputError

    _, onnx_path = ecapa
    proto = onnx.load(onnx_path)
    del proto.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(proto, bare)
    with pytest.raises(InputError, match="no spkflow.frontend metadata") as err:
        Embedder.from_pretrained(bare)
    assert str(bare) in str(err.value)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a protobuf at all")
    with pytest.raises(InputError, match="cannot load the ONNX model"):
        Embedder.from_pretrained(junk)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_documented_command_passes_at_any_thread_count_and_any_norm(tmp_path, threads):
    """The check is relative to the embedding's norm: a model whose embeddings are 1000 times
    longer (its last layer scaled; float errors scale with it) exports under OMP_NUM_THREADS 1 and
    2, where an absolute bound of 1e-4 refused it (issue 35: the demo model, norms 60-80, was
    refused or not by the thread count)."""
    import os

    import torch

    md = make_spkflow_model_dir(tmp_path / "m", seed=5)
    state = torch.load(md / "model.pth", weights_only=True)
    for k in ("projector.fc.weight", "projector.fc.bias"):
        state[k] = state[k] * 1000.0
    torch.save(state, md / "model.pth")
    out = tmp_path / "model.onnx"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=threads)
    cmd = [str(PY), "-m", "spkflow.bin.export", "--model-dir", str(md), "--out", str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rel, absolute = (
        float(x) for x in re.search(r"= (\S+) of the embedding's norm .*, (\S+) absolute", p.stderr).groups()
    )
    assert absolute > 1e-4  # the former absolute check would have refused it
    # measured <= 4.2e-7 (OMP_NUM_THREADS 1 and 2: the parameter)
    within("the export's own check: ONNX vs torch (of the norm)", rel, 1e-5)
    assert out.exists()
