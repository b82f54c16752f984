"""Kaldi-compatible log-mel filterbank features, and the frontend that training crops see.

What it guarantees
------------------
* :func:`compute_fbank` on a float waveform in [-1, 1] equals Kaldi's ``compute-fbank-feats``
  on the same samples as 16-bit integers (that is ``torchaudio.compliance.kaldi.fbank`` on the
  waveform scaled by 32768) with the same options, within 1e-3 max abs on the log scale
  (``test/features/test_features.py`` checks 16 kHz audio and the 8 kHz -> 16 kHz path).  Audio at another
  rate is first resampled to ``--sample-frequency`` with :func:`spkflow.data.resample.resample`.
* A waveform shorter than one frame raises ``ValueError`` (the job turns it into an
  :class:`~spkflow.core.errors.UtteranceError` naming the utterance) instead of Kaldi's empty matrix.
* **Memory bounded by the output, not the frame matrix**: frames are windowed and transformed
  :data:`CHUNK_FRAMES` at a time (a 10-minute clip's float64 frames and spectra at once took
  0.8 GB), with the very bits of the one-piece computation (``test_features.py``).
* :func:`apply_frontend` is the single definition of "what the model sees" for a whole
  utterance (voiced-frame selection, per-utterance mean normalisation); the training loader
  (:mod:`spkflow.train.loader`) applies the same definition to crops.

Why our own numpy implementation in float64 (accuracy and speed against torchaudio,
Kaldi and kaldi-native-fbank, measured with ``test/bench/bench_fbank.py``): docs/features.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from spkflow.core.kaldi_opts import read_kaldi_options, to_kaldi_lines
from spkflow.data.resample import resample
from spkflow.data.voiced import voiced_frames
from spkflow.features.vad import VadOptions, compute_vad, frame_log_energy  # re-exported: the API map names them here

__all__ = [
    "FbankOptions",
    "compute_fbank",
    "check_resample_rate",
    "num_frames",
    "mel_matrix",
    "window",
    "VadOptions",
    "compute_vad",
    "frame_log_energy",
    "apply_frontend",
    "wave_frontend",
    "select_voiced",
]

_EPS = float(np.finfo(np.float32).eps)  # Kaldi's floor on filterbank energies (std::numeric_limits<float>::epsilon())
_WINDOWS = ("povey", "hamming", "hanning", "rectangular", "blackman")
# Kaldi options we accept in a config file and ignore (they do not change the values).
_IGNORED = frozenset({"verbose", "allow-downsample", "allow-upsample", "debug-mel", "print-args"})


@dataclass(frozen=True)
class FbankOptions:
    """Options of Kaldi's ``compute-fbank-feats`` (same names with underscores).

    Defaults are the project's extraction defaults, which differ from Kaldi's in
    ``num_mel_bins`` (80, Kaldi 23) and ``dither`` (0: features are reproducible; Kaldi 1.0).
    """

    sample_frequency: float = 16000.0
    frame_length: float = 25.0  # ms
    frame_shift: float = 10.0  # ms
    num_mel_bins: int = 80
    low_freq: float = 20.0
    high_freq: float = 0.0  # <= 0: offset from Nyquist
    dither: float = 0.0
    preemphasis_coefficient: float = 0.97
    remove_dc_offset: bool = True
    window_type: str = "povey"
    blackman_coeff: float = 0.42
    round_to_power_of_two: bool = True
    snip_edges: bool = True
    use_energy: bool = False
    raw_energy: bool = True
    energy_floor: float = 0.0
    htk_compat: bool = False
    use_log_fbank: bool = True
    use_power: bool = True

    def __post_init__(self) -> None:
        if self.window_type not in _WINDOWS:
            raise ValueError(f"window-type must be one of {', '.join(_WINDOWS)}, got '{self.window_type}'")
        if self.sample_frequency <= 0 or self.sample_frequency != int(self.sample_frequency):
            raise ValueError(f"sample-frequency must be a positive whole number of Hz, got {self.sample_frequency}")
        if self.num_mel_bins <= 3:
            raise ValueError(f"num-mel-bins must be > 3, got {self.num_mel_bins}")
        if self.window_shift < 1:
            raise ValueError(f"frame-shift {self.frame_shift} ms is less than one sample")
        if self.window_size < 2:
            raise ValueError(f"frame-length {self.frame_length} ms is less than two samples")
        if self.padded_window_size % 2:
            raise ValueError(
                "the padded window size must be even: use --round-to-power-of-two=true or change --frame-length"
            )
        if not 0.0 <= self.preemphasis_coefficient <= 1.0:
            raise ValueError(f"preemphasis-coefficient must be in [0, 1], got {self.preemphasis_coefficient}")
        nyquist = 0.5 * self.sample_frequency
        high = self.high_freq if self.high_freq > 0 else nyquist + self.high_freq
        if not (0.0 <= self.low_freq < nyquist and 0.0 < high <= nyquist and self.low_freq < high):
            raise ValueError(f"bad low-freq {self.low_freq} / high-freq {self.high_freq} for Nyquist {nyquist}")

    # Derived sizes, computed the way Kaldi (and torchaudio) round them.
    @property
    def window_shift(self) -> int:
        return int(self.sample_frequency * self.frame_shift * 0.001)

    @property
    def window_size(self) -> int:
        return int(self.sample_frequency * self.frame_length * 0.001)

    @property
    def padded_window_size(self) -> int:
        w = self.window_size
        return 1 << (w - 1).bit_length() if self.round_to_power_of_two else w

    @property
    def dim(self) -> int:
        """Feature dimension (mel bins, plus one for energy when ``use_energy``)."""
        return self.num_mel_bins + int(self.use_energy)

    @classmethod
    def from_kaldi_conf(cls, path: str | os.PathLike[str]) -> FbankOptions:
        """Read a Kaldi option file (``--num-mel-bins=80`` per line); starts from our defaults."""
        return read_kaldi_options(path, cls, ignore=_IGNORED)

    def to_kaldi_conf(self) -> str:
        """All options as Kaldi option-file text (round-trips through :meth:`from_kaldi_conf`)."""
        return to_kaldi_lines(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for ``config.yaml`` (the ``frontend.fbank`` section)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FbankOptions:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown fbank options: {', '.join(sorted(unknown))}")
        return cls(**d)


#: Resampling factors we accept (new rate / native rate).  Beyond them the audio is refused as
#: bad input: below 1/48 (e.g. > 768 kHz for 16 kHz features) or above 8 (native rate under
#: 2 kHz for 16 kHz features, no usable speech band) the file is almost surely mislabelled.
MIN_RESAMPLE_RATIO, MAX_RESAMPLE_RATIO = 1.0 / 48.0, 8.0


def check_resample_rate(native_rate: int | float, target_rate: int | float) -> None:
    """Raise ``ValueError`` when audio at ``native_rate`` cannot (or should not) be resampled
    to ``target_rate``: a non-positive or non-integer rate, or a factor outside
    [:data:`MIN_RESAMPLE_RATIO`, :data:`MAX_RESAMPLE_RATIO`]."""
    if not native_rate or native_rate <= 0 or int(native_rate) != native_rate:
        raise ValueError(f"cannot resample audio with sample rate {native_rate!r} Hz")
    if int(native_rate) == int(target_rate):
        return
    ratio = float(target_rate) / float(native_rate)
    if not MIN_RESAMPLE_RATIO <= ratio <= MAX_RESAMPLE_RATIO:
        raise ValueError(
            f"cannot resample {int(native_rate)} Hz audio to {int(target_rate)} Hz: factor "
            f"{ratio:.4g} is outside [{MIN_RESAMPLE_RATIO:.4g}, {MAX_RESAMPLE_RATIO:g}] "
            "(is the sample rate in the file header right?)"
        )


def num_frames(num_samples: int, opts: FbankOptions) -> int:
    """Number of frames Kaldi produces for ``num_samples`` samples at ``opts.sample_frequency``."""
    shift, size = opts.window_shift, opts.window_size
    if opts.snip_edges:
        return 0 if num_samples < size else 1 + (num_samples - size) // shift
    return (num_samples + shift // 2) // shift


@functools.lru_cache(maxsize=16)
def window(opts: FbankOptions) -> np.ndarray:
    """Kaldi's analysis window of ``opts`` ([window_size] float64, read-only)."""
    n = opts.window_size
    i = np.arange(n, dtype=np.float64)
    a = 2.0 * math.pi / (n - 1)
    if opts.window_type == "hanning":
        w = 0.5 - 0.5 * np.cos(a * i)
    elif opts.window_type == "povey":
        w = (0.5 - 0.5 * np.cos(a * i)) ** 0.85
    elif opts.window_type == "hamming":
        w = 0.54 - 0.46 * np.cos(a * i)
    elif opts.window_type == "rectangular":
        w = np.ones(n)
    else:  # blackman
        b = opts.blackman_coeff
        w = b - 0.5 * np.cos(a * i) + (0.5 - b) * np.cos(2 * a * i)
    w.setflags(write=False)
    return w


def _mel(f: np.ndarray) -> np.ndarray:
    return 1127.0 * np.log(1.0 + f / 700.0)


@functools.lru_cache(maxsize=16)
def mel_matrix(opts: FbankOptions) -> np.ndarray:
    """Kaldi's triangular mel filters (MelBanks, no VTLN) as a [padded/2 + 1, num_mel_bins] matrix."""
    padded = opts.padded_window_size
    nyquist = 0.5 * opts.sample_frequency
    high = opts.high_freq if opts.high_freq > 0 else nyquist + opts.high_freq
    mel_low, mel_high = _mel(np.float64(opts.low_freq)), _mel(np.float64(high))
    delta = (mel_high - mel_low) / (opts.num_mel_bins + 1)
    b = np.arange(opts.num_mel_bins, dtype=np.float64)[:, None]
    left, center, right = mel_low + b * delta, mel_low + (b + 1) * delta, mel_low + (b + 2) * delta
    mel = _mel(opts.sample_frequency / padded * np.arange(padded // 2, dtype=np.float64))[None, :]
    weights = np.maximum(0.0, np.minimum((mel - left) / (center - left), (right - mel) / (right - center)))
    full = np.zeros((padded // 2 + 1, opts.num_mel_bins), dtype=np.float64)  # Nyquist bin has weight 0
    full[: padded // 2] = weights.T
    full.setflags(write=False)
    return full


@functools.lru_cache(maxsize=16)
def _mel_matrix32(opts: FbankOptions) -> np.ndarray:
    m = mel_matrix(opts).astype(np.float32)
    m.setflags(write=False)
    return m


#: frames windowed and transformed at a time: bounds the float64 frame matrix and its spectra
#: (~30 MB) whatever the length (a 10-minute clip's at once took 0.8 GB); the FFT of a row does not
#: depend on the rows beside it, and the mel product is made once over all frames' powers (float32,
#: 1 KB a frame), so every frame gets the bits it got in one piece (``test_features.py``).
CHUNK_FRAMES = 4096


def _frame_rows(x: np.ndarray, a: int, b: int, opts: FbankOptions) -> np.ndarray:
    """Frames ``a:b`` [b - a, window_size] as Kaldi's ExtractWindow cuts them (a copy)."""
    n, shift, size = len(x), opts.window_shift, opts.window_size
    if opts.snip_edges:
        frames = np.lib.stride_tricks.as_strided(x, (num_frames(n, opts), size), (x.strides[0] * shift, x.strides[0]))
        return frames[a:b].copy()
    idx = np.arange(a, b)[:, None] * shift + (shift // 2 - size // 2) + np.arange(size)[None, :]
    # Kaldi reflects around the edges, repeating the edge sample: -1 -> 0, n -> n-1.
    idx = np.where(idx < 0, -idx - 1, idx)
    idx = np.where(idx >= n, 2 * n - 1 - idx, idx)
    return x[np.clip(idx, 0, n - 1)]  # the clip only matters for signals shorter than half a window


class _FastFrames:
    """DC removal, pre-emphasis and window for ``snip_edges`` frames without dither, in two
    passes over the frame matrix: pre-emphasis is linear, so it is applied to the samples of a
    block of frames at once; per frame it then differs only by ``(1 - c) * frame_mean`` and in
    column 0.  The frame means come from one running sum over the whole signal."""

    def __init__(self, x: np.ndarray, m: int, opts: FbankOptions) -> None:
        size, c = opts.window_size, opts.preemphasis_coefficient
        self.x, self.opts = x, opts
        starts = np.arange(m) * opts.window_shift
        if opts.remove_dc_offset:
            csum = np.empty(len(x) + 1)
            csum[0] = 0.0
            np.cumsum(x, out=csum[1:])
            self.means = (csum[starts + size] - csum[starts]) / size
            del csum
        else:
            self.means = np.zeros(m)
        self.first = (x[starts] - self.means) * (1.0 - c)

    def rows(self, a: int, b: int) -> np.ndarray:
        opts = self.opts
        shift, size, c = opts.window_shift, opts.window_size, opts.preemphasis_coefficient
        lo, hi = a * shift, (b - 1) * shift + size
        pre = self.x[lo:hi].copy()
        if c != 0.0:
            pre[1:] -= c * self.x[lo : hi - 1]
        frames = np.lib.stride_tricks.as_strided(pre, (b - a, size), (pre.strides[0] * shift, pre.strides[0]))
        frames = frames - ((1.0 - c) * self.means[a:b])[:, None]
        frames[:, 0] = self.first[a:b]
        frames *= window(opts)
        return frames


def _power(frames: np.ndarray, opts: FbankOptions) -> np.ndarray:
    """Windowed frames [n, window_size] float64 -> power (or magnitude) spectra [n, bins] float32."""
    spec = np.fft.rfft(frames, n=opts.padded_window_size)
    power = spec.real * spec.real + spec.imag * spec.imag
    if not opts.use_power:
        power = np.sqrt(power)
    # The FFT needs float64 (cancellation); the mel sums of non-negative powers and the log do
    # not: float32 from here changes the output by < 1e-5 and saves a third of the time.
    return power.astype(np.float32)


def compute_fbank(
    wave: np.ndarray, sample_rate: int, opts: FbankOptions | None = None, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Log-mel filterbank [T, F] float32 of a mono float waveform in [-1, 1] at ``sample_rate``.

    The waveform is resampled to ``opts.sample_frequency`` when the rates differ and scaled to
    the 16-bit integer range, as Kaldi reads wav files.  ``rng`` draws the dither (only used
    when ``opts.dither != 0``; default: a fixed seed, so features are reproducible).
    Raises ``ValueError`` when the (resampled) waveform is shorter than one frame or its rate
    cannot be resampled (:func:`check_resample_rate`).  Computed in float64 (see the module doc),
    :data:`CHUNK_FRAMES` frames at a time.
    """
    opts = opts or FbankOptions()
    x = np.asarray(wave, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"expected a mono waveform, got shape {x.shape}")
    if int(sample_rate) != int(opts.sample_frequency):
        check_resample_rate(sample_rate, opts.sample_frequency)
        x = resample(np.asarray(wave, dtype=np.float32), int(sample_rate), int(opts.sample_frequency))
        x = np.asarray(x, dtype=np.float64)
    m = num_frames(len(x), opts)
    if m <= 0 or len(x) == 0:
        raise ValueError(
            f"{len(x)} samples at {int(opts.sample_frequency)} Hz is shorter than one "
            f"frame ({opts.window_size} samples)"
        )
    if isinstance(wave, np.ndarray) and np.shares_memory(x, wave):
        x = x * 32768.0
    else:  # our own float64 copy: scaled in place
        x *= 32768.0
    fast = _FastFrames(x, m, opts) if opts.snip_edges and opts.dither == 0.0 and not opts.use_energy else None
    if opts.dither != 0.0:
        rng = rng if rng is not None else np.random.default_rng(0)
    power = np.empty((m, opts.padded_window_size // 2 + 1), dtype=np.float32)
    energy = np.empty(m) if opts.use_energy else None
    for a in range(0, m, CHUNK_FRAMES):
        b = min(m, a + CHUNK_FRAMES)
        if fast is not None:
            frames = fast.rows(a, b)
        else:
            frames = _frame_rows(x, a, b, opts)
            if opts.dither != 0.0:
                assert rng is not None
                frames += opts.dither * rng.standard_normal(frames.shape)  # the draws of one piece, in order
            if opts.remove_dc_offset:
                frames -= frames.mean(axis=1, keepdims=True)
            if energy is not None and opts.raw_energy:
                energy[a:b] = np.einsum("ij,ij->i", frames, frames)
            if opts.preemphasis_coefficient != 0.0:
                c = opts.preemphasis_coefficient
                frames[:, 1:] -= c * frames[:, :-1].copy()
                frames[:, 0] *= 1.0 - c
            frames *= window(opts)
            if energy is not None and not opts.raw_energy:
                energy[a:b] = np.einsum("ij,ij->i", frames, frames)
        power[a:b] = _power(frames, opts)
    del fast, x
    mel = power @ _mel_matrix32(opts)
    del power
    if opts.use_log_fbank:
        mel = np.log(np.maximum(mel, np.float32(_EPS)))
    if energy is not None:
        log_e = np.log(np.maximum(energy, _EPS))
        if opts.energy_floor > 0.0:
            log_e = np.maximum(log_e, math.log(opts.energy_floor))
        log_e = log_e.astype(np.float32)[:, None]
        mel = np.concatenate([mel, log_e] if opts.htk_compat else [log_e, mel], axis=1)
    return np.ascontiguousarray(mel, dtype=np.float32)


def select_voiced(feats: np.ndarray, vad: np.ndarray | None) -> np.ndarray:
    """Frames where ``vad > 0.5``; all frames when there is no VAD or no voiced frame at all
    (an utterance is never dropped silently: a fully "silent" one keeps everything)."""
    if vad is None:
        return feats
    if len(vad) != len(feats):
        raise ValueError(f"VAD has {len(vad)} frames but features have {len(feats)}")
    kept = voiced_frames(vad)
    return feats if kept is None else feats[kept]


def apply_frontend(
    feats: np.ndarray, vad: np.ndarray | None = None, use_vad: bool = True, mean_norm: bool = True
) -> np.ndarray:
    """What the model sees for a whole utterance: voiced frames (when ``use_vad`` and a VAD is
    given), then the per-utterance mean over those frames subtracted (when ``mean_norm``).
    Returns a new float32 array [T', F]."""
    out = select_voiced(feats, vad) if use_vad else feats
    out = np.asarray(out, dtype=np.float32)
    if mean_norm:
        out = out - out.mean(axis=0, keepdims=True)
    elif out is feats:
        out = out.copy()
    return out


def wave_frontend(
    wave: np.ndarray,
    sample_rate: int,
    fbank: FbankOptions,
    vad: VadOptions | None,
    *,
    use_vad: bool,
    mean_norm: bool,
) -> np.ndarray:
    """What a spkflow model sees for a mono waveform at ``sample_rate``: fbank, energy VAD (when
    ``use_vad`` and ``vad`` is given), then :func:`apply_frontend`.  ``ValueError`` when no frame is left."""
    feats = compute_fbank(wave, sample_rate, fbank)
    voiced = compute_vad(feats, vad) if (use_vad and vad is not None) else None
    out = apply_frontend(feats, voiced, use_vad=use_vad, mean_norm=mean_norm)
    if out.shape[0] == 0:
        raise ValueError("no frames left after the frontend")
    return out
