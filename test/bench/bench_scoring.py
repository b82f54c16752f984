"""Benchmark: metrics, scoring and losses against peers measured in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_scoring.py [--trials 200000] [--repeat 3]

Rows (best of --repeat wall times; ratio = ours / peer, < 1 means ours is faster):

1. EER + minDCF(0.01) + minDCF(0.05) of --trials Gaussian scores (10% targets):
   :func:`spkflow.score.metrics.compute_metrics` (one sort) vs ``espnet2.utils.eer`` (sklearn ROC for
   the EER, Kaldi's Python loop ``ComputeErrorRates`` once + ``ComputeMinDcf`` twice);
2. cosine scoring of --trials trials over 2,000 utterances of 256-d embeddings:
   :func:`spkflow.score.trial_scoring.score_trials` vs WeSpeaker's per-trial loop
   (``sklearn.metrics.pairwise.cosine_similarity`` on each pair, as ``wespeaker/bin/score.py``);
3. AS-norm statistics of 2,000 utterances against a 5,000-entry cohort, top 300:
   :func:`spkflow.score.trial_scoring.asnorm_stats` (partition, chunked) vs WeSpeaker's ``get_mean_std``
   (full sort of the score matrix);
4. one GE2E-XS forward+backward on a 64 x 10 x 256 batch vs GE2E softmax on the same batch
   (what the extended set costs on top of the row softmax).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test helpers
from helpers.bench import best  # noqa: E402


def row(name: str, ours: float, peer: float, peer_name: str) -> None:
    print(f"{name:<34} ours {ours * 1e3:9.1f} ms   {peer_name:<28} {peer * 1e3:9.1f} ms   ratio {ours / peer:6.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    # 1. metrics
    from espnet2.utils.eer import ComputeErrorRates, ComputeMinDcf, tuneThresholdfromScore

    from spkflow.score.metrics import compute_metrics

    labels = (rng.random(args.trials) < 0.1).astype(int)
    scores = rng.normal(size=args.trials) + 2.0 * labels

    def peer_metrics():
        tuneThresholdfromScore(scores, labels, [1])
        fnrs, fprs, thr = ComputeErrorRates(scores, labels)
        return [ComputeMinDcf(fnrs, fprs, thr, p, 1, 1) for p in (0.01, 0.05)]

    ours = compute_metrics(scores, labels)
    _, ref_eer, _, _ = tuneThresholdfromScore(scores, labels, [1])
    print(
        f"[check] EER ours {ours['eer']:.4f}% espnet2 {ref_eer:.4f}%; "
        f"minDCF0.01 ours {ours['min_dcf_p0.01']:.5f} espnet2 {peer_metrics()[0][0]:.5f}"
    )
    row(
        f"metrics, {args.trials} trials",
        best(lambda: compute_metrics(scores, labels), args.repeat),
        best(peer_metrics, 1),
        "espnet2.utils.eer",
    )

    # 2. cosine scoring
    from sklearn.metrics.pairwise import cosine_similarity

    from spkflow.score.trial_scoring import Trials, asnorm_stats, score_trials

    utts = [f"u{i:05d}" for i in range(2000)]
    emb = {u: rng.normal(size=256).astype(np.float32) for u in utts}
    pick = rng.integers(0, len(utts), size=(args.trials, 2))
    trials = Trials.from_pairs((utts[a], utts[b], bool(a % 7 == b % 7)) for a, b in pick)
    n_peer = min(args.trials, 20_000)  # the per-trial loop is slow: time a slice, scale up

    def peer_score():
        for e, t in zip(trials.enroll[:n_peer], trials.test[:n_peer], strict=True):
            cosine_similarity(emb[e].reshape(1, -1), emb[t].reshape(1, -1))[0][0]

    ours_t = best(lambda: score_trials(trials, emb), args.repeat)
    peer_t = best(peer_score, 1) * args.trials / n_peer
    row(f"cosine scoring, {args.trials} trials", ours_t, peer_t, f"per-trial sklearn (x{args.trials / n_peer:g})")

    # 3. AS-norm statistics
    mat = np.stack([emb[u] for u in utts]).astype(np.float64)
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    cohort = rng.normal(size=(5000, 256))
    cohort /= np.linalg.norm(cohort, axis=1, keepdims=True)

    def peer_stats():
        s = np.sort(mat @ cohort.T, axis=1)[:, ::-1][:, :300]
        return s.mean(axis=1), s.std(axis=1)

    mu, sd = asnorm_stats(mat, cohort, 300)
    pm, ps = peer_stats()
    assert np.allclose(mu, pm) and np.allclose(sd, ps)
    row(
        "AS-norm stats 2000 x 5000, top 300",
        best(lambda: asnorm_stats(mat, cohort, 300), args.repeat),
        best(peer_stats, args.repeat),
        "full sort (WeSpeaker)",
    )

    # 4. loss cost
    import torch

    from spkflow.nnet.losses import GE2ELoss, GE2EXSLoss

    torch.set_num_threads(1)
    x = torch.randn(64, 10, 256, requires_grad=True)
    xs, sm = GE2EXSLoss(), GE2ELoss()

    def step(loss):
        return lambda: loss(x).backward()

    row(
        "GE2E-XS fwd+bwd 64x10x256",
        best(step(xs), args.repeat * 5),
        best(step(sm), args.repeat * 5),
        "GE2E softmax fwd+bwd",
    )


if __name__ == "__main__":
    main()
