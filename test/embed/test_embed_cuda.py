"""Stage 5 on the GPU (``pytest -m cuda``; test/bench/gpu_check.sh runs these first): stage 5's job
(DataLoader workers, batches in page-locked slots, ``non_blocking`` copies, the next batch computed
while the last is written) on real speech with the fbank in the workers and on the device, batched
= alone, the job = the plain path, half precision against float32.

The model is the ECAPA-512 of the papers with random weights (and BatchNorm statistics that make a
padding leak show).  Skipped without CUDA; under ``GPU_CHECK_DEVICE=cpu`` the same tests run on the
CPU with a narrower ECAPA and the CPU's bfloat16 bound (float16 is CUDA-only)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

from helpers.audio import write_data_dir
from helpers.corpora import speech_files
from helpers.models import l2, make_spkflow_model_dir
from spkflow.embed.native import SpkflowEmbedder
from spkflow.embed.run import read_vectors, run_job

pytestmark = [pytest.mark.cuda, pytest.mark.corpus]

#: the issue's goal for half-precision embeddings against float32 (CUDA); on the CPU, bfloat16
#: autocast covers more ops and the measured floor is 0.999 (test/embed/test_embed_dtype.py)
MIN_COSINE = {"cuda": 0.9999, "cpu": 0.999}


@pytest.fixture(scope="module")
def speech(corpus, accel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir of real speech: LibriSpeech (6-20 s) and speechocean762 (2-20 s) read English."""
    files = speech_files(corpus("LIBRISPEECH"), "LIBRISPEECH") + speech_files(
        corpus("SPEECHOCEAN762"), "SPEECHOCEAN762"
    )
    files = files if accel == "cuda" else files[::12]  # the CPU rehearsal: 6 utterances
    wav = {f"{p.parent.name}-{p.stem}": str(p) for p in files}
    return write_data_dir(tmp_path_factory.mktemp("speech") / "data", wav, {u: u.split("-")[0] for u in wav})


@pytest.fixture(scope="module")
def model_dir(accel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    channels = 512 if accel == "cuda" else 32
    return make_spkflow_model_dir(
        tmp_path_factory.mktemp("model") / "ecapa", seed=1, channels=channels, num_mel_bins=80, embed_dim=192
    )


def embed(emb: SpkflowEmbedder, data: Path, out: Path, batch_size: int) -> dict[str, np.ndarray]:
    utts = (data / "utt2spk").read_text().split()[::2]  # utt spk utt spk ...: the utterances
    run_job(emb, data, utts, out, batch_size=batch_size, max_frames=10**6, num_workers=2, progress=False)
    entries = [tuple(line.split(" ", 1)) for line in (out / "xvector.1.scp").read_text().splitlines()]
    vecs = dict(zip([k for k, _ in entries], read_vectors(entries), strict=True))
    assert sorted(vecs) == sorted(utts)
    return vecs


@pytest.mark.parametrize("fbank_on", ["workers", "device"])
def test_batched_equals_alone_on_the_device(accel, speech, model_dir, tmp_path, fbank_on):
    emb = SpkflowEmbedder(model_dir, accel, fbank_on=fbank_on)
    batched = embed(emb, speech, tmp_path / "batched", batch_size=16)
    alone = embed(emb, speech, tmp_path / "alone", batch_size=1)
    worst = max(float(np.abs(l2(batched[u]) - l2(alone[u])).max()) for u in batched)
    print(f"{accel}, fbank in the {fbank_on}: batched vs alone, max |diff| after L2 {worst:.2e}")
    assert worst <= 1e-4


def test_fbank_on_the_device_equals_fbank_in_the_workers(accel, speech, model_dir, tmp_path):
    a = embed(SpkflowEmbedder(model_dir, accel, fbank_on="workers"), speech, tmp_path / "w", batch_size=16)
    b = embed(SpkflowEmbedder(model_dir, accel, fbank_on="device"), speech, tmp_path / "d", batch_size=16)
    worst = max(float(np.abs(l2(a[u]) - l2(b[u])).max()) for u in a)
    print(f"{accel}: fbank on the device vs in the workers, max |diff| after L2 {worst:.2e}")
    assert worst <= 1e-4
    assert SpkflowEmbedder(model_dir, accel, fbank_on="auto").fbank_on == (
        "device" if accel == "cuda" else "workers"
    )  # auto


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_matches_float32_on_real_speech(accel, speech, model_dir, tmp_path, dtype):
    if dtype == "float16" and accel != "cuda":
        pytest.skip("float16 is CUDA-only")
    ref = embed(SpkflowEmbedder(model_dir, accel, fbank_on="auto"), speech, tmp_path / "f32", batch_size=16)
    half = embed(SpkflowEmbedder(model_dir, accel, dtype=dtype, fbank_on="auto"), speech, tmp_path / dtype, 16)
    cos = np.array([float(l2(ref[u]) @ l2(half[u])) for u in ref])
    print(f"{accel} {dtype} vs float32 on {len(cos)} utterances: min cosine {cos.min():.6f}, mean {cos.mean():.6f}")
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in half.values())
    assert cos.min() >= MIN_COSINE[accel]
    assert not all(np.array_equal(ref[u], half[u]) for u in ref)  # it really ran in reduced precision


def test_the_jobs_page_locked_slots_give_the_embeddings_of_the_plain_path(accel, speech, model_dir, tmp_path, caplog):
    """Batches of two from two workers: each of the job's ten slots is filled again and again
    while copies from the others are on their way, so a slot handed out too early would change
    embeddings; :meth:`embed` pads in this process and waits for each batch."""
    emb = SpkflowEmbedder(model_dir, accel, fbank_on="device")
    with caplog.at_level(logging.INFO):
        job = embed(emb, speech, tmp_path / "job", batch_size=2)
    if accel == "cuda":  # registered in the background while the job runs: all ten, unless it was quicker
        locked = re.search(r"page-locked (\d+) of 10 batch slots", caplog.text)
        assert locked and int(locked.group(1)) >= 1, caplog.text
    prepare = emb.preparer(speech)
    worst = max(float(np.abs(l2(job[u]) - l2(emb.embed([prepare(u)])[0])).max()) for u in job)
    print(f"{accel}: the job's page-locked batches vs the plain path, max |diff| after L2 {worst:.2e}")
    assert worst <= 1e-4
