"""The speaker count estimated from a recording's own scores (``method="gmm"``,
:mod:`spkflow.diar.pair_fit`): simulated conversations of 1, 2, 4 and 8 speakers, and the fit
itself on score sets made here.

The conversations are laid out by the simulator (:mod:`spkflow.sim`: turn-taking, pauses,
overlaps); each window's embedding is its speakers' voices mixed by how long each talks inside it,
plus noise: an embedder of known separability (a trained model's accuracy is the recipe's
figures, egs/speechocean762/diar1/RESULTS.md), so that what is tested is the count."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.diar import STATS
from spkflow.diar.pair_fit import count_labels, fit_threshold, pair_scores
from spkflow.diar.pipeline import DiarOptions, cluster_recording
from spkflow.diar.windows import plan_windows
from spkflow.score.model_scoring import Scoring
from spkflow.sim.conversations import simulate_conversation


def _conversation_windows(k: int, seed: int, noise: float = 0.5, dim: int = 64) -> np.ndarray:
    """Window embeddings ``[N, dim]`` (time order) of a simulated conversation of ``k`` speakers,
    60 s per two speakers (at least 2 minutes)."""
    rng = np.random.default_rng(seed)
    pool = {f"s{i}": [f"s{i}-u{j}" for j in range(6)] for i in range(k)}
    voiced = (0.5 * np.sin(0.05 * np.arange(16000 * 3))).astype(np.float32)  # every utterance 3 s, all voiced
    conv = simulate_conversation(
        "r", pool, lambda _u: voiced, STATS, num_speakers=k, duration=60.0 * max(2, k / 2), seed=seed
    )
    speakers = sorted({t.speaker for t in conv.turns})
    assert len(speakers) == k
    ws = plan_windows("r", sorted((t.start, t.end) for t in conv.turns), 1.5, 0.75, 0.5)
    voices = rng.standard_normal((k, dim))
    x = []
    for w in ws:
        talk = np.zeros(k)
        for t in conv.turns:
            talk[speakers.index(t.speaker)] += max(0.0, min(w.end, t.end) - max(w.start, t.start))
        x.append(talk @ voices / talk.sum() + noise * rng.standard_normal(dim))
    return np.array(x)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_the_count_of_simulated_conversations(k):
    for seed in range(3):
        x = _conversation_windows(k, seed)
        labels = cluster_recording(x, Scoring(), DiarOptions(method="gmm"))
        assert len(set(labels.tolist())) == k, f"seed {seed}"


def test_the_fit_says_one_speaker_when_one_gaussian_does():
    rng = np.random.default_rng(0)
    one = rng.normal(0.6, 0.1, 2000)
    assert fit_threshold(one) is None
    skewed = 0.9 - rng.gamma(2.0, 0.05, 20_000)  # one speaker's scores, skewed: BIC wants two components
    assert fit_threshold(skewed) is None
    two = np.r_[rng.normal(0.0, 0.1, 1500), rng.normal(0.7, 0.1, 500)]
    lo, mid, hi = (fit_threshold(two, p) for p in (0.3, 0.5, 0.7))
    assert lo is not None and mid is not None and hi is not None
    assert 0.0 < lo < mid < hi < 0.7  # a higher posterior asks for more before saying "same speaker"
    assert fit_threshold(two[:9]) is None  # too few pairs to fit
    with pytest.raises(ValueError, match="posterior"):
        fit_threshold(two, 1.0)


def test_pairs_that_share_audio_are_left_out():
    sim = np.arange(25, dtype=np.float64).reshape(5, 5)
    assert pair_scores(sim, gap=2).tolist() == [2, 3, 4, 8, 9, 14]
    assert len(count_labels(np.ones((3, 3)))) == 3


def test_a_forced_count_or_a_threshold_overrides_the_fit():
    x = _conversation_windows(4, 0)
    assert len(set(cluster_recording(x, Scoring(), DiarOptions(method="gmm", num_speakers=2)).tolist())) == 2
    y = x / np.linalg.norm(x, axis=1, keepdims=True)
    one = DiarOptions(method="gmm", threshold=float((y @ y.T).min()) - 1.0)
    assert len(set(cluster_recording(x, Scoring(), one).tolist())) == 1
    with pytest.raises(ValueError, match="posterior"):
        DiarOptions(method="gmm", posterior=0.0)
