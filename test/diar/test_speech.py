"""The speech detectors of spkflow.diar.speech against their anchors: silero through the wheel's
sequence ONNX model gives exactly what silero-vad's own streaming ``get_speech_timestamps`` gives
(on real read speech with pauses)."""

from __future__ import annotations

import numpy as np
import pytest

from spkflow.data.audio import load_audio
from spkflow.diar.speech import SileroOptions, silero_speech


@pytest.mark.corpus
def test_silero_through_the_sequence_model_is_silero_streaming(corpus):
    import torch
    from silero_vad import get_speech_timestamps, load_silero_vad

    flacs = sorted(corpus("LIBRISPEECH").rglob("*.flac"))[:4]
    rng = np.random.default_rng(0)
    parts = []
    for f in flacs:  # utterances with pauses of 0.2-1.5 s of low noise between them
        parts += [load_audio(str(f), 16000), 1e-3 * rng.standard_normal(int(rng.uniform(0.2, 1.5) * 16000))]
    wave = np.concatenate(parts).astype(np.float32)
    for o in (SileroOptions(), SileroOptions(onset=0.5, min_speech=0.25, min_silence=0.1, pad=0.03)):  # ours, silero's
        ours = silero_speech(wave, 16000, o)
        stamps = get_speech_timestamps(
            torch.from_numpy(wave),
            load_silero_vad(),  # the streaming JIT model, one 32 ms frame per call
            sampling_rate=16000,
            threshold=o.onset,
            min_speech_duration_ms=round(o.min_speech * 1000),
            min_silence_duration_ms=round(o.min_silence * 1000),
            speech_pad_ms=round(o.pad * 1000),
        )
        theirs = [(s["start"] / 16000, s["end"] / 16000) for s in stamps]
        assert len(ours) == len(theirs) >= 2 and np.allclose(ours, theirs, atol=1e-6), (o, ours, theirs)


def test_silero_options_are_parsed_and_named():
    assert SileroOptions.parse("onset=0.4, min_silence=0.25") == SileroOptions(onset=0.4, min_silence=0.25)
    with pytest.raises(ValueError, match="'threshold=0.3': expected KEY=VALUE, KEY one of min_silence"):
        SileroOptions.parse("threshold=0.3")
    with pytest.raises(ValueError, match="'pad=x': 'x' is not a number"):
        SileroOptions.parse("pad=x")
