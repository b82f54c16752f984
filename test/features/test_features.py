"""Fbank (Kaldi parity), option files, energy VAD and the frontend (spkflow.features.fbank / spkflow.features.vad)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi

from helpers.audio import FBANK_CHANGES, synth_voice
from helpers.paths import TEMPLATE
from spkflow.core.errors import InputError
from spkflow.data.resample import resample
from spkflow.features.fbank import (
    FbankOptions,
    apply_frontend,
    check_resample_rate,
    compute_fbank,
    compute_vad,
    num_frames,
    select_voiced,
)
from spkflow.features.vad import VadOptions, frame_log_energy

TOL = 1e-3  # max abs difference on the log-mel scale


def reference(wave: np.ndarray, opts: FbankOptions) -> np.ndarray:
    """Kaldi's compute-fbank-feats on 16-bit samples = torchaudio's Kaldi fbank on the waveform
    scaled to the int16 range.  Run in float64: torchaudio in float32 carries rounding noise of
    ~1e-2 in the lowest mel bins of quiet frames (see spkflow.features.fbank), larger than TOL."""
    d = opts.to_dict()
    window_type = d.pop("window_type")
    x = torch.from_numpy(np.asarray(wave, dtype=np.float64))[None] * 32768.0
    return kaldi.fbank(x, window_type=window_type, **d).numpy()


@pytest.fixture(scope="module")
def waves() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    # odd lengths (not multiples of the shift), one just over a frame, one with a DC offset
    out = [synth_voice(rng, 120 + 40 * i, (500, 1500, 2500), sec) for i, sec in enumerate((0.73, 1.31, 2.05))]
    out.append((0.3 * rng.standard_normal(401)).astype(np.float32))  # 401 samples: exactly one frame
    out.append((synth_voice(rng, 150, (600, 1800), 0.9) + 0.05).clip(-1, 1).astype(np.float32))
    return out


def test_parity_with_kaldi_16k(waves):
    opts = FbankOptions()
    for w in waves:
        ours = compute_fbank(w, 16000, opts)
        ref = reference(w, opts)
        assert ours.dtype == np.float32
        assert ours.shape == ref.shape == (num_frames(len(w), opts), 80)
        assert np.abs(ours - ref).max() < TOL


@pytest.mark.parametrize(
    "change",
    FBANK_CHANGES,
)
def test_parity_with_kaldi_options(waves, change):
    opts = dataclasses.replace(FbankOptions(), **change)
    w = waves[1]
    ours = compute_fbank(w, int(opts.sample_frequency), opts)
    ref = reference(w, opts)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < TOL


def test_parity_8k_resampled_to_16k():
    """8 kHz audio with 16 kHz options: resampled first, then identical to Kaldi's fbank of the
    resampled waveform."""
    rng = np.random.default_rng(3)
    w8 = synth_voice(rng, 140, (500, 1500, 2500), 1.1, sample_rate=8000)
    opts = FbankOptions()
    ours = compute_fbank(w8, 8000, opts)
    w16 = resample(w8, 8000, 16000)
    ref = reference(w16, opts)
    assert ours.shape == ref.shape == (num_frames(len(w16), opts), 80)
    assert np.abs(ours - ref).max() < TOL


@pytest.mark.corpus
def test_parity_on_real_speech(corpus):
    root = corpus("SPEECHOCEAN762")
    lines = (root / "train" / "wav.scp").read_text().splitlines()[:3]
    opts = FbankOptions()
    for line in lines:
        w, sr = sf.read(root / line.split()[1], dtype="float32")
        ours = compute_fbank(w, sr, opts)
        assert np.abs(ours - reference(w, opts)).max() < TOL


def test_dither_is_seeded():
    w = synth_voice(np.random.default_rng(0), 150, (600,), 0.5)
    opts = FbankOptions(dither=1.0)
    a = compute_fbank(w, 16000, opts)
    assert np.array_equal(a, compute_fbank(w, 16000, opts))
    assert not np.array_equal(a, compute_fbank(w, 16000, opts, rng=np.random.default_rng(1)))
    assert not np.array_equal(a, compute_fbank(w, 16000, FbankOptions()))


def test_too_short_and_bad_rates():
    opts = FbankOptions()
    with pytest.raises(ValueError, match="shorter than one frame"):
        compute_fbank(np.zeros(399, np.float32), 16000, opts)
    with pytest.raises(ValueError, match="shorter than one frame"):
        compute_fbank(np.zeros(0, np.float32), 16000, opts)
    with pytest.raises(ValueError, match="cannot resample 1000 Hz"):
        compute_fbank(np.zeros(4000, np.float32), 1000, opts)
    with pytest.raises(ValueError):
        check_resample_rate(0, 16000)
    with pytest.raises(ValueError):
        check_resample_rate(22050.5, 16000)
    for ok in (8000, 11025, 16000, 22050, 44100, 48000, 96000):
        check_resample_rate(ok, 16000)
    with pytest.raises(ValueError, match="mono"):
        compute_fbank(np.zeros((2, 800), np.float32), 16000, opts)


def test_options_from_kaldi_conf(tmp_path):
    conf = FbankOptions.from_kaldi_conf(TEMPLATE / "conf" / "fbank.conf")
    assert conf == FbankOptions()  # the shipped config is the documented default
    assert (conf.num_mel_bins, conf.frame_length, conf.frame_shift, conf.sample_frequency, conf.dither) == (
        80,
        25.0,
        10.0,
        16000.0,
        0.0,
    )
    p = tmp_path / "f.conf"
    p.write_text("# comment\n\n--num-mel-bins=40  # trailing comment\n--snip-edges=false\n--use-energy\n--verbose=2\n")
    o = FbankOptions.from_kaldi_conf(p)
    assert (o.num_mel_bins, o.snip_edges, o.use_energy) == (40, False, True)
    assert FbankOptions.from_kaldi_conf(_write(tmp_path / "rt.conf", o.to_kaldi_conf())) == o
    assert FbankOptions.from_dict(o.to_dict()) == o
    for text, line, msg in [
        ("--num-mel-bins=80\n--num-mel-bin=40\n", 2, "unknown option '--num-mel-bin'"),
        ("--num-mel-bins=eighty\n", 1, "bad value"),
        ("--snip-edges=maybe\n", 1, "true or false"),
        ("\nnum-mel-bins=80\n", 2, "one '--name=value'"),
        ("--num-mel-bins 80\n", 1, "one '--name=value'"),
    ]:
        with pytest.raises(InputError, match=msg) as e:
            FbankOptions.from_kaldi_conf(_write(tmp_path / "bad.conf", text))
        assert e.value.line == line and e.value.path.endswith("bad.conf")
    with pytest.raises(InputError, match="window-type"):
        FbankOptions.from_kaldi_conf(_write(tmp_path / "bad.conf", "--window-type=kaiser\n"))
    with pytest.raises(InputError, match="cannot read"):
        FbankOptions.from_kaldi_conf(tmp_path / "missing.conf")
    assert VadOptions.from_kaldi_conf(TEMPLATE / "conf" / "vad.conf") == VadOptions()


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


# --------------------------------------------------------------------------- VAD


def _speech_in_silence(
    rng: np.random.Generator, lead: float, speech: float, tail: float
) -> tuple[np.ndarray, int, int]:
    """Returns (wave, first speech frame, first trailing-silence frame)."""
    sil = lambda sec: (3e-4 * rng.standard_normal(int(sec * 16000))).astype(np.float32)  # noqa: E731
    voice = synth_voice(rng, 130, (600, 1400, 2600), speech, silence=0.0)
    w = np.concatenate([sil(lead), voice, sil(tail)])
    return w, int(lead * 100), int((lead + speech) * 100)


def test_vad_marks_speech_and_silence():
    rng = np.random.default_rng(11)
    w, a, b = _speech_in_silence(rng, 0.8, 1.0, 1.2)  # mostly silence, like DSPSpeech-20
    feats = compute_fbank(w, 16000)
    vad = compute_vad(feats)
    assert vad.dtype == np.float32 and vad.shape == (len(feats),) and set(np.unique(vad)) <= {0.0, 1.0}
    assert vad[a + 3 : b - 3].mean() > 0.9  # speech (syllable dips allowed a little)
    assert vad[: a - 3].mean() < 0.05 and vad[b + 3 :].mean() < 0.05
    assert 0.3 < vad.mean() < 0.45
    # a pure gain change of the whole recording moves Kaldi's threshold only through the mean term
    assert np.abs(compute_vad(compute_fbank(w * 0.5, 16000)) - vad).mean() < 0.05


def test_vad_context_window_counts_neighbours():
    """Kaldi's loop compares the centre frame for every context position, so its context has
    no effect; here a loud frame makes its +-context neighbours voiced (proportion 0.12)."""
    e = np.full((50, 80), -5.0, np.float32)
    e[20] = 10.0  # one loud frame
    mean_e = frame_log_energy(e).mean()
    assert frame_log_energy(e)[20] > 5.5 + 0.5 * mean_e
    assert np.flatnonzero(compute_vad(e, VadOptions(vad_frames_context=0))).tolist() == [20]
    assert np.flatnonzero(compute_vad(e, VadOptions(vad_frames_context=2))).tolist() == [18, 19, 20, 21, 22]
    # proportion 0.5 with context 2: half of the window (cut at the edges) must be above
    e2 = np.full((10, 80), -5.0, np.float32)
    e2[[0, 1, 5, 6, 7]] = 10.0
    got = compute_vad(e2, VadOptions(vad_frames_context=2, vad_proportion_threshold=0.5))
    assert got.tolist() == [1, 1, 0, 0, 0, 1, 1, 1, 1, 0]
    assert compute_vad(np.zeros((0, 80), np.float32)).shape == (0,)
    assert compute_vad(e[:3], VadOptions(vad_frames_context=5)).shape == (3,)  # shorter than the window


def test_frame_log_energy_tracks_raw_energy():
    """The mel-sum energy (minus log(fft bins)) stays within a few nats of Kaldi's raw log
    energy on speech, so Kaldi's VAD thresholds keep their meaning."""
    w = synth_voice(np.random.default_rng(5), 140, (600, 1400), 1.0)
    f = compute_fbank(w, 16000, FbankOptions(use_energy=True))
    raw, ours = f[:, 0], frame_log_energy(f[:, 1:])
    loud = raw > np.median(raw)
    assert np.abs(raw[loud] - ours[loud]).mean() < 3.5
    assert np.corrcoef(raw, ours)[0, 1] > 0.95


# --------------------------------------------------------------------------- frontend


def test_apply_frontend_and_select_voiced():
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((10, 4)).astype(np.float32) + 3.0
    vad = np.array([0, 1, 1, 0, 1, 0, 0, 1, 1, 0], np.float32)
    out = apply_frontend(feats, vad, use_vad=True, mean_norm=True)
    kept = feats[vad > 0.5]
    assert np.allclose(out, kept - kept.mean(0), atol=1e-6)
    assert np.allclose(out.mean(0), 0, atol=1e-6)
    assert np.array_equal(apply_frontend(feats, vad, use_vad=False, mean_norm=False), feats)
    assert apply_frontend(feats, vad, use_vad=False, mean_norm=False) is not feats
    assert np.allclose(apply_frontend(feats, None, use_vad=True, mean_norm=True), feats - feats.mean(0), atol=1e-6)
    # an utterance without a voiced frame keeps all frames (never an empty embedding input)
    assert np.array_equal(select_voiced(feats, np.zeros(10, np.float32)), feats)
    with pytest.raises(ValueError, match="VAD has 9 frames"):
        select_voiced(feats, vad[:9])


def test_vad_noise_floor_guard():
    """A loud, steady background (high recording gain) puts every frame above Kaldi's
    threshold; the floor guard keeps the background out, and margin 0 is Kaldi's rule."""
    rng = np.random.default_rng(2)
    voice = synth_voice(rng, 130, (600, 1400, 2600), 0.8, silence=0.0)
    noise = lambda n: (0.003 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    w = np.concatenate([noise(16000), voice + noise(len(voice)), noise(16000)])
    feats = compute_fbank(w, 16000)
    kaldi_rule = compute_vad(feats, VadOptions(vad_floor_margin=0.0))
    guarded = compute_vad(feats)
    assert kaldi_rule[:90].mean() > 0.9  # the background counts as speech
    assert guarded[:90].mean() < 0.1 and guarded[-90:].mean() < 0.1
    assert guarded[105:170].mean() > 0.8
    e = frame_log_energy(feats)
    above = e > 5.5 + 0.5 * e.mean()
    assert np.array_equal(compute_vad(feats, VadOptions(vad_floor_margin=0.0, vad_frames_context=0)), above)
    # no dynamic range (all speech, or all noise): the guard stands aside
    flat = np.full((100, 80), 2.0, np.float32) + 0.01 * rng.standard_normal((100, 80)).astype(np.float32)
    assert np.array_equal(compute_vad(flat), compute_vad(flat, VadOptions(vad_floor_margin=0.0)))


def test_speech_seconds_counts_voiced_speech_not_silence_or_steady_sounds() -> None:
    """The speech check of verify / identify / the API: a synthetic voice has its voiced seconds
    (any rate), while digital silence, steady noise at -60 dBFS and a steady tone have none, and
    30 ms / 200 ms clips fall below MIN_SPEECH."""
    from spkflow.data.resample import resample
    from spkflow.features.speech import MIN_SPEECH, speech_seconds

    rng = np.random.default_rng(7)
    voice = synth_voice(rng, 140.0, (700.0, 1200.0), 2.0)  # 2 s with 0.2 s of near-silence at each end
    s = speech_seconds(voice, 16000)
    assert 1.2 <= s <= 2.2
    assert abs(speech_seconds(resample(voice, 16000, 8000), 8000) - s) <= 0.1
    t = np.arange(32000) / 16000
    assert speech_seconds(np.zeros(32000, np.float32), 16000) == 0.0
    assert speech_seconds((1e-3 * rng.standard_normal(32000)).astype(np.float32), 16000) == 0.0
    assert speech_seconds((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000) == 0.0
    mid = 16000 + 3200
    assert speech_seconds(voice[mid : mid + 3200], 16000) < MIN_SPEECH
    assert speech_seconds(voice[mid : mid + 480], 16000) < MIN_SPEECH
    assert speech_seconds(voice[:100], 16000) == 0.0


@pytest.mark.parametrize(
    "change",
    [{}, {"dither": 1.0}, {"use_energy": True}, {"snip_edges": False}, {"use_power": False}, {"num_mel_bins": 24}],
    ids=["default", "dither", "energy", "no-snip", "magnitude", "24-bins"],
)
def test_fbank_in_blocks_is_bit_for_bit_the_one_piece_fbank(monkeypatch, change) -> None:
    """compute_fbank windows and transforms CHUNK_FRAMES frames at a time (a 10-minute clip's frame
    matrix and spectra at once took 0.8 GB): every frame gets exactly the bits it got in one
    piece, whatever the remainder (1 frame: numpy's product of one row rounds otherwise), the
    dither drawn in the same order.  CHUNK_FRAMES 64 stands for 4096 here."""
    import spkflow.features.fbank as fbank

    rng = np.random.default_rng(5)
    opts = FbankOptions(**change)
    for frames in (1, 63, 64, 65, 129, 300):
        x = (0.1 * rng.standard_normal(400 + (frames - 1) * 160)).astype(np.float32)
        monkeypatch.setattr(fbank, "CHUNK_FRAMES", 10**9)
        whole = compute_fbank(x, 16000, opts)
        monkeypatch.setattr(fbank, "CHUNK_FRAMES", 64)
        assert np.array_equal(compute_fbank(x, 16000, opts), whole), frames
