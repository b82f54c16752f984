"""The speech check made before a same-speaker decision (``verify``, ``identify``, the API): how
many seconds of voiced speech a recording holds, by the project's energy VAD
(:mod:`spkflow.features.vad`).

:func:`speech_seconds` counts the frames :func:`~spkflow.features.vad.compute_vad` calls voiced
(its default options, on a 16 kHz, 10 ms fbank whatever the model's frontend, so the threshold
means the same for every model), less two cases Kaldi's relative threshold calls voiced
throughout: frames below an absolute floor (:data:`SILENCE_LOG_ENERGY`, about -80 dBFS: digital
silence) and a recording whose energy hardly moves (:data:`STEADY_RANGE`: a hum, a tone or hiss
has no syllables).  Below :data:`MIN_SPEECH` seconds no decision is made (the callers refuse or
flag it, never decide).

Measured on the shipped corpora (every 10th-or-so file, ``/work/shared/corpora``): FSDD's spoken
digits hold 0.11 s at least, 5 % of them under 0.17 s, the median 0.30 s; DSPSpeech-20's words
0.48 s at least; speechocean762 and LibriSpeech recordings 0.84 s at least; 2 s of digital
silence and of steady noise at -60 dBFS hold 0 s, a 200 ms clip at most 0.18 s, a 30 ms clip 0.

Anchor: SpeechBrain's ``verify_files`` and WeSpeaker's ``compute_similarity`` score whatever they
are given; pyannote's speaker-verification pipeline leaves speech detection to a separate model.
"""

from __future__ import annotations

import numpy as np

from spkflow.data.resample import resample
from spkflow.features.fbank import FbankOptions, compute_fbank
from spkflow.features.vad import compute_vad, frame_log_energy

__all__ = ["MIN_SPEECH", "SILENCE_LOG_ENERGY", "STEADY_RANGE", "speech_seconds"]

#: fewest seconds of voiced speech a same-speaker decision is made on
MIN_SPEECH = 0.25
#: frame log-energy (natural log, int16 scale, :func:`frame_log_energy`) below which a frame is silence (~ -80 dBFS)
SILENCE_LOG_ENERGY = 8.0
#: 95th minus 5th percentile of the frame log-energies below which a recording is a steady sound, not speech
#: (>= 1.6 on every FSDD, DSPSpeech-20, speechocean762 and LibriSpeech recording measured; steady noise ~0.7)
STEADY_RANGE = 1.0


def speech_seconds(wave: np.ndarray, sample_rate: int) -> float:
    """Seconds of voiced speech in a mono waveform (float in [-1, 1]) at any rate (module doc)."""
    opts = FbankOptions()
    rate = int(opts.sample_frequency)
    x = resample(np.asarray(wave, dtype=np.float32), int(sample_rate), rate)
    if x.shape[0] < int(rate * opts.frame_length / 1000):
        return 0.0
    feats = compute_fbank(x, rate, opts)
    energy = frame_log_energy(feats)
    p5, p95 = np.percentile(energy, [5.0, 95.0])
    if p95 - p5 < STEADY_RANGE:
        return 0.0
    voiced = (compute_vad(feats) > 0) & (energy > SILENCE_LOG_ENERGY)
    return round(float(voiced.sum()) * opts.frame_shift / 1000, 3)
