"""Benchmark: verifying many pairs of recordings, against the per-pair way, in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_verify.py [--recordings 40] [--seconds 3] [--repeat 2]

A tiny spkflow model with random weights (the cost is reading audio, fbank, the model and the
scoring, not the weights), every pair of --recordings synthetic recordings of --seconds each:

1. ``spkflow.deploy.decisions.verify_pairs`` (what ``python -m spkflow.bin.verify --pairs`` runs):
   each recording read and embedded once, in batches, every pair scored at once (backend,
   AS-norm, calibration) vs the per-pair way of SpeechBrain's ``SpeakerRecognition.verify_files``
   and WeSpeaker's ``compute_similarity(a, b)``: both files read and embedded for every pair
   (``Embedder.verify(a, b)`` in a loop, which also runs the full scoring per pair);
2. the scoring alone, 200,000 pairs of 2,000 embeddings (192-d, WCCN + AS-norm against 125
   speakers, calibration): ``Scoring.score_trials`` vs the same scoring one pair per call.

Rows: best of --repeat wall times; ratio = ours / peer (< 1: ours is faster).
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test helpers
from helpers.audio import synth_voice  # noqa: E402
from helpers.bench import best  # noqa: E402
from helpers.models import make_spkflow_model_dir  # noqa: E402


def row(name: str, ours: float, peer: float, peer_name: str) -> None:
    print(f"{name:<40} ours {ours:8.2f} s   {peer_name:<30} {peer:8.2f} s   ratio {ours / peer:6.3f}")


def scoring_fixture(dim: int, seed: int = 0):  # noqa: ANN201
    from spkflow.score.backend import fit_backend
    from spkflow.score.calibration import LogisticCalibration
    from spkflow.score.model_scoring import Scoring

    rng = np.random.default_rng(seed)
    train = rng.normal(size=(1500, dim))
    labels = [f"s{i % 125}" for i in range(1500)]
    return Scoring(
        fit_backend("wccn", train, labels),
        None,
        rng.normal(size=(125, dim)),
        25,
        LogisticCalibration((0.7,), -0.3),
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recordings", type=int, default=40)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=2)
    a = p.parse_args()

    from spkflow import Embedder
    from spkflow.deploy.decisions import Recordings, verify_pairs
    from spkflow.score.trial_scoring import Trials

    with tempfile.TemporaryDirectory() as tmp:
        model = make_spkflow_model_dir(Path(tmp) / "model")
        emb = Embedder.from_pretrained(model)
        emb.scoring = scoring_fixture(emb.dim)
        rng = np.random.default_rng(1)
        files = []
        for i in range(a.recordings):
            f = Path(tmp) / f"r{i:03d}.wav"
            sig = synth_voice(rng, 90 + 3 * i, (500.0, 1500.0, 2500.0), a.seconds)
            sf.write(f, sig, 16000, subtype="PCM_16")
            files.append(str(f))
        pairs = [(x, y, False) for i, x in enumerate(files) for y in files[i + 1 :]]
        trials = Trials.from_pairs(pairs, labelled=False)

        def batched() -> None:
            verify_pairs(emb, trials, io.StringIO(), source=Recordings(), domain="train", progress=False)

        def per_pair() -> None:
            for x, y, _ in pairs:
                emb.verify(x, y)

        ours, peer = best(batched, a.repeat), best(per_pair, a.repeat)
        row(f"verify {len(pairs)} pairs of {a.recordings} recordings", ours, peer, "per pair (verify_files way)")

    s = scoring_fixture(192)
    rng = np.random.default_rng(2)
    vecs = {f"u{i}": v for i, v in enumerate(rng.normal(size=(2000, 192)))}
    keys = list(vecs)
    idx = rng.integers(0, 2000, size=(200_000, 2))
    many = Trials.from_pairs(((keys[i], keys[j], False) for i, j in idx), labelled=False)

    def all_at_once() -> None:
        s.llr(s.score_trials(many, vecs).scores)

    def one_by_one() -> None:
        for i, j in idx[:2000]:
            s.score(vecs[keys[i]], vecs[keys[j]])

    ours = best(all_at_once, a.repeat)
    peer = best(one_by_one, 1) * len(idx) / 2000  # 2,000 calls timed, scaled to 200,000
    row("scoring 200,000 pairs (WCCN, AS-norm, LLR)", ours, peer, "one pair per call (scaled)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
