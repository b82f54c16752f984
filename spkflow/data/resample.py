"""Resampling by an exact rational factor: the one band-limited filter of every rate change.

A recording at another rate than the model's (44.1 kHz, 8 kHz telephone speech), a speed
perturbation, a noise source for augmentation, a diarization input: each goes through
:func:`resample`, scipy's polyphase FIR (``resample_poly``) with its default Kaiser filter
(beta 5, 10 zero crossings of the lower rate per side), designed once per rate pair
(:func:`polyphase_filter`) instead of once per call.  The ratio is exact (gcd-reduced), so the
length is ``ceil(len(x) * new / orig)`` with no drift.  Against the anchors'
``torchaudio.functional.resample`` default (ESPnet, WeSpeaker, SpeechBrain), measured on 8 -> 16
kHz tones: 0.01 dB passband loss at 3 kHz and a -57 dB image at 5 kHz, against 0.13 dB and -45 dB,
at the same speed (docs/audio.md).
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["polyphase_filter", "resample"]


def resample(x: np.ndarray, orig_sr: int, new_sr: int) -> np.ndarray:
    """Band-limited resampling of a 1-D signal by the exact rational factor new_sr / orig_sr.

    ``scipy.signal.resample_poly`` (polyphase FIR, Kaiser window): no phase shift, exact output
    length ``ceil(len(x) * new_sr / orig_sr)``.  Returns float32 (the input itself when the rates
    are equal).
    """
    if orig_sr <= 0 or new_sr <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_sr} -> {new_sr}")
    x = np.asarray(x, dtype=np.float32)
    if orig_sr == new_sr:
        return x
    from scipy.signal import resample_poly  # heavy import, only when needed

    g = math.gcd(int(orig_sr), int(new_sr))
    up, down = int(new_sr) // g, int(orig_sr) // g
    y = resample_poly(x, up, down, axis=0, window=polyphase_filter(up, down))
    return np.asarray(y, dtype=np.float32)


@functools.lru_cache(maxsize=16)
def polyphase_filter(up: int, down: int) -> np.ndarray:
    """scipy's default anti-aliasing filter of ``resample_poly`` (Kaiser beta 5, 10 zero crossings
    of the lower rate per side), designed once per rate pair instead of once per call."""
    from scipy.signal import firwin

    max_rate = max(up, down)
    h = firwin(2 * 10 * max_rate + 1, 1.0 / max_rate, window=("kaiser", 5.0))
    h.setflags(write=False)
    return h
