"""The batched torch frontend (spkflow.features.torch_fbank) against the numpy path it must equal:
fbank within 1e-3 on the log scale on real speech of every rate the recipes use (16 kHz; 8 kHz
audio resampled to 16 kHz as FSDD and dsp20_8k are read), every fbank option, batch = alone, the
energy VAD's decisions exactly, and the model's frontend.  On the CPU here; the CUDA-marked test
runs the same comparison on the GPU (test/bench/gpu_check.sh)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import soundfile as sf
import torch

from helpers.audio import FBANK_CHANGES, synth_voice
from helpers.corpora import real_speech_sets, speech_files
from helpers.spread import permuted, within
from spkflow.data.resample import resample
from spkflow.features.fbank import FbankOptions, apply_frontend, compute_fbank, compute_vad, num_frames
from spkflow.features.torch_fbank import BatchFrontend, fbank_batch, frame_counts, frontend_batch, vad_batch
from spkflow.features.vad import VadOptions

TOL = 1e-3  # the bound (max abs on the log-mel scale); measured: 2e-6


def _read(path) -> tuple[np.ndarray, int]:
    w, sr = sf.read(path, dtype="float32", always_2d=True)
    return w[:, 0], sr


def _pad(waves: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(w) for w in waves])
    out = torch.zeros(len(waves), int(lengths.max()))
    for i, w in enumerate(waves):
        out[i, : len(w)] = torch.from_numpy(w)
    return out, lengths


def _max_diff(waves16: list[np.ndarray], refs: list[np.ndarray], opts: FbankOptions, device: str = "cpu") -> float:
    """Max abs difference of the batched torch fbank (on ``device``) against ``refs``; checks
    frame counts and zero padding on the way."""
    x, lengths = _pad(waves16)
    feats, frames = fbank_batch(x.to(device), lengths.to(device), opts)
    assert feats.dtype == torch.float32 and feats.device.type == device
    feats, frames = feats.cpu().numpy(), frames.cpu().numpy()
    assert frames.tolist() == [len(r) for r in refs]
    assert feats.shape == (len(refs), max(len(r) for r in refs), opts.dim)
    for i, r in enumerate(refs):
        assert not feats[i, len(r) :].any()  # padding frames are zero
    return max(float(np.abs(feats[i, : len(r)] - r).max()) for i, r in enumerate(refs))


def _real_speech(corpus) -> dict[str, tuple[list[np.ndarray], list[np.ndarray]]]:
    """Per set: (waveforms at 16 kHz as stage 2 reads them, the numpy fbank of the audio as read)."""
    opts = FbankOptions()
    return {
        name: ([resample(w, sr, 16000) for w, sr in audio], [compute_fbank(w, sr, opts) for w, sr in audio])
        for name, audio in real_speech_sets(corpus).items()
    }


@pytest.mark.corpus
def test_equals_numpy_fbank_on_real_speech_of_every_rate(corpus):
    for name, (waves, refs) in _real_speech(corpus).items():
        diff = _max_diff(waves, refs, FbankOptions())
        print(f"{name}: {len(waves)} utterances, max |torch - numpy| = {diff:.2e}")
        assert diff < TOL, name


@pytest.mark.cuda
@pytest.mark.corpus
def test_equals_numpy_fbank_on_the_device(corpus, accel):
    """The GPU path (cuFFT, float64 on the device) on the same real speech."""
    for name, (waves, refs) in _real_speech(corpus).items():
        diff = _max_diff(waves, refs, FbankOptions(), accel)
        print(f"{accel} {name}: max |torch - numpy| = {diff:.2e}")
        assert diff < TOL, name


@pytest.fixture(scope="module")
def waves() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    # odd lengths (not multiples of the shift), exactly one frame, a DC offset, near silence
    out = [synth_voice(rng, 120 + 40 * i, (500, 1500, 2500), sec) for i, sec in enumerate((0.73, 1.31, 2.05))]
    out.append((0.3 * rng.standard_normal(401)).astype(np.float32))
    out.append((synth_voice(rng, 150, (600, 1800), 0.9) + 0.05).clip(-1, 1).astype(np.float32))
    out.append((1e-4 * rng.standard_normal(5000)).astype(np.float32))
    return out


@pytest.mark.parametrize(
    "change",
    [{}, *FBANK_CHANGES, dict(window_type="rectangular", remove_dc_offset=False), dict(use_log_fbank=False)],
)
def test_every_option_equals_numpy(waves, change):
    opts = dataclasses.replace(FbankOptions(), **change)
    rate = int(opts.sample_frequency)
    ws = [w for w in waves if num_frames(len(w), opts) > 0]
    refs = [compute_fbank(w, rate, opts) for w in ws]
    scale = 1.0 if opts.use_log_fbank else max(float(np.abs(r).max()) for r in refs)  # linear: relative
    assert _max_diff(ws, refs, opts) / scale < (TOL if opts.use_log_fbank else 1e-6)


@pytest.mark.parametrize("snip_edges", [True, False])
def test_batched_equals_alone_and_padding_is_ignored(waves, snip_edges):
    """A row's frames come from its own samples only: garbage in the padding changes nothing."""
    opts = FbankOptions(snip_edges=snip_edges)
    waves = permuted(waves)  # the batch order under test (helpers.spread)
    x, lengths = _pad(waves)
    x += 0.5 * (torch.arange(x.shape[1]) >= lengths[:, None])  # poison the padding
    batched, frames = fbank_batch(x, lengths, opts)
    for i, w in enumerate(waves):
        alone, n = fbank_batch(torch.from_numpy(w)[None], torch.tensor([len(w)]), opts)
        assert int(n[0]) == int(frames[i]) == num_frames(len(w), opts)
        # measured 0 (1 and 2 threads, batch order permuted)
        within("fbank batched vs alone (log-mel)", float((batched[i, : int(n[0])] - alone[0]).abs().max()), 1e-5)


def test_frame_counts_equal_num_frames():
    for snip in (True, False):
        opts = FbankOptions(snip_edges=snip)
        n = torch.arange(0, 2000, 7)
        assert frame_counts(n, opts).tolist() == [num_frames(int(k), opts) for k in n]


def test_short_rows_and_bad_shapes_are_refused():
    x = torch.zeros(3, 1000)
    with pytest.raises(ValueError, match=r"row 1: 399 samples at 16000 Hz is shorter than one frame \(400"):
        fbank_batch(x, torch.tensor([1000, 399, 400]))
    with pytest.raises(ValueError, match="expected waves"):
        fbank_batch(x[0], torch.tensor([1000]))
    with pytest.raises(ValueError, match="lengths up to 1200"):
        fbank_batch(x, torch.tensor([1200, 400, 400]))
    with pytest.raises(ValueError, match="dither 0"):
        BatchFrontend(FbankOptions(dither=1.0))


@pytest.mark.corpus
@pytest.mark.parametrize(
    "vad_opts",
    [
        VadOptions(),
        VadOptions(vad_floor_margin=0.0),
        VadOptions(vad_frames_context=0),
        VadOptions(vad_floor_percentile=0),
    ],
)
def test_vad_decisions_equal_numpy_exactly(corpus, vad_opts):
    """The same features in: the same voiced frames out, on every frame of real speech."""
    feats = [compute_fbank(*_read(p)) for p in speech_files(corpus("SPEECHOCEAN762"), "SPEECHOCEAN762")]
    feats += [compute_fbank(*_read(p)) for p in speech_files(corpus("FSDD"), "FSDD")]
    x = torch.zeros(len(feats), max(len(f) for f in feats), feats[0].shape[1])
    for i, f in enumerate(feats):
        x[i, : len(f)] = torch.from_numpy(f)
    frames = torch.tensor([len(f) for f in feats])
    voiced = vad_batch(x, frames, vad_opts).numpy()
    total = 0
    for i, f in enumerate(feats):
        ref = compute_vad(f, vad_opts) > 0.5
        np.testing.assert_array_equal(voiced[i, : len(f)], ref)
        assert not voiced[i, len(f) :].any()
        total += len(f)
    assert 0.2 < voiced.sum() / total < 0.95  # real decisions, not all one way


@pytest.mark.parametrize("mean_norm", [False, True])
def test_frontend_equals_apply_frontend(waves, mean_norm):
    """Voiced frames moved to the front, the all-unvoiced row kept whole, the mean over kept frames."""
    opts = FbankOptions()
    feats = [compute_fbank(w, 16000, opts) for w in waves]
    vads = [compute_vad(f) for f in feats]
    vads[1][:] = 0.0  # no voiced frame: the whole utterance is kept
    x = torch.zeros(len(feats), max(len(f) for f in feats), opts.dim)
    v = torch.zeros(x.shape[:2], dtype=torch.bool)
    for i, (f, d) in enumerate(zip(feats, vads, strict=True)):
        x[i, : len(f)], v[i, : len(f)] = torch.from_numpy(f), torch.from_numpy(d > 0.5)
    out, lengths = frontend_batch(x, torch.tensor([len(f) for f in feats]), v, mean_norm)
    refs = [apply_frontend(f, d, use_vad=True, mean_norm=mean_norm) for f, d in zip(feats, vads, strict=True)]
    assert lengths.tolist() == [len(r) for r in refs] and out.shape[1] == max(len(r) for r in refs)
    assert len(refs[1]) == len(feats[1]) and len(refs[0]) < len(feats[0])
    for i, r in enumerate(refs):
        np.testing.assert_allclose(out[i, : len(r)].numpy(), r, atol=1e-4, rtol=0)
        assert not out[i, len(r) :].any()


def test_batch_frontend_equals_the_numpy_frontend(waves):
    opts, vad = FbankOptions(), VadOptions()
    x, lengths = _pad(waves)
    out, n = BatchFrontend(opts, vad, use_vad=True, mean_norm=True)(x, lengths)
    for i, w in enumerate(waves):
        f = compute_fbank(w, 16000, opts)
        ref = apply_frontend(f, compute_vad(f, vad), use_vad=True, mean_norm=True)
        assert int(n[i]) == len(ref)
        np.testing.assert_allclose(out[i, : len(ref)].numpy(), ref, atol=1e-4, rtol=0)
