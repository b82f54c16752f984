#!/usr/bin/env python3
"""Score the demo's trials with Resemblyzer, a public pretrained GE2E LSTM encoder (~8,000 speakers
of LibriSpeech + VoxCeleb 1/2), so that RESULTS.md shows it beside our model on the same trials.

Run it with the comparison's own environment (``local/setup_resemblyzer.sh`` makes it):

    .venv_resemblyzer/bin/python local/peer_resemblyzer.py --sets "test dsp20" [--exp-dirs "exp/spk_*"]
    .venv_resemblyzer/bin/python local/peer_resemblyzer.py --sets "test dsp20" --score-norm --score-center \
        --peer-dir exp/peer_resemblyzer_norm    # with stage 6's score normalisation, training-set cohort

For every set: Resemblyzer's own preprocessing (``preprocess_wav``: 16 kHz, volume normalised to
-30 dBFS, long silences cut with webrtcvad) and ``embed_utterance`` (mean of 1.6 s partials, L2
normalised) on each utterance of ``data/<set>`` -> ``exp/peer_resemblyzer/embed/<set>/xvector.scp``
(kept: a rerun only scores); then spkflow's scoring (cosine, EER, minDCF; the same code as stage 6)
-> ``exp/peer_resemblyzer/eval/<set>/metrics.json``. ``exp/peer_resemblyzer/RESULTS.md`` lists its
rows; the RESULTS.md of every ``--exp-dirs`` experiment is rewritten, which adds a
"peer_resemblyzer" row under each set (spkflow.score.eval_report.write_results_md reads peer results
from ``exp/peer_*``).  Audio is read with spkflow's AudioReader (any wav.scp entry).
``--score-norm`` / ``--score-center`` / ``--backend`` score it with the backend of stage 6's options
of the same names (AS-norm / centring against the training speakers, ``--cohort-set``; a WCCN or
LDA backend fitted on that set's utterance embeddings): Resemblyzer's embeddings of that set,
averaged per speaker like stage 5's ``spk_xvector.scp``.  ``--eval-mean`` centres on each set's
own mean instead (stage 6's ``--score_eval_mean true``; no labels).  Embeddings live
in ``--embed-dir`` (shared by every ``--peer-dir``), so a second backend only scores.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
import time

import numpy as np

log = logging.getLogger("peer_resemblyzer")
TAG = "peer_resemblyzer"


def embed_set(data_dir: str, out_dir: str, encoder, preprocess) -> str:  # noqa: ANN001 (resemblyzer types)
    """Embeddings of every utterance of ``data_dir`` -> ``out_dir/xvector.{ark,scp}`` (atomic scp)."""
    import kaldiio

    from spkflow.data.audio import AudioReader

    scp = os.path.join(out_dir, "xvector.scp")
    if os.path.isfile(scp):
        log.info("%s exists: reused", scp)
        return scp
    os.makedirs(out_dir, exist_ok=True)
    reader = AudioReader(data_dir, sample_rate=16000)
    ark_tmp, scp_tmp = os.path.join(out_dir, "xvector.ark"), scp + ".tmp"
    t0 = time.time()
    with kaldiio.WriteHelper(f"ark,scp:{ark_tmp},{scp_tmp}") as writer:
        for i, utt in enumerate(reader.keys()):
            wav = preprocess(reader.read(utt), source_sr=16000)
            if len(wav) < 1600:  # webrtcvad left (almost) nothing: use the untrimmed audio
                wav = reader.read(utt)
            writer(utt, np.asarray(encoder.embed_utterance(wav), dtype=np.float32))
            if (i + 1) % 200 == 0:
                log.info("%s: %d/%d utterances (%.0f s)", data_dir, i + 1, len(reader), time.time() - t0)
    os.replace(scp_tmp, scp)
    log.info("%s: %d embeddings in %.0f s -> %s", data_dir, len(reader), time.time() - t0, scp)
    return scp


def fit_peer_backend(name: str, data_dir: str, xvector_scp: str, peer_dir: str) -> str:
    """Stage 6's backend for these embeddings: ``name`` fitted on ``xvector_scp`` with
    ``data_dir/utt2spk`` (``spkflow.score.backend``) -> ``peer_dir/backend/<name>.npz``."""
    from spkflow.data.tables import read_kv
    from spkflow.score.backend import fit_backend_on
    from spkflow.score.trial_scoring import read_embeddings

    utt2spk = os.path.join(data_dir, "utt2spk")
    path = os.path.join(peer_dir, "backend", f"{name}.npz")
    fit_backend_on(
        name, read_embeddings(xvector_scp), read_kv(utt2spk), emb_source=xvector_scp, utt2spk_source=utt2spk
    ).save(path)
    return path


def speaker_means(data_dir: str, xvector_scp: str, out_dir: str) -> str:
    """Stage 5's ``spk_xvector.{ark,scp}`` for these embeddings: the mean of each speaker's
    utterance vectors (``spkflow.embed.run.speaker_means``, ``spk2utt`` order) -> ``out_dir``, written
    atomically; reused when present."""
    import kaldiio

    from spkflow.embed.run import data_dir_keys, write_vectors
    from spkflow.embed.run import speaker_means as means_of

    scp = os.path.join(out_dir, "spk_xvector.scp")
    if os.path.isfile(scp):
        return scp
    means, _ = means_of(data_dir_keys(data_dir)[1], dict(kaldiio.load_scp(xvector_scp)))
    write_vectors(os.path.join(out_dir, "spk_xvector.ark"), scp, means)
    return scp


def main(argv: list[str] | None = None) -> int:
    from spkflow.score.backend import BACKENDS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", default="test dsp20", help="data/<set> with trials, space separated")
    p.add_argument("--peer-dir", default=f"exp/{TAG}", help="where eval and RESULTS.md go (named peer_*)")
    p.add_argument("--exp-dirs", default="exp/spk_*", help="glob of experiments whose RESULTS.md gains the peer rows")
    p.add_argument("--embed-dir", default=f"exp/{TAG}/embed", help="Resemblyzer's embeddings, one dir per set")
    p.add_argument("--score-norm", action="store_true", help="AS-norm against the cohort speakers (stage 6's option)")
    p.add_argument("--score-center", action="store_true", help="subtract the cohort speakers' mean (stage 6's option)")
    p.add_argument(
        "--eval-mean",
        action="store_true",
        help="centre on each set's own mean embedding (stage 6's --score_eval_mean true), not with --score-center",
    )
    p.add_argument("--cohort-set", default="train", help="data/<set> whose speakers are the cohort")
    p.add_argument("--cohort-size", type=int, default=200, help="top cohort scores used by AS-norm (stage 6's)")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="cosine",
        help="a linear backend fitted on the cohort set's utterance embeddings (stage 6's --score_backend)",
    )
    args = p.parse_args(argv)
    tag = os.path.basename(os.path.normpath(args.peer_dir))
    if not tag.startswith("peer_"):
        p.error(f"--peer-dir must be named peer_* (RESULTS.md finds peers by that name), got {args.peer_dir!r}")
    if args.eval_mean and args.score_center:
        p.error("--eval-mean and --score-center: centre on the set's own mean or the training speakers', not both")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s")
    try:
        from resemblyzer import VoiceEncoder, preprocess_wav
    except ImportError:
        log.error("resemblyzer is not importable: run local/setup_resemblyzer.sh and use .venv_resemblyzer/bin/python")
        return 1
    from spkflow.score.eval_report import evaluate_set, write_results_md

    encoder = VoiceEncoder(device="cpu", verbose=False)
    backend: dict[str, object] = {}
    if args.score_norm or args.score_center or args.backend != "cosine":
        cohort_data = os.path.join("data", args.cohort_set)
        out = os.path.join(args.embed_dir, args.cohort_set)
        utt_scp = embed_set(cohort_data, out, encoder, preprocess_wav)
        cohort = speaker_means(cohort_data, utt_scp, out)
        if args.score_norm:
            backend.update(cohort_scp=cohort, cohort_size=args.cohort_size)
        if args.score_center:
            backend["mean_scp"] = cohort
        if args.backend != "cosine":
            backend["backend_path"] = fit_peer_backend(args.backend, cohort_data, utt_scp, args.peer_dir)
    backend["eval_mean"] = args.eval_mean
    for s in args.sets.split():
        data = os.path.join("data", s)
        trials = os.path.join(data, "trials")
        if not os.path.isfile(trials):
            log.error("%s not found (run stage 1)", trials)
            return 1
        scp = embed_set(data, os.path.join(args.embed_dir, s), encoder, preprocess_wav)
        m = evaluate_set(trials, scp, os.path.join(args.peer_dir, "eval", s), model_tag=tag, set_name=s, **backend)
        log.info(
            "%s: Resemblyzer EER %.2f%% minDCF(0.01) %.4f minDCF(0.05) %.4f",
            s,
            m["eer"],
            m["min_dcf_p0.01"],
            m["min_dcf_p0.05"],
        )
    log.info("wrote %s", write_results_md(args.peer_dir))
    for exp in sorted(glob.glob(args.exp_dirs)):
        if os.path.abspath(exp) != os.path.abspath(args.peer_dir) and glob.glob(
            os.path.join(exp, "eval", "*", "metrics.json")
        ):
            log.info("wrote %s", write_results_md(exp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
