"""Augmentation of log-mel filterbank crops: speed (one factor per speaker of an N x M batch) and
channel (one random recording channel per crop).

What it guarantees
------------------
* Speed perturbation by a factor f (Kaldi's ``sox speed f``: f > 1 faster and higher) shortens
  the signal by 1/f and scales every frequency by f.  On log-mel frames this is done as two
  linear maps: frame ``i`` of the output is the input at (fractional) frame ``i * f``, and mel
  bin ``k`` (centre frequency ``c_k``) is the input at frequency ``c_k / f``, interpolated
  between the neighbouring bins on the mel scale (bins outside the input range take the edge
  bin).  The bin centres are Kaldi's (``FbankOptions``: low/high frequency, number of bins);
  an energy column (``use_energy``) is only time-stretched.
* All M crops of a speaker get the same factor, so a perturbed speaker is a consistent new
  voice for a GE2E batch (Kaldi/ESPnet recipes add perturbed copies as new speakers, e.g.
  ``sp0.9-spk``); ``factor_index`` lets a classification loss use ``label + index * S`` as a
  new class.  Factors are drawn from the global torch generator, which the trainer seeds per
  batch, so a batch is reproducible and resume-safe.
* Input crops of ``T_read`` frames become ``floor(T_read / max_factor)`` frames for every
  factor (no padding, no wrap-around): :meth:`read_frames` says how long to read.
* Channel perturbation gives every crop, independently of the other crops of its speaker, a
  random recording channel: a level change plus a smooth equaliser curve.  A linear filter
  multiplies the power spectrum, so on log-mel frames its effect is a curve *added* to every
  frame (exact where the filter is flat across a mel band, which a smooth curve is).  The curve
  is ``gain + sum_k c_k cos(pi k (j + 0.5) / B)`` over the B mel bins ``j`` (bins are equally
  spaced in mel), with ``gain ~ N(0, gain_db)``, ``c_1 ~ N(0, tilt_db)`` (the spectral tilt;
  ``shape_db`` unless set) and ``c_k ~ N(0, shape_db)`` for ``k = 2..shape_terms``, in dB of
  power (Kaldi's fbank is the natural log of power: 1 dB adds ``ln(10) / 10``).  An energy
  column gets the gain only.  Draws come from the global torch generator, like the speed
  factors, so a batch is reproducible and resume-safe.
* A narrow channel (``band_prob``): a share of the batches (or of the crops) look as if recorded
  at ``band_rate`` (8 kHz: telephone, FSDD) and read at the features' rate.  Its curve,
  :func:`band_response`, is the power response of the resampler stage 2 itself uses, averaged
  over each mel filter: it matches resampled 8 kHz white noise through Kaldi fbank to 0.3 (natural
  log units) in every bin, stopband included (-14 to -16), where a fixed mask or cut-off would
  not.  Drawn after the channel, so configs without it draw as before.
* A high-frequency roll-off (``rolloff_prob``): a share of the crops is flat up to a corner
  frequency (log-uniform in ``rolloff_hz``) and falls by a slope (uniform in ``rolloff_db``, dB
  per octave of mel-bin centre frequency) above it: a dull microphone, distance, a lossy codec
  (audiomentations' ``LowPassFilter`` on waveforms).  Drawn after the band, for the same reason.
* A strong equaliser (``eq_prob``): a share of the crops gets a second curve on top of the
  channel's, ``eq_terms`` cosine terms of sd ``eq_db`` and no level: peaks and dips of 20 dB and
  more across the band, as audiomentations' ``SevenBandParametricEQ`` (seven bands of +-12 dB)
  gives a waveform.  The channel curve models the spread of one-session corpora; this one a
  recording made with another microphone in another room, on a few crops only.  Drawn after the
  roll-off, for the same reason.
* A room (``reverb_prob``): a share of the crops gets a reverberant tail, :func:`reverberate`, on
  the power of the frames before the curve is added: an exponentially decaying tail (reverberation
  time uniform in ``reverb_rt60``) at a direct-to-reverberant ratio uniform in ``reverb_drr_db``,
  the statistical room model behind simulated RIRs, applied frame by frame in the power domain
  instead of by convolving waveforms with an RIR and recomputing fbank.  Within a mel band a
  reverberant tail longer than a frame adds power from the past frames, which is what this models;
  reflections shorter than a frame colour the spectrum, which the curve models.  The energy column
  (total power) is reverberated like a band.  Drawn last.

Why channel perturbation: in corpora where each speaker was recorded in one session
(speechocean762, DSPSpeech-20, FSDD), level and microphone colour are as constant per speaker as
the voice, and a model trained on one of them learns them as the voice; a speaker recorded
over several sessions (LibriSpeech chapters, VoxCeleb videos) then looks like several speakers.
Giving the M crops of a speaker different channels makes the loss pay for that
(egs/speechocean762/spk1/journal/, "Channel" and "Telephone band", has the measurements).

Compared with the anchors: Kaldi's ``utils/data/perturb_data_dir_speed.sh`` (used by ESPnet and
WeSpeaker) perturbs speed with sox on the waveform; ESPnet's ``espnet2.layers.augmentation``
and audiomentations' ``SevenBandParametricEQ`` equalise waveforms with biquads.  Here both act on
feature crops (the ark loader's, or the raw loader's fbank), in the trainer: no extra data dirs,
no 3x feature extraction, no per-crop filtering or fbank.  The price is an approximation for
speed (the mel filterbank is applied before the warp instead of after): on speechocean762, the
mean log-mel spectrum of a feature-warped utterance is 2-3x closer to the sox-style perturbed
one than the unperturbed spectrum is (measured in the TRAIN helper's experiments, reported with
the demo); an equaliser curve as smooth as the one here has no such approximation beyond the
mel smoothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from spkflow.core.checks import check_choice, check_keys, check_range, check_value
from spkflow.data.resample import polyphase_filter
from spkflow.features.fbank import FbankOptions, mel_matrix

__all__ = [
    "BAND_PER",
    "CHANNEL_DEFAULTS",
    "FbankChannelPerturb",
    "FbankSpeedPerturb",
    "band_response",
    "mel_centers",
    "normalize_channel_config",
    "reverberate",
]


def _mel(f: np.ndarray) -> np.ndarray:
    return 1127.0 * np.log(1.0 + f / 700.0)


def _inv_mel(m: np.ndarray) -> np.ndarray:
    return 700.0 * (np.exp(m / 1127.0) - 1.0)


def mel_centers(
    num_mel_bins: int, sample_frequency: float = 16000.0, low_freq: float = 20.0, high_freq: float = 0.0
) -> np.ndarray:
    """Centre frequencies (Hz) of Kaldi's triangular mel filters."""
    nyquist = 0.5 * float(sample_frequency)
    high = float(high_freq) if high_freq > 0 else nyquist + float(high_freq)
    lo, hi = _mel(np.float64(low_freq)), _mel(np.float64(high))
    delta = (hi - lo) / (num_mel_bins + 1)
    return _inv_mel(lo + (np.arange(num_mel_bins) + 1) * delta)


def _fbank_centers(fbank: Mapping[str, Any]) -> np.ndarray:
    """:func:`mel_centers` of a ``frontend.fbank`` dict (Kaldi's defaults for absent keys)."""
    return mel_centers(
        _fbank_layout(fbank)[0],
        fbank.get("sample_frequency", 16000.0),
        fbank.get("low_freq", 20.0),
        fbank.get("high_freq", 0.0),
    )


def _fbank_layout(fbank: Mapping[str, Any]) -> tuple[int, bool, bool]:
    """(mel bins, energy column?, energy column last?) of a ``frontend.fbank`` dict."""
    return (
        int(fbank.get("num_mel_bins", 80)),
        bool(fbank.get("use_energy", False)),
        bool(fbank.get("htk_compat", False)),
    )


class FbankSpeedPerturb:
    """Feature-domain speed perturbation (see the module docstring).

    ``fbank`` is the ``frontend.fbank`` dict of the config (``FbankOptions`` fields); the
    feature dimension is ``num_mel_bins`` (+1 with ``use_energy``).
    """

    def __init__(self, factors: Sequence[float], fbank: Mapping[str, Any]) -> None:
        self.factors = [float(f) for f in factors]
        if not self.factors or any(not 0.5 <= f <= 2.0 for f in self.factors):
            raise ValueError(f"speed factors must lie in [0.5, 2], got {list(factors)}")
        self.max_factor = max(self.factors)
        bins, self.energy, self.energy_last = _fbank_layout(fbank)
        self.dim = bins + int(self.energy)
        c = _fbank_centers(fbank)
        mc = _mel(c)
        self._freq: list[torch.Tensor] = []
        for f in self.factors:
            pos = np.interp(_mel(c / f), mc, np.arange(bins))  # clamps outside the bin range
            w = np.zeros((bins, bins), dtype=np.float64)
            lo = np.floor(pos).astype(int)
            hi = np.minimum(lo + 1, bins - 1)
            frac = pos - lo
            np.add.at(w, (lo, np.arange(bins)), 1.0 - frac)
            np.add.at(w, (hi, np.arange(bins)), frac)
            self._freq.append(torch.from_numpy(w).float())  # out = x @ w

    def read_frames(self, frames: int) -> int:
        """Frames to read so that the output has at least ``frames`` frames."""
        return int(math.ceil(frames * self.max_factor - 1e-9))

    def out_frames(self, read: int) -> int:
        return max(1, int(math.floor(read / self.max_factor + 1e-9)))

    def _time(self, f: float, t_in: int, t_out: int) -> torch.Tensor:
        pos = np.minimum(np.arange(t_out) * f, t_in - 1)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, t_in - 1)
        frac = pos - lo
        a = np.zeros((t_out, t_in), dtype=np.float64)
        np.add.at(a, (np.arange(t_out), lo), 1.0 - frac)
        np.add.at(a, (np.arange(t_out), hi), frac)
        return torch.from_numpy(a).float()

    def __call__(self, x: torch.Tensor, num_utt: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [N*M, T_read, F]`` speaker-major -> (``[N*M, T_out, F]``, factor index per speaker ``[N]``)."""
        b, t_in, d = x.shape
        if d != self.dim:
            raise ValueError(f"speed perturbation set up for {self.dim}-dim features, got {d}")
        if b % num_utt:
            raise ValueError(f"{b} crops are not a multiple of M={num_utt}")
        n = b // num_utt
        idx = torch.randint(len(self.factors), (n,))
        t_out = self.out_frames(t_in)
        out = x.new_empty(b, t_out, d)
        per_crop = idx.repeat_interleave(num_utt).to(x.device)
        for k, f in enumerate(self.factors):
            sel = (per_crop == k).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            a = self._time(f, t_in, t_out).to(x.device, x.dtype)
            y = torch.einsum("ot,btd->bod", a, x[sel])
            w = self._freq[k].to(x.device, x.dtype)
            if self.energy:
                e, m = (y[..., -1:], y[..., :-1]) if self.energy_last else (y[..., :1], y[..., 1:])
                m = m @ w
                y = torch.cat([m, e], -1) if self.energy_last else torch.cat([e, m], -1)
            else:
                y = y @ w
            out[sel] = y
        return out, idx


CHANNEL_DEFAULTS: dict[str, float | int | str | list[float] | None] = {
    "prob": 1.0,  # share of crops that get a channel (the others are left as read)
    "gain_db": 4.0,  # standard deviation of the level change, dB
    "shape_db": 2.0,  # standard deviation of each cosine term of the equaliser curve, dB
    "shape_terms": 4,  # cosine terms of the curve (0: level only)
    "tilt_db": None,  # standard deviation of the first term (the spectral tilt), dB; null: shape_db
    "band_prob": 0.0,  # share of batches (or crops, band_per) read through a band_rate channel
    "band_rate": 8000,  # the narrow channel's sample rate (Hz): nothing above band_rate / 2
    "band_per": "batch",  # batch: all crops of a batch or none | crop: each crop on its own
    "rolloff_prob": 0.0,  # share of crops whose highs roll off (a dull microphone, distance, a lossy codec)
    "rolloff_hz": [2000.0, 6000.0],  # corner frequency, drawn log-uniformly (uniform in octaves)
    "rolloff_db": [6.0, 24.0],  # slope above the corner, dB per octave, drawn uniformly
    "eq_prob": 0.0,  # share of crops through a second, strong equaliser (a very different microphone)
    "eq_db": 3.0,  # standard deviation of each of its cosine terms, dB (no level term)
    "eq_terms": 8,  # its cosine terms: wavier than the channel curve's
    "reverb_prob": 0.0,  # share of crops heard in a room (an exponentially decaying reverberant tail)
    "reverb_rt60": [0.2, 0.8],  # the room's reverberation time (s, 60 dB of decay), drawn uniformly
    "reverb_drr_db": [0.0, 15.0],  # direct-to-reverberant energy ratio, dB, drawn uniformly
}
BAND_PER = ("batch", "crop")
_NAT_PER_DB = math.log(10.0) / 10.0  # dB of power -> the features' natural-log units


def band_response(fbank: Mapping[str, Any], rate: int) -> np.ndarray:
    """``[num_mel_bins]`` log-power response (natural log, the features' units) of audio recorded
    at ``rate`` and read at the features' sample rate: the power response of the resampler's own
    low-pass (:func:`spkflow.data.resample.resample`, one pass) averaged over each Kaldi mel filter for a
    flat spectrum.  Zero below ~0.45 ``rate``, the filter's stopband (-13 to -16) above ``rate / 2``."""
    from scipy.signal import freqz

    opts = FbankOptions.from_dict(dict(fbank))
    fs = int(opts.sample_frequency)
    if not 0 < rate < fs:
        raise ValueError(f"band rate must be in (0, {fs}) Hz for {fs} Hz features, got {rate}")
    g = math.gcd(fs, int(rate))
    up, down = int(rate) // g, fs // g
    h = polyphase_filter(up, down)  # designed at fs * up Hz, cut off at rate / 2
    freqs = fs / opts.padded_window_size * np.arange(opts.padded_window_size // 2 + 1)
    _, resp = freqz(h, worN=freqs, fs=fs * up)
    power = np.abs(resp / resp[0]) ** 2
    mel = mel_matrix(opts)  # [fft bins, mel bins]
    return np.log(np.maximum((mel * power[:, None]).sum(0) / mel.sum(0), 1e-30))


def normalize_channel_config(value: Any, key: str = "train.channel_perturb", source: str = "config") -> dict | None:
    """``null`` (off) or a mapping of :data:`CHANNEL_DEFAULTS` keys; returns it with defaults filled
    in.  Raises :class:`spkflow.core.checks.ConfigError` naming ``source`` and the dotted key."""

    if value is None:
        return None
    check_keys(key, value, CHANNEL_DEFAULTS, source)
    out = dict(CHANNEL_DEFAULTS)
    out.update(value)
    for name, hi in (("prob", 1.0), ("gain_db", None), ("shape_db", None), ("band_prob", 1.0)):
        check_value(source, f"{key}.{name}", out[name], "number", 0.0, hi)
        out[name] = float(out[name])
    check_value(source, f"{key}.shape_terms", out["shape_terms"], "int", 0)
    if out["tilt_db"] is None:
        out["tilt_db"] = out["shape_db"]
    check_value(source, f"{key}.tilt_db", out["tilt_db"], "number", 0.0)
    out["tilt_db"] = float(out["tilt_db"])
    check_value(source, f"{key}.band_rate", out["band_rate"], "int", 1000)
    check_choice(source, f"{key}.band_per", out["band_per"], BAND_PER)
    check_value(source, f"{key}.rolloff_prob", out["rolloff_prob"], "number", 0.0, 1.0)
    out["rolloff_prob"] = float(out["rolloff_prob"])
    out["rolloff_hz"] = check_range(source, f"{key}.rolloff_hz", out["rolloff_hz"], 1.0)
    out["rolloff_db"] = check_range(source, f"{key}.rolloff_db", out["rolloff_db"], 0.0)
    for name, hi in (("eq_prob", 1.0), ("eq_db", None)):
        check_value(source, f"{key}.{name}", out[name], "number", 0.0, hi)
        out[name] = float(out[name])
    check_value(source, f"{key}.eq_terms", out["eq_terms"], "int", 1)
    check_value(source, f"{key}.reverb_prob", out["reverb_prob"], "number", 0.0, 1.0)
    out["reverb_prob"] = float(out["reverb_prob"])
    out["reverb_rt60"] = check_range(source, f"{key}.reverb_rt60", out["reverb_rt60"], 0.01)
    out["reverb_drr_db"] = check_range(source, f"{key}.reverb_drr_db", out["reverb_drr_db"])
    return out


class FbankChannelPerturb:
    """Feature-domain channel perturbation (see the module docstring): ``x [B, T, F] -> x + curve``,
    one random curve per crop.  ``cfg`` is :func:`normalize_channel_config`'s output, ``fbank``
    the ``frontend.fbank`` dict of the config."""

    def __init__(self, cfg: Mapping[str, Any], fbank: Mapping[str, Any]) -> None:
        self.prob = float(cfg["prob"])
        self.band_prob, self.band_per = float(cfg["band_prob"]), str(cfg["band_per"])
        terms = int(cfg["shape_terms"])
        sd = [float(cfg["gain_db"])] + [float(cfg["tilt_db"])] * min(terms, 1) + [float(cfg["shape_db"])] * (terms - 1)
        self.sd_db = torch.tensor(sd)
        bins, self.energy, self.energy_last = _fbank_layout(fbank)
        self.dim = bins + int(self.energy)
        pos = (torch.arange(bins, dtype=torch.float64) + 0.5) / bins
        k = torch.arange(terms + 1, dtype=torch.float64)
        self.basis = torch.cos(math.pi * k[:, None] * pos[None, :]).float()  # [K+1, bins]; row 0 = level
        level = torch.zeros(len(k), 1)
        level[0] = 1.0
        self.basis = self._with_energy(self.basis, level)  # the energy column moves with the level only
        self.band = None
        if self.band_prob > 0:  # the energy column keeps its value (speech energy lies below 4 kHz)
            band = torch.from_numpy(band_response(fbank, int(cfg["band_rate"]))).float()
            self.band = self._with_energy(band, torch.zeros(1))
        self.rolloff_prob = float(cfg["rolloff_prob"])
        self.rolloff_oct = tuple(math.log2(float(f)) for f in cfg["rolloff_hz"])  # corner range, octaves
        self.rolloff_db = tuple(float(v) for v in cfg["rolloff_db"])
        self.octaves = torch.from_numpy(np.log2(_fbank_centers(fbank))).float()  # [bins]
        self.eq_prob, self.eq_db = float(cfg["eq_prob"]), float(cfg["eq_db"])
        k = torch.arange(1, int(cfg["eq_terms"]) + 1, dtype=torch.float64)
        eq = torch.cos(math.pi * k[:, None] * pos[None, :]).float()  # [terms, bins], no level row
        self.eq_basis = self._with_energy(eq, torch.zeros(len(k), 1))  # the energy column keeps its value
        self.reverb_prob = float(cfg["reverb_prob"])
        self.reverb_rt60 = tuple(float(v) for v in cfg["reverb_rt60"])
        self.reverb_drr_db = tuple(float(v) for v in cfg["reverb_drr_db"])
        self.frame_shift = float(fbank.get("frame_shift", 10.0)) / 1000.0  # s

    def _with_energy(self, mel: torch.Tensor, energy: torch.Tensor) -> torch.Tensor:
        """``mel`` (mel bins last) with the energy column's values put where the features have it."""
        if not self.energy:
            return mel
        return torch.cat([mel, energy] if self.energy_last else [energy, mel], -1)

    def curve(self, coef_db: torch.Tensor) -> torch.Tensor:
        """``[n, K+1]`` coefficients in dB (level first, then the cosine terms) -> ``[n, F]`` curves
        in the features' units."""
        return (coef_db.float() * _NAT_PER_DB) @ self.basis

    def curves(self, n: int, band_per: str | None = None) -> torch.Tensor:
        """``[n, F]`` random channel curves (zero for the crops the probability leaves out), plus
        the narrow band's response for the crops (or the whole batch) drawn for it; ``band_per``
        overrides the config's ``band_per`` for this draw."""
        coef = torch.randn(n, len(self.sd_db)) * self.sd_db
        out = self.curve(coef * (torch.rand(n, 1) < self.prob))
        if self.band is not None:  # drawn after the channel: configs without a band draw as before
            narrow = torch.rand(1 if (band_per or self.band_per) == "batch" else n, 1) < self.band_prob
            out = out + narrow * self.band
        if self.rolloff_prob > 0:  # drawn last, for the same reason
            dull = torch.rand(n, 1) < self.rolloff_prob
            lo, hi = self.rolloff_oct
            corner = lo + (hi - lo) * torch.rand(n, 1)
            slope = self.rolloff_db[0] + (self.rolloff_db[1] - self.rolloff_db[0]) * torch.rand(n, 1)
            db = -slope * (self.octaves[None, :] - corner).clamp(min=0.0)
            out = out + dull * self._with_energy(db * _NAT_PER_DB, torch.zeros(n, 1))
        if self.eq_prob > 0:  # drawn after the roll-off, for the same reason
            strong = torch.rand(n, 1) < self.eq_prob
            coef = torch.randn(n, self.eq_basis.shape[0]) * self.eq_db
            out = out + strong * ((coef * _NAT_PER_DB) @ self.eq_basis)
        return out

    def curve_moments(self, n: int = 65536, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Per-dimension mean and variance ``[F]`` (float64) of the additive curves over ``n``
        draws (level, equaliser, band, roll-off; the room is not additive and is left out), drawn
        inside a forked RNG so the caller's random stream is untouched.  Features ``x`` and
        curves ``c`` are independent, so ``x + c`` has mean ``E[x] + E[c]`` and variance
        ``Var[x] + Var[c]``: what ``train.input_stats_augmented`` adds to the input statistics.
        One crop's curve has the same distribution whether the band is drawn per crop or per
        batch, so the draws here take it per crop (one batch of ``n`` would be all band or none)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            c = self.curves(n, band_per="crop").double()
        return c.mean(0).numpy(), c.var(0).numpy()

    def rooms(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per crop: the reverberant tail's decay per frame ``a`` (power) and its energy ``r``
        relative to the direct sound, both ``[n]``; ``r = 0`` for the crops left dry."""
        wet = torch.rand(n) < self.reverb_prob
        lo, hi = self.reverb_rt60
        rt60 = lo + (hi - lo) * torch.rand(n)
        lo, hi = self.reverb_drr_db
        drr = lo + (hi - lo) * torch.rand(n)
        decay = 10.0 ** (-6.0 * self.frame_shift / rt60)  # 60 dB of power over rt60 seconds
        return decay, wet * 10.0 ** (-drr / 10.0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"channel perturbation set up for {self.dim}-dim features, got {x.shape[-1]}")
        curves = self.curves(x.shape[0])
        if self.reverb_prob > 0:  # drawn after the curves, so configs without it draw as before
            decay, ratio = self.rooms(x.shape[0])
            x = reverberate(x, decay, ratio)
        return x + curves.to(x.device, x.dtype)[:, None, :]


def reverberate(x: torch.Tensor, decay: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """Log-power frames ``x [B, T, F]`` heard in a room: each crop's power plus an exponentially
    decaying tail of its past frames (Polack's statistical room model: ``ratio[b]`` of the direct
    energy, falling by ``decay[b]`` per frame), renormalised to the crop's dry energy.

    The tail of frame ``t`` is ``s[t] = decay * s[t-1] + ratio * (1 - decay) * P[t]``; before the
    crop the signal is taken as stationary at the crop's mean power (``s[-1] = ratio * mean``), so
    its first frames are as reverberant as the rest.  One decay for every band (a real room's
    highs die faster), no early reflections (those colour the spectrum: the curve's business); it
    holds where the room's energy envelope is smooth across a mel band and a frame
    (``test_augment_fbank.py`` compares it with fbank of reverberated audio).  Crops with
    ``ratio == 0`` are returned unchanged."""
    wet = (ratio > 0).nonzero(as_tuple=True)[0]
    if wet.numel() == 0:
        return x
    p = x[wet].double().exp()  # [b, T, F] power
    a, r = decay[wet].to(p)[:, None], ratio[wet].to(p)[:, None]  # [b, 1]
    g = r * (1.0 - a)
    tail = r * p.mean(1)
    out = torch.empty_like(p)
    for t in range(p.shape[1]):
        tail = a * tail + g * p[:, t]
        out[:, t] = p[:, t] + tail
    out = out / (1.0 + r)[:, :, None]  # the level is the gain's business
    y = x.clone()
    y[wet] = out.log().to(x.dtype)
    return y
