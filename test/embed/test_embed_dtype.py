"""Extraction precision (``--dtype``) and worker-side batch assembly, on CPU.

bfloat16 autocast runs on CPU, so its parity with float32 is checked here on real speech
(LibriSpeech test-clean from db.sh).  float16 and pinned memory are CUDA-only: float16 must be
refused on CPU with a clear error; the pinned/non_blocking path cannot run without a GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.audio import make_speakers, write_data_dir
from helpers.models import l2, make_spkflow_model_dir
from helpers.paths import ROOT
from helpers.spread import permuted
from spkflow.core.errors import InputError
from spkflow.embed.base import model_stamp
from spkflow.embed.native import SpkflowEmbedder
from spkflow.embed.run import MODEL_STAMP, read_vectors, run_job

#: measured bf16-vs-fp32 cosine floor on CPU (see the test); the issue's 0.9999 is for CUDA
BF16_CPU_MIN_COSINE = 0.999


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_spkflow_model_dir(tmp_path_factory.mktemp("model") / "spk_tiny", seed=3)


def _librispeech_data(root: Path, corpus, n: int = 12) -> Path:
    flacs = sorted(corpus("LIBRISPEECH").glob("test-clean/*/*/*.flac"))[:n]
    assert len(flacs) == n
    wav = {f.stem: str(f) for f in flacs}
    return write_data_dir(root / "data", wav, {u: u.split("-")[0] for u in wav})


def _vectors(job_dir: Path) -> dict[str, np.ndarray]:
    entries = []
    for scp in sorted(job_dir.glob("xvector.*.scp")):
        entries += [tuple(line.split(" ", 1)) for line in scp.read_text().splitlines()]
    return dict(zip([k for k, _ in entries], read_vectors(entries), strict=True))


def test_bfloat16_matches_float32_on_real_speech(model_dir, corpus, tmp_path):
    """6-20 s read English through the whole job (workers, padding, batches of several lengths)."""
    data = _librispeech_data(tmp_path, corpus)
    utts = (data / "utt2spk").read_text().split()[::2]
    f32 = SpkflowEmbedder(model_dir)
    b16 = SpkflowEmbedder(model_dir, dtype="bfloat16")
    run_job(f32, data, utts, tmp_path / "f32", max_frames=6000, num_workers=1, progress=False)
    run_job(b16, data, utts, tmp_path / "b16", max_frames=6000, num_workers=1, progress=False)
    a, b = _vectors(tmp_path / "f32"), _vectors(tmp_path / "b16")
    assert sorted(a) == sorted(b) == sorted(utts)
    assert all(v.dtype == np.float32 for v in b.values())  # written float32 whatever the dtype
    cos = np.array([float(l2(a[u]) @ l2(b[u])) for u in utts])
    print(f"bf16 vs fp32 cosine on {len(utts)} LibriSpeech utterances: min {cos.min():.6f} mean {cos.mean():.6f}")
    assert cos.min() >= BF16_CPU_MIN_COSINE
    assert not np.array_equal(a[utts[0]], b[utts[0]])  # bf16 really ran in reduced precision


class _ListsOnly:
    """The embedder without ``collater``/``launch_padded``: run_job's main-process padding path."""

    def __init__(self, inner: SpkflowEmbedder) -> None:
        self.inner, self.name, self.dim, self.stamp = inner, inner.name, inner.dim, inner.stamp

    def preparer(self, data_dir):
        return self.inner.preparer(data_dir)

    def frames(self, x):
        return self.inner.frames(x)

    def embed(self, xs):
        return self.inner.embed(xs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_worker_side_padding_equals_main_process_padding(model_dir, tmp_path, num_workers):
    data = make_speakers(tmp_path, num_spk=3, num_utt=4, min_sec=0.3, max_sec=4.0, seed=11)
    utts = permuted((data / "utt2spk").read_text().split()[::2])
    emb = SpkflowEmbedder(model_dir)
    kw = dict(batch_size=5, max_frames=900, num_workers=num_workers, progress=False)
    run_job(emb, data, utts, tmp_path / "workers", **kw)
    run_job(_ListsOnly(emb), data, utts, tmp_path / "main", **kw)
    a, b = _vectors(tmp_path / "workers"), _vectors(tmp_path / "main")
    assert sorted(a) == sorted(b) == sorted(utts)
    assert all(np.array_equal(a[u], b[u]) for u in utts)  # exact: the same padded batches through the same model


def test_dtype_is_part_of_the_stamp(model_dir, tmp_path):
    f32 = SpkflowEmbedder(model_dir)
    b16 = SpkflowEmbedder(model_dir, dtype="bfloat16")
    assert f32.stamp == model_stamp("spkflow", model_dir / "config.yaml", model_dir / "model.pth")  # unchanged
    assert b16.stamp == f32.stamp + " dtype=bfloat16"
    cli = subprocess.run(
        [sys.executable, "-m", "spkflow.bin.model_stamp", "spkflow", str(model_dir), "--dtype", "bfloat16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert cli.stdout.strip() == b16.stamp  # the script's stamp = the jobs' stamp
    data = make_speakers(tmp_path, num_spk=1, num_utt=2, seed=2)
    job_dir = tmp_path / "jobs"
    job_dir.mkdir()
    (job_dir / MODEL_STAMP).write_text(f32.stamp + "\n")
    with pytest.raises(InputError, match="another model"):
        run_job(b16, data, (data / "utt2spk").read_text().split()[::2], job_dir, num_workers=0, progress=False)


def test_float16_on_cpu_is_refused(model_dir, tmp_path):
    with pytest.raises(ValueError, match="float16 needs --device cuda"):
        SpkflowEmbedder(model_dir, dtype="float16")
    with pytest.raises(ValueError, match="--dtype must be one of"):
        SpkflowEmbedder(model_dir, dtype="half")


def test_script_dtype_bfloat16_end_to_end_and_float16_on_cpu_refused(model_dir, tmp_path):
    """The stage script: bf16 extraction writes float32 vectors and stamps the jobs with the dtype;
    float16 on cpu is refused before any job starts."""
    from helpers.recipes import SCRIPT, env

    data = make_speakers(tmp_path, num_spk=2, num_utt=2, seed=4)
    out = tmp_path / "embed"
    bad = subprocess.run(
        ["bash", str(SCRIPT), "--nj", "1", "--dtype", "float16", "--model-dir", str(model_dir), str(data), str(out)],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "--dtype float16 needs --device cuda" in bad.stderr
    assert not (out / "jobs").exists()
    ok = subprocess.run(
        ["bash", str(SCRIPT), "--nj", "2", "--dtype", "bfloat16", "--model-dir", str(model_dir), str(data), str(out)],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert (out / "jobs" / MODEL_STAMP).read_text().strip().endswith(" dtype=bfloat16")
    import kaldiio

    vecs = dict(kaldiio.load_scp(str(out / "xvector.scp")))
    assert len(vecs) == 4 and all(v.dtype == np.float32 for v in vecs.values())
