"""Progress of diarizing a long recording (``diarize --progress``): the bar moves at least once a
minute.  Checked with a fake clock, not real time (the test machine is shared): the embedding
function stands in for the model only to advance the clock by what a window costs on a loaded
2-core VM (0.6 s: 469.7 s for the ~800 windows of 10 minutes at load 15, diar1 RESULTS.md, "Speed
and memory"), so the test asks how long the longest stretch without a bar update would be.  The
speech detectors report their progress as they go (energy: per minute of audio; silero: per
block of 512 frames, 16.4 s), on real audio."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.audio import synth_voice
from spkflow.diar.pipeline import EMBED_CHUNK, embed_windows
from spkflow.diar.speech import energy_speech, silero_speech

SECONDS_PER_WINDOW = 0.6  # a loaded 2-core VM (see the module doc)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0


def test_an_hour_moves_the_bar_at_least_once_a_minute():
    rate = 100  # an hour of samples at 100 Hz: the stand-in embedder never looks at them
    wave = np.zeros(3600 * rate, dtype=np.float32)
    clock = FakeClock()
    calls: list[int] = []

    def embed(crops, sample_rate):
        calls.append(len(crops))
        clock.now += SECONDS_PER_WINDOW * len(crops)
        return np.zeros((len(crops), 4))

    seen: list[tuple[float, int, int]] = []
    w = embed_windows(
        wave, rate, "hour", embed, speech=[(0.0, 3600.0)], on_windows=lambda d, n: seen.append((clock.now, d, n))
    )
    n = len(w.windows)
    assert n == 4799 and w.x.shape == (n, 4) and sum(calls) == n
    assert seen[0] == (0.0, 0, n) and seen[-1][1:] == (n, n)  # told the total first, then every chunk
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen)
    gaps = np.diff([t for t, _, _ in seen])
    assert gaps.max() <= 60.0, gaps.max()  # at most EMBED_CHUNK windows between two updates
    assert max(calls) <= EMBED_CHUNK


def test_the_detectors_report_their_progress(tmp_path):
    rng = np.random.default_rng(0)
    wave = np.concatenate([synth_voice(rng, 140.0, (500.0, 1500.0, 2500.0), 5.0) for _ in range(14)])  # 73 s
    duration = len(wave) / 16000
    for detect, most in ((energy_speech, 60.0), (silero_speech, 512 * 0.032)):  # a minute; 512 frames
        done: list[float] = []
        regions = detect(wave, 16000, progress=done.append)
        assert regions and done == sorted(done) and done[-1] == pytest.approx(duration, abs=0.05)
        steps = np.diff([0.0, *done])
        assert steps.max() <= most + 0.05, (detect.__name__, steps.max())  # per minute of audio, or finer
