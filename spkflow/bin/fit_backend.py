"""Fit a linear scoring backend (WCCN or LDA, :mod:`spkflow.score.backend`) on a set's utterance embeddings.

    python -m spkflow.bin.fit_backend --backend wccn --xvector-scp exp/spk_x/embed/train/xvector.scp \\
        --utt2spk data/train/utt2spk --out exp/spk_x/backend/wccn.npz [--reg 0.1] [--lda-dim 0]

Stage 6 of ``spk.sh`` runs it on the training set when ``--score_backend`` is not ``cosine`` and
passes the file to ``spkflow.bin.score --backend``.  Exit status 1 with one error line naming the
file when an embedding has no speaker in utt2spk, an scp line is bad, or the set has too few
speakers; the output is written atomically (no partial file).
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import float_at_least, int_at_least
from spkflow.core.errors import InputError
from spkflow.data.tables import read_kv
from spkflow.score.backend import BACKENDS, fit_backend_on
from spkflow.score.trial_scoring import read_embeddings


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.fit_backend", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=[b for b in BACKENDS if b != "cosine"], required=True)
    p.add_argument("--xvector-scp", required=True, help="utterance embeddings to fit on (e.g. the training set's)")
    p.add_argument("--utt2spk", required=True, help="the speakers of those utterances")
    p.add_argument("--out", required=True, help="the backend file (.npz) to write")
    p.add_argument(
        "--reg",
        type=float_at_least(0.0),
        default=0.1,
        help="shrinkage of the within-class covariance (x its mean eigenvalue)",
    )
    p.add_argument("--lda-dim", type=int_at_least(0), default=0, help="lda: directions kept (0: min(D, speakers - 1))")
    return p


@exits_on(InputError, OSError)
def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()

    emb = read_embeddings(args.xvector_scp)
    backend = fit_backend_on(
        args.backend,
        emb,
        read_kv(args.utt2spk),
        emb_source=args.xvector_scp,
        utt2spk_source=args.utt2spk,
        lda_dim=args.lda_dim,
        reg=args.reg,
    )
    backend.save(args.out)
    logging.info(
        "%s backend (reg %g, %d -> %d dims) fitted on %d utterances of %s -> %s",
        args.backend,
        args.reg,
        backend.proj.shape[0],
        backend.proj.shape[1],
        len(emb),
        args.xvector_scp,
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
