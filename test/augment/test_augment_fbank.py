"""Augmentation of log-mel crops (spkflow/augment/fbank.py): speed perturbation and channel perturbation."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from helpers.paths import ROOT
from spkflow.augment.fbank import FbankChannelPerturb, band_response, mel_centers, normalize_channel_config, reverberate
from spkflow.core.checks import ConfigError
from spkflow.data.resample import resample
from spkflow.features.fbank import FbankOptions, compute_fbank
from spkflow.train.config import normalize_train_config


def test_fbank_speed_perturb_moves_time_and_frequency() -> None:
    from spkflow.augment.fbank import FbankSpeedPerturb

    fb = {"num_mel_bins": 40, "sample_frequency": 16000.0, "low_freq": 20.0, "high_freq": 0.0}
    c = mel_centers(40)
    k = 20
    x = torch.zeros(2, 55, 40)
    x[:, :, k] = 1.0  # a spectral peak at bin k ...
    x[:, :, 0] = torch.arange(55).float()  # ... and a time ramp in bin 0
    for f in (0.9, 1.1):
        sp = FbankSpeedPerturb([f], fb)
        y, idx = sp(x, num_utt=2)
        t_out = sp.out_frames(55)  # floor(T_read / largest factor)
        assert t_out == {0.9: 61, 1.1: 50}[f]
        assert y.shape == (2, t_out, 40) and idx.tolist() == [0]
        band = y[0, 10, 10:]  # away from the ramp, which the lowest bins copy when f > 1
        peak = float((band * torch.arange(10, 40)).sum() / band.sum())
        want = float(np.interp(c[k] * f, c, np.arange(40)))  # the peak moves to frequency c_k * f
        assert abs(peak - want) < 0.6, (f, peak, want)
        if f > 1:  # bin 0 keeps the ramp (its source lies below the lowest centre): frame i = input i * f
            torch.testing.assert_close(y[0, :, 0], torch.arange(t_out).float() * f, atol=1e-4, rtol=0)
    mixed = FbankSpeedPerturb([1.0, 1.1], fb)
    assert mixed.read_frames(50) == 55 and mixed.out_frames(55) == 50
    same, _ = FbankSpeedPerturb([1.0, 1.0], fb)(x, num_utt=1)
    torch.testing.assert_close(same, x)  # factor 1 is the identity


def test_fbank_speed_perturb_one_factor_per_speaker() -> None:
    from spkflow.augment.fbank import FbankSpeedPerturb

    sp = FbankSpeedPerturb([0.9, 1.0, 1.1], {"num_mel_bins": 20})
    x = torch.randn(1, 60, 20).expand(24, 60, 20).contiguous()  # 8 speakers x 3 identical crops
    torch.manual_seed(0)
    y, idx = sp(x, num_utt=3)
    assert idx.shape == (8,) and len(set(idx.tolist())) > 1
    for s in range(8):  # crops of a speaker are warped alike, speakers with another factor differently
        torch.testing.assert_close(y[3 * s], y[3 * s + 2])
        for r in range(8):
            if idx[r] != idx[s]:
                assert not torch.allclose(y[3 * s], y[3 * r])
    with pytest.raises(ValueError, match="factors"):
        FbankSpeedPerturb([3.0], {"num_mel_bins": 20})


def _channel(**cfg: float) -> FbankChannelPerturb:
    return FbankChannelPerturb(normalize_channel_config(cfg), {"num_mel_bins": 40})


def test_channel_level_is_a_waveform_gain_in_db() -> None:
    """A level of g dB is what scaling the waveform by 10^(g/20) does to Kaldi fbank (natural log
    of power, no dither): the same number added to every bin of every frame."""
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000.0
    wave = 0.1 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(16000)
    opts = FbankOptions(num_mel_bins=40, dither=0.0)
    a = torch.from_numpy(compute_fbank(wave.astype(np.float32), 16000, opts))
    b = torch.from_numpy(compute_fbank((wave * 10 ** (6.0 / 20)).astype(np.float32), 16000, opts))
    ch = _channel(shape_terms=0)
    curve = ch.curve(torch.tensor([[6.0]]))
    torch.testing.assert_close(b - a, curve.expand_as(a), atol=2e-3, rtol=0)
    assert abs(float(curve[0, 0]) - 6.0 * math.log(10) / 10) < 1e-6


def test_channel_curve_is_one_smooth_curve_per_crop() -> None:
    ch = _channel(gain_db=4.0, shape_db=2.0, shape_terms=4)
    x = torch.randn(6, 30, 40)
    torch.manual_seed(0)
    y = ch(x)
    d = y - x
    torch.testing.assert_close(d, d[:, :1].expand_as(d))  # the same curve on every frame of a crop
    for i in range(6):  # and another one for every crop, even crops of one speaker
        for j in range(i):
            assert not torch.allclose(d[i, 0], d[j, 0])
    # the curve is in the span of the level and 4 cosines over the mel bins: smooth, nothing else
    pos = (torch.arange(40, dtype=torch.float64) + 0.5) / 40
    basis = torch.cos(math.pi * torch.arange(5, dtype=torch.float64)[:, None] * pos[None, :]).T
    coef = torch.linalg.lstsq(basis, d[:, 0].double().T).solution
    assert float((basis @ coef - d[:, 0].double().T).abs().max()) < 1e-5
    torch.manual_seed(0)
    torch.testing.assert_close(ch(x), y)  # the same seed, the same channels (resume-safe)


def test_channel_draws_follow_the_config() -> None:
    torch.manual_seed(1)
    levels = _channel(gain_db=3.0, shape_terms=0).curves(4000)[:, 0] / (math.log(10) / 10)
    assert abs(float(levels.std()) - 3.0) < 0.15 and abs(float(levels.mean())) < 0.15
    torch.manual_seed(1)
    half = _channel(prob=0.5).curves(2000)
    untouched = float((half.abs().amax(1) == 0).float().mean())
    assert 0.45 < untouched < 0.55
    x = torch.randn(3, 5, 40)
    torch.testing.assert_close(_channel(prob=0.0)(x), x)
    with pytest.raises(ValueError, match="40-dim"):
        _channel()(torch.zeros(2, 5, 41))


def test_curve_moments_are_those_of_the_draws_and_leave_the_rng_alone() -> None:
    """The mean and variance of the additive curves, against what the config implies: the level
    and the cosine terms are zero-mean Gaussians (variance sum_k sd_k^2 basis_k^2), the band is a
    Bernoulli(p) copy of its response (mean p r, variance p (1 - p) r^2).  The caller's random
    stream is the same after the call as without it."""
    fb = {"num_mel_bins": 40}
    cfg = {"gain_db": 4.0, "shape_db": 1.0, "shape_terms": 4, "band_prob": 0.2}  # the band per batch (default)
    ch = FbankChannelPerturb(normalize_channel_config(cfg), fb)
    torch.manual_seed(7)
    mean, var = ch.curve_moments()
    after = torch.rand(3)
    torch.manual_seed(7)
    torch.testing.assert_close(after, torch.rand(3))  # untouched
    band = band_response(fb, 8000).astype(np.float64)
    unit = math.log(10) / 10
    sd = np.array([4.0, 1.0, 1.0, 1.0, 1.0]) * unit  # level, tilt (defaults to shape_db), 3 shapes
    gauss = (sd[:, None] ** 2 * ch.basis.double().numpy() ** 2).sum(0)
    np.testing.assert_allclose(mean, 0.2 * band, atol=0.02)
    np.testing.assert_allclose(var, gauss + 0.2 * 0.8 * band**2, rtol=0.04, atol=0.02)
    assert var[-1] > 20 * var[0]  # the band's bins vary most: what widens their input std
    np.testing.assert_allclose(ch.curve_moments()[0], mean)  # a fixed seed: the same moments each time


def test_channel_tilt_has_its_own_spread() -> None:
    """``tilt_db`` sets the spread of the first cosine term (low bins against high bins) alone;
    unset, it is ``shape_db``, and the draws are those of a config without the key."""
    pos = (torch.arange(40, dtype=torch.float64) + 0.5) / 40
    basis = torch.cos(math.pi * torch.arange(4, dtype=torch.float64)[:, None] * pos[None, :]).T  # level, 3 terms
    torch.manual_seed(2)
    curves = _channel(gain_db=1.0, shape_db=1.0, shape_terms=3, tilt_db=5.0).curves(4000).double()
    coef_db = torch.linalg.lstsq(basis, curves.T).solution.T / (math.log(10) / 10)
    sd = coef_db.std(0)
    assert abs(float(sd[1]) - 5.0) < 0.25  # the tilt
    assert all(abs(float(s) - 1.0) < 0.06 for s in (sd[0], sd[2], sd[3]))  # level and the other terms
    torch.manual_seed(3)
    default = _channel(shape_db=2.0).curves(50)
    torch.manual_seed(3)
    torch.testing.assert_close(_channel(shape_db=2.0, tilt_db=2.0).curves(50), default)
    assert normalize_channel_config({"shape_db": 2.5})["tilt_db"] == 2.5


def test_rolloff_is_flat_below_its_corner_and_falls_by_its_slope_above() -> None:
    """Each dull crop's curve is 0 below a corner frequency and falls by a fixed number of dB per
    octave of mel-bin centre frequency above it; corners and slopes stay in their ranges; the
    rest of the crops are untouched; an energy column keeps its value."""
    cfg = {"gain_db": 0.0, "shape_terms": 0, "rolloff_prob": 0.5, "rolloff_hz": [1000, 4000], "rolloff_db": [6, 18]}
    fb = {"num_mel_bins": 40, "use_energy": True}
    ch = FbankChannelPerturb(normalize_channel_config(cfg), fb)
    torch.manual_seed(4)
    curves = ch.curves(400).double() / (math.log(10) / 10)  # dB
    energy, db = curves[:, 0], curves[:, 1:]
    assert float(energy.abs().max()) == 0.0
    dull = db.abs().amax(1) > 0
    assert 0.42 < float(dull.float().mean()) < 0.58
    octaves = torch.from_numpy(np.log2(mel_centers(40))).double()
    for row in db[dull]:
        falling = row < 0
        assert bool(falling[-1]) and not bool(falling[0])
        assert bool((falling[1:] >= falling[:-1]).all())  # one corner: flat, then falling
        i = int(falling.float().argmax())  # the first bin past the corner
        slope = -float(row[-1] - row[i]) / float(octaves[-1] - octaves[i])
        corner = float(octaves[i]) + float(row[i]) / slope
        assert 6.0 - 1e-6 <= slope <= 18.0 + 1e-6
        assert math.log2(1000) - 1e-6 <= corner <= math.log2(4000) + 1e-6
        torch.testing.assert_close(row[i:], -slope * (octaves[i:] - corner), atol=1e-4, rtol=0)  # straight
    torch.manual_seed(5)  # drawn after the channel and the band: those draw as without it
    before = _channel(band_prob=0.3, band_per="crop").curves(50)
    torch.manual_seed(5)
    added = _channel(band_prob=0.3, band_per="crop", rolloff_prob=0.5).curves(50) - before
    changed = added.abs().amax(1) > 0
    assert 0 < int(changed.sum()) < 50
    assert float(added.max()) <= 0.0 and float(added[:, 0].abs().max()) == 0.0


def _room_wave(wave: np.ndarray, rt60: float, drr_db: float, rng: np.random.Generator) -> np.ndarray:
    """``wave`` convolved with a simulated room impulse response: the direct sound plus Gaussian
    noise under an exponential energy envelope (60 dB of decay in ``rt60`` s) whose energy is
    ``drr_db`` below the direct sound's."""
    t = np.arange(1, int(16000 * rt60 * 1.5)) / 16000.0
    tail = rng.standard_normal(len(t)) * 10.0 ** (-3.0 * t / rt60)  # amplitude: -60 dB of power at rt60
    tail *= math.sqrt(10.0 ** (-drr_db / 10.0) / float(np.sum(tail**2)))
    return np.convolve(wave, np.concatenate([[1.0], tail]))[: len(wave)]


@pytest.mark.parametrize(("rt60", "drr_db"), [(0.3, 10.0), (0.5, 5.0), (0.8, 0.0)])
def test_reverberate_is_what_a_room_does_to_fbank(rt60: float, drr_db: float) -> None:
    """Speech-like audio (a gliding harmonic voice in syllables, pauses between them) convolved with
    a simulated RIR, through Kaldi fbank, against the room applied to the dry fbank: the model's
    frames are at least three times as close to the real reverberant frames as the dry ones are, the
    pauses filled with the tail included."""
    rng = np.random.default_rng(1)
    t = np.arange(3 * 16000) / 16000.0
    f0 = 140.0 + 30.0 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    voice = sum(np.sin(k * phase) / k for k in range(1, 25))
    syllables = np.clip(np.sin(2 * np.pi * 2.5 * t), 0.0, None) ** 2
    dry = 0.1 * voice * syllables + 1e-4 * rng.standard_normal(len(t))
    opts = FbankOptions(num_mel_bins=40, dither=0.0)
    a = compute_fbank(dry.astype(np.float32), 16000, opts)
    b = compute_fbank(_room_wave(dry, rt60, drr_db, rng).astype(np.float32), 16000, opts)
    decay = torch.tensor([10.0 ** (-6.0 * 0.01 / rt60)])
    ratio = torch.tensor([10.0 ** (-drr_db / 10.0)])
    model = reverberate(torch.from_numpy(a)[None], decay, ratio)[0].numpy() + math.log1p(float(ratio))
    late = slice(int(100 * rt60), None)  # the real room's first frames have no past; the model assumes one
    err_dry, err_model = (float(np.abs(x[late] - b[late]).mean()) for x in (a, model))
    assert err_model < 0.3 * err_dry, (err_model, err_dry)


def test_reverberate_keeps_the_energy_and_leaves_dry_crops_alone() -> None:
    """A stationary crop keeps its level and spectrum (the tail is renormalised away); a burst
    gains a tail that decays by the room's rate per frame; ``ratio == 0`` leaves a crop as it is."""
    x = torch.full((3, 60, 4), 2.0, dtype=torch.float64)
    x[1, :10] = 5.0  # a burst, then quiet
    x[1, 10:] = -5.0
    decay = torch.tensor([0.8, 0.8, 0.8])
    y = reverberate(x, decay, torch.tensor([0.5, 0.5, 0.0]))
    torch.testing.assert_close(y[0], x[0])  # stationary: as it was
    torch.testing.assert_close(y[2], x[2])  # dry
    after = y[1, 12:30, 0].exp() - math.exp(-5.0) / 1.5  # the tail's own power after the burst
    torch.testing.assert_close(after[1:] / after[:-1], torch.full((17,), 0.8, dtype=torch.float64), atol=1e-3, rtol=0)
    assert float(y[1, 9, 0]) < 5.0  # the loud frames lose the tail's share of their energy


def test_strong_equaliser_is_a_zero_mean_wavy_curve_on_a_share_of_the_crops() -> None:
    """``eq_prob`` adds, after every other curve is drawn, a curve of ``eq_terms`` cosines of sd
    ``eq_db`` to that share of the crops: no level (mean over the bins 0), the energy column left
    alone, its spread what the config says, the other crops as without it."""
    fb = {"num_mel_bins": 40, "use_energy": True}
    base_cfg = {"band_prob": 0.2, "band_per": "crop", "rolloff_prob": 0.3}
    ch = FbankChannelPerturb(normalize_channel_config({**base_cfg, "eq_prob": 0.25, "eq_db": 3.0, "eq_terms": 6}), fb)
    torch.manual_seed(7)
    base = FbankChannelPerturb(normalize_channel_config(base_cfg), fb).curves(2000)
    torch.manual_seed(7)
    added = (ch.curves(2000) - base).double() / (math.log(10) / 10)  # dB
    strong = added.abs().amax(1) > 1e-4
    assert 0.22 < float(strong.float().mean()) < 0.28
    assert float(added[:, 0].abs().max()) < 1e-4  # the energy column
    eq = added[strong, 1:]
    assert float(eq.mean(1).abs().max()) < 1e-3  # cosine terms over the bins: no level
    pos = (torch.arange(40, dtype=torch.float64) + 0.5) / 40
    basis = torch.cos(math.pi * torch.arange(1, 7, dtype=torch.float64)[:, None] * pos[None, :])
    coef = torch.linalg.lstsq(basis.T, eq.T).solution.T  # back to the six coefficients
    torch.testing.assert_close(coef @ basis, eq, atol=1e-3, rtol=0)  # nothing but six cosines
    assert 2.7 < float(coef.std()) < 3.3


def test_rooms_are_drawn_after_the_curves_within_their_ranges() -> None:
    """A config with a room draws the curves a config without one draws; the share of wet crops
    follows ``reverb_prob``; their decay and ratio lie in the configured ranges."""
    cfg = {"band_prob": 0.2, "band_per": "crop", "reverb_prob": 0.4, "reverb_rt60": [0.3, 0.6], "reverb_drr_db": [3, 9]}
    ch = _channel(**cfg)
    torch.manual_seed(3)
    base = _channel(band_prob=0.2, band_per="crop").curves(500)
    torch.manual_seed(3)
    torch.testing.assert_close(ch.curves(500), base)
    decay, ratio = ch.rooms(500)
    wet = ratio > 0
    assert 0.33 < float(wet.float().mean()) < 0.47
    rt60 = -6.0 * 0.01 / torch.log10(decay)
    assert 0.3 - 1e-4 <= float(rt60.min()) and float(rt60.max()) <= 0.6 + 1e-4
    drr = -10.0 * torch.log10(ratio[wet])
    assert 3.0 - 1e-4 <= float(drr.min()) and float(drr.max()) <= 9.0 + 1e-4
    x = torch.randn(500, 30, 40) + 8.0
    torch.manual_seed(3)
    y = ch(x)
    torch.manual_seed(3)
    dry = _channel(band_prob=0.2, band_per="crop")(x)
    changed = (y - dry).abs().amax((1, 2)) > 1e-5
    torch.testing.assert_close(changed, wet)  # the wet crops and only they differ


@pytest.mark.parametrize("htk_compat", [False, True])
def test_channel_moves_an_energy_column_by_the_level_only(htk_compat: bool) -> None:
    fb = {"num_mel_bins": 20, "use_energy": True, "htk_compat": htk_compat}
    ch = FbankChannelPerturb(normalize_channel_config({"shape_db": 3.0}), fb)
    curve = ch.curve(torch.tensor([[2.0, 5.0, -5.0, 5.0, -5.0]]))[0]
    energy, mel = (curve[-1], curve[:-1]) if htk_compat else (curve[0], curve[1:])
    assert abs(float(energy) - 2.0 * math.log(10) / 10) < 1e-6
    assert float(mel.max() - mel.min()) > 1.0  # the mel bins get the shape too


def test_band_response_is_what_8khz_audio_read_at_16khz_looks_like() -> None:
    """The narrow channel's curve against the real thing: white noise made at 8 kHz and resampled
    to 16 kHz by spkflow.data.resample.resample (how stage 2 reads FSDD), through Kaldi fbank, minus white
    noise made at 16 kHz; the passband level difference (a white signal spread over half the band)
    is taken out, the shape must match bin by bin, the stopband included."""
    rng = np.random.default_rng(0)
    opts = FbankOptions(num_mel_bins=40, dither=0.0)
    wide = compute_fbank((0.1 * rng.standard_normal(4 * 16000)).astype(np.float32), 16000, opts).mean(0)
    narrow_audio = resample((0.1 * rng.standard_normal(4 * 8000)).astype(np.float32), 8000, 16000)
    diff = compute_fbank(narrow_audio, 16000, opts).mean(0) - wide
    diff -= np.median(diff[mel_centers(40) < 3500])
    want = band_response({"num_mel_bins": 40}, 8000)
    assert float(np.abs(diff - want).max()) < 0.3, np.round(diff - want, 2)
    assert float(want[mel_centers(40) > 4700].max()) < -10 and float(np.abs(want[mel_centers(40) < 3000]).max()) < 0.01
    with pytest.raises(ValueError, match="band rate"):
        band_response({"num_mel_bins": 40}, 16000)


@pytest.mark.parametrize("per", ["batch", "crop"])
def test_band_is_drawn_per_batch_or_per_crop_after_the_channel(per: str) -> None:
    fb = {"num_mel_bins": 40}
    ch = FbankChannelPerturb(normalize_channel_config({"band_prob": 0.5, "band_per": per}), fb)
    plain = FbankChannelPerturb(normalize_channel_config({}), fb)
    narrow = torch.from_numpy(band_response(fb, 8000)).float()
    counts = []
    for seed in range(40):
        torch.manual_seed(seed)
        c = ch.curves(8)
        torch.manual_seed(seed)
        base = plain.curves(8)  # the channel draws are those of a config without a band
        hit = (c - base - narrow).abs().amax(1) < 1e-5
        assert bool(torch.all(hit | ((c - base).abs().amax(1) < 1e-6)))  # each crop: band or nothing else
        counts.append(int(hit.sum()))
    if per == "batch":
        assert set(counts) == {0, 8}  # the whole batch or none of it
    else:
        assert len(set(counts)) > 3  # crops on their own
    assert 0.3 < sum(counts) / (8 * 40) < 0.7


def test_channel_config_defaults_and_errors() -> None:
    assert normalize_channel_config(None) is None
    assert normalize_channel_config({}) == {
        "prob": 1.0,
        "gain_db": 4.0,
        "shape_db": 2.0,
        "shape_terms": 4,
        "band_prob": 0.0,
        "band_rate": 8000,
        "band_per": "batch",
        "tilt_db": 2.0,
        "rolloff_prob": 0.0,
        "rolloff_hz": [2000.0, 6000.0],
        "rolloff_db": [6.0, 24.0],
        "eq_prob": 0.0,
        "eq_db": 3.0,
        "eq_terms": 8,
        "reverb_prob": 0.0,
        "reverb_rt60": [0.2, 0.8],
        "reverb_drr_db": [0.0, 15.0],
    }
    with pytest.raises(ConfigError, match=r"^conf/x\.yaml: train\.channel_perturb\.gain_db must be a number, got '4'"):
        normalize_channel_config({"gain_db": "4"}, source="conf/x.yaml")
    with pytest.raises(ConfigError, match="must be a mapping"):
        normalize_channel_config([4.0, 2.0])
    with pytest.raises(
        ConfigError, match=r"^conf/x\.yaml: train\.channel_perturb\.band_per must be batch \| crop, got 'utt'"
    ):
        normalize_channel_config({"band_per": "utt"}, source="conf/x.yaml")
    with pytest.raises(ConfigError, match=r"band_prob must be in \[0\.0, 1\.0\], got 2"):
        normalize_channel_config({"band_prob": 2})
    with pytest.raises(ConfigError, match=r"reverb_rt60 must be \[low, high\] with low <= high"):
        normalize_channel_config({"reverb_rt60": [0.8, 0.2]})
    with pytest.raises(ConfigError, match=r"reverb_rt60\[0\] must be"):
        normalize_channel_config({"reverb_rt60": [0.0, 0.5]})


def test_fbank_speed_config_errors_name_the_factor() -> None:
    base = {"model": {"name": "ecapa_tdnn"}, "loss": {"name": "ge2e"}}
    cfg = normalize_train_config({**base, "train": {"speed_perturb": [0.9, 1, 1.1]}}, "conf/x.yaml")
    assert cfg["train"]["speed_perturb"] == [0.9, 1.0, 1.1]
    for bad, msg in (
        ([0.9, 2.5], r"speed_perturb\[1\] must be in \[0\.5, 2\.0\], got 2\.5"),
        ("0.9", "speed_perturb must be null or a list"),
    ):
        with pytest.raises(ConfigError, match=r"^conf/x\.yaml: train\." + msg):
            normalize_train_config({**base, "train": {"speed_perturb": bad}}, "conf/x.yaml")


def test_channel_stats_separates_one_session_speakers_from_many(tmp_path) -> None:
    """The recipe's local/channel_stats.py, on arks written by kaldiio: speakers recorded each at
    their own level show a between-speaker spread far above the within-speaker one; speakers
    whose recordings vary in level as much inside a speaker as across speakers do not."""
    import importlib.util

    import kaldiio

    path = ROOT / "egs/speechocean762/spk1/local/channel_stats.py"
    spec = importlib.util.spec_from_file_location("channel_stats", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(0)
    for name, per_spk_level in (("one_session", True), ("many_sessions", False)):
        d = tmp_path / name
        d.mkdir()
        feats, utt2spk = {}, []
        for s in range(6):
            spk_level = 3.0 * s if per_spk_level else 0.0
            for u in range(5):
                level = spk_level if per_spk_level else 3.0 * rng.integers(0, 6)
                feats[f"s{s}-u{u}"] = (rng.standard_normal((40, 10)) * 0.1 + level).astype(np.float32)
                utt2spk.append(f"s{s}-u{u} s{s}\n")
        kaldiio.save_ark(str(d / "feats.ark"), feats, scp=str(d / "feats.scp"))
        (d / "utt2spk").write_text("".join(utt2spk))
        st = mod.channel_stats(d, d / "utt2spk")
        assert st["speakers"] == 6
        if per_spk_level:
            assert st["level_within"] < 0.05 and abs(st["level_between"] - 3.0 * np.std(np.arange(6))) < 0.05
        else:
            assert st["level_within"] > 2.0 and st["level_between"] < st["level_within"]


def test_channel_stats_session_pairs_recover_the_equaliser_between_sessions(tmp_path) -> None:
    """--session: two sessions of one speaker recorded through a known level and equaliser curve
    give back that level and that curve's peak-to-peak in dB; sessions of different speakers are
    not paired; --config's spread of two crops' curves grows with the config's shape_db."""
    import importlib.util

    import kaldiio

    path = ROOT / "egs/speechocean762/spk1/local/channel_stats.py"
    spec = importlib.util.spec_from_file_location("channel_stats", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(0)
    db = np.log(10) / 10
    curve = 6.0 * np.cos(np.pi * 3 * (np.arange(10) + 0.5) / 10)  # 12 dB peak to peak
    feats, utt2spk = {}, []
    for spk in ("a", "b"):
        voice = rng.standard_normal(10)
        for chapter, shift in (("1", 0.0), ("2", 4.0)):
            for u in range(3):
                utt = f"{spk}-{chapter}-{u}"
                x = voice + 0.01 * rng.standard_normal((30, 10)) + db * (shift + (curve if chapter == "2" else 0))
                feats[utt] = x.astype(np.float32)
                utt2spk.append(f"{utt} {spk}\n")
    d = tmp_path / "fbank" / "multi"
    d.mkdir(parents=True)
    kaldiio.save_ark(str(d / "feats.ark"), feats, scp=str(d / "feats.scp"))
    (d / "utt2spk").write_text("".join(utt2spk))
    pairs = mod.session_pairs(d, d / "utt2spk", re.compile(r"^([^-]+-[^-]+)-"))
    assert [(a, b) for a, b, _, _ in pairs] == [("a-1", "a-2"), ("b-1", "b-2")]
    for _, _, level, p2p in pairs:
        assert abs(level + 4.0) < 0.1 and abs(p2p - float(np.ptp(curve))) < 0.2
    cfgs = []
    for shape in (1.0, 2.0):
        cfg = tmp_path / f"shape{shape}.yaml"
        cfg.write_text(
            "model: {name: ecapa_tdnn}\nloss: {name: ge2e_xs}\n"
            f"train: {{channel_perturb: {{gain_db: 4.0, shape_db: {shape}, band_prob: 0.5}}}}\n"
        )
        cfgs.append(mod.curve_spread(cfg))
    (sd1, med1, p90_1), (sd2, med2, p90_2) = cfgs
    assert abs(sd1 - 4.0 * np.sqrt(2)) < 0.3 and abs(sd2 - sd1) < 1e-9  # the level of two crops: sqrt(2) x 4 dB
    assert 1.8 < med2 / med1 < 2.2 and med1 < p90_1  # the band is left out: shape scales with shape_db


def test_narrowband_copy_reads_a_data_dir_through_an_8khz_channel(tmp_path) -> None:
    """The recipe's local/narrowband_copy.py on a real FLAC data dir: every file copied, wav.scp
    entries become ffmpeg pipes (the pinned imageio-ffmpeg) that spkflow.data.audio reads at 8 kHz,
    with the 6 kHz tone gone and the 1 kHz tone kept; a pipe entry is chained, not replaced."""
    import subprocess
    import sys

    import soundfile as sf

    from spkflow.data.audio import read_audio

    recipe = ROOT / "egs/speechocean762/spk1"
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    t = np.arange(16000) / 16000.0
    sf.write(tmp_path / "a.flac", 0.3 * np.sin(2 * np.pi * 1000 * t) + 0.3 * np.sin(2 * np.pi * 6000 * t), 16000)
    (src / "wav.scp").write_text(f"u1 {tmp_path / 'a.flac'}\nu2 cat {tmp_path / 'a.flac'} |\n")
    (src / "utt2spk").write_text("u1 s1\nu2 s1\n")
    (src / "trials").write_text("u1 u2 target\n")
    subprocess.run([sys.executable, str(recipe / "local/narrowband_copy.py"), str(src), str(dst)], check=True)
    assert sorted(p.name for p in dst.iterdir()) == ["trials", "utt2spk", "wav.scp"]
    assert (dst / "trials").read_text() == "u1 u2 target\n"
    for line in (dst / "wav.scp").read_text().splitlines():
        utt, spec = line.split(maxsplit=1)
        assert spec.endswith("-ar 8000 - |") and ("cat " in spec) == (utt == "u2")
        x, sr = read_audio(spec, utt, table=True)
        assert sr == 8000 and abs(len(x) - 8000) < 100
        mag, freqs = np.abs(np.fft.rfft(x[1000:7000])), np.fft.rfftfreq(6000, 1 / 8000)
        at_1k, at_2k = (float(mag[np.abs(freqs - f) < 30].max()) for f in (1000, 2000))
        assert at_1k > 100 * at_2k  # 1 kHz kept; 6 kHz filtered out, not aliased to 2 kHz
    missing = subprocess.run(
        [sys.executable, str(recipe / "local/narrowband_copy.py"), str(tmp_path / "none"), str(dst)],
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "none/wav.scp not found" in missing.stderr


def test_session_eer_splits_target_trials_by_session(tmp_path) -> None:
    """local/session_eer.py on a scores file where only the trials across one speaker's two
    sessions score low: the EER across sessions is higher than over all trials, and the misses
    at the threshold name that session pair; a line of the wrong shape names file and line."""
    import subprocess
    import sys

    recipe = ROOT / "egs/speechocean762/spk1"
    utts = [f"{s}-{c}-{i}" for s, cs in (("a", "1 2"), ("b", "3 4")) for c in cs.split() for i in range(2)]
    lines = []
    rng = np.random.default_rng(0)
    for i, x in enumerate(utts):
        for y in utts[i + 1 :]:
            same_spk, same_ses = x[0] == y[0], x[:3] == y[:3]
            score = 0.9 if same_ses else (0.3 if same_spk and x[0] == "a" else (0.8 if same_spk else 0.5))
            lines.append(f"{x} {y} {score + 0.01 * rng.standard_normal():.4f} {'target' if same_spk else 'nontarget'}")
    (tmp_path / "scores").write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        [sys.executable, str(recipe / "local/session_eer.py"), "--session", r"^(\w-\d)-", str(tmp_path / "scores")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    eer_all, eer_cross = (float(v) for v in re.search(r"EER ([\d.]+)%.*across sessions ([\d.]+)%", out).groups())
    assert "(12 target trials)" in out and "(8 target trials)" in out  # 4 within sessions, 8 across
    assert eer_cross > eer_all > 0
    assert "a-1 ~ a-2 4" in out and "b-3 ~ b-4" not in out
    (tmp_path / "bad").write_text("x y 0.5 target\nx z oops\n")
    bad = subprocess.run(
        [sys.executable, str(recipe / "local/session_eer.py"), "--session", "^(x)", str(tmp_path / "bad")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and f"{tmp_path / 'bad'}:2:" in bad.stderr
