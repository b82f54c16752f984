"""Energy voice-activity detection in the manner of Kaldi's ``compute-vad``.

A frame is voiced when enough frames of a context window around it have a log-energy above
``vad_energy_threshold + vad_energy_mean_scale * mean(log-energy of the utterance)``.  The rule,
the option names and the ``vad.scp`` output (a float vector of 1.0 / 0.0 per frame) are
Kaldi's (ivector/voice-activity-detection.cc), so a Kaldi ``vad.conf`` works unchanged.

Differences from Kaldi, on purpose (reasons and measured voiced fractions: docs/features.md):
every frame of the context window counts (Kaldi's loop compares the centre frame only, so its
``--vad-frames-context`` has no effect); a noise-floor guard (``--vad-floor-margin``, 0 = off)
raises the threshold for recordings with a loud background; the log-energy is that of the summed
mel energies, scaled to sit near Kaldi's raw log-energy so that Kaldi's thresholds keep their
meaning.

Vectorised with numpy (a cumulative sum), O(T).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from spkflow.core.kaldi_opts import read_kaldi_options, to_kaldi_lines

__all__ = ["VadOptions", "compute_vad", "frame_log_energy"]


@dataclass(frozen=True)
class VadOptions:
    """Options of Kaldi's ``compute-vad`` (defaults: Kaldi's VoxCeleb/SRE ``conf/vad.conf``), plus
    the noise-floor guard (``vad_floor_*``) and ``fft_bins`` (see the module doc)."""

    vad_energy_threshold: float = 5.5
    vad_energy_mean_scale: float = 0.5
    vad_frames_context: int = 2
    vad_proportion_threshold: float = 0.12
    vad_floor_percentile: float = 10.0  # the noise floor: this percentile of the log-energies
    vad_floor_margin: float = 2.5  # threshold >= floor + margin (natural log, ~11 dB); 0: Kaldi's rule
    fft_bins: int = 256  # log(fft_bins) is subtracted from the summed mel energy (padded window / 2)

    def __post_init__(self) -> None:
        if self.vad_energy_mean_scale < 0:
            raise ValueError(f"vad-energy-mean-scale must be >= 0, got {self.vad_energy_mean_scale}")
        if self.vad_frames_context < 0:
            raise ValueError(f"vad-frames-context must be >= 0, got {self.vad_frames_context}")
        if not 0.0 < self.vad_proportion_threshold < 1.0:
            raise ValueError(f"vad-proportion-threshold must be in (0, 1), got {self.vad_proportion_threshold}")
        if not 0.0 <= self.vad_floor_percentile < 95.0:
            raise ValueError(f"vad-floor-percentile must be in [0, 95), got {self.vad_floor_percentile}")
        if self.vad_floor_margin < 0:
            raise ValueError(f"vad-floor-margin must be >= 0, got {self.vad_floor_margin}")
        if self.fft_bins < 1:
            raise ValueError(f"fft-bins must be >= 1, got {self.fft_bins}")

    @classmethod
    def from_kaldi_conf(cls, path: str | os.PathLike[str]) -> VadOptions:
        """Read a Kaldi option file (``--vad-energy-threshold=5.5`` per line)."""
        return read_kaldi_options(path, cls, ignore=frozenset({"verbose", "omit-unvoiced-utts"}))

    def to_kaldi_conf(self) -> str:
        return to_kaldi_lines(self)


def frame_log_energy(feats: np.ndarray, fft_bins: int = 256) -> np.ndarray:
    """Per-frame log-energy [T] from log-mel filterbanks [T, F] (natural log, int16 scale)."""
    feats = np.asarray(feats, dtype=np.float64)
    peak = feats.max(axis=1, keepdims=True)
    return (peak[:, 0] + np.log(np.exp(feats - peak).sum(axis=1))) - np.log(fft_bins)


def compute_vad(feats: np.ndarray, opts: VadOptions | None = None) -> np.ndarray:
    """Voiced (1.0) / unvoiced (0.0) decision per frame of log-mel features [T, F] -> float32 [T]."""
    opts = opts or VadOptions()
    energy = frame_log_energy(feats, opts.fft_bins)
    t = len(energy)
    if t == 0:
        return np.zeros(0, dtype=np.float32)
    threshold = opts.vad_energy_threshold + opts.vad_energy_mean_scale * energy.mean()
    if opts.vad_floor_margin > 0:
        floor, top = np.percentile(energy, [opts.vad_floor_percentile, 95.0])
        if top - floor > 2 * opts.vad_floor_margin:
            threshold = max(threshold, floor + opts.vad_floor_margin)
    above = (energy > threshold).astype(np.float64)
    c = opts.vad_frames_context
    if c == 0:
        return above.astype(np.float32)
    csum = np.concatenate([[0.0], np.cumsum(above)])
    i = np.arange(t)
    lo, hi = np.maximum(i - c, 0), np.minimum(i + c + 1, t)
    num, den = csum[hi] - csum[lo], hi - lo  # the window is cut at the edges, as in Kaldi
    return (num >= den * opts.vad_proportion_threshold).astype(np.float32)
