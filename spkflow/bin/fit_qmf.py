"""Fit a quality-measure function (QMF) on trials drawn from the training set (stage 6).

    python -m spkflow.bin.fit_qmf --xvector-scp exp/spk_x/embed/train/xvector.scp \\
        --utt2spk data/train/utt2spk [--utt2dur data/train/utt2dur] \\
        [--cohort-scp exp/spk_x/embed/train/spk_xvector.scp --cohort-size 300] \\
        [--mean-scp ... | --backend ...] [--eval-mean true] [--num-trials 20000] [--seed 0] \\
        --out exp/spk_x/qmf/qmf.json

Scores the drawn trials exactly as ``spkflow.bin.score`` scores a test set with the same options
(each utterance's own speaker left out of the AS-norm cohort), fits the linear logistic QMF on the
score and the quality measures (``duration`` with --utt2dur, ``magnitude``, ``imposter`` with a
cohort) and writes it as JSON; ``spkflow.bin.score --qmf`` applies it.  The work is
:func:`spkflow.score.eval_report.fit_qmf_file`.  Exit status 1 with one error line naming the file
on bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import add_bool_option, int_at_least
from spkflow.core.errors import InputError
from spkflow.score.eval_report import ScoringSetup, fit_qmf_file


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.fit_qmf", description=__doc__.split("\n")[0])
    p.add_argument("--xvector-scp", required=True, help="the training set's utterance embeddings")
    p.add_argument("--utt2spk", required=True, help="the training set's speakers")
    p.add_argument("--utt2dur", default=None, help="the training set's durations (enables the duration measure)")
    p.add_argument("--cohort-scp", default=None, help="AS-norm cohort (as for scoring; enables the imposter measure)")
    p.add_argument("--cohort-size", type=int_at_least(2), default=200, help="top-K cohort entries (as for scoring)")
    p.add_argument("--mean-scp", default=None, help="centring mean (as for scoring)")
    p.add_argument("--backend", default=None, metavar="NPZ", help="linear backend (as for scoring)")
    add_bool_option(p, "--eval-mean", default=False, help="centre on the drawn trials' own mean (as for scoring)")
    p.add_argument("--num-trials", type=int_at_least(10), default=20000, help="target trials, and as many non-target")
    p.add_argument("--seed", type=int, default=0, help="seed of the trial draw")
    p.add_argument("--out", required=True, help="the QMF file (JSON) to write")
    return p


@exits_on(InputError, ValueError, OSError)
def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()
    setup = ScoringSetup(args.cohort_scp, args.cohort_size, args.mean_scp, args.backend, args.eval_mean)
    info = fit_qmf_file(
        args.xvector_scp,
        args.utt2spk,
        args.out,
        setup,
        utt2dur=args.utt2dur,
        num_trials=args.num_trials,
        seed=args.seed,
    )
    weights = ", ".join(f"{k} {v:+.3g}" for k, v in info["weights"].items())
    logging.info(
        "QMF (%s) fitted on %d target + %d non-target training trials: EER %.2f%% -> %.2f%%, Cllr %.3f; "
        "weights %s -> %s",
        ", ".join(info["measures"]),
        info["n_target"],
        info["n_nontarget"],
        info["eer_before"],
        info["eer_after"],
        info["cllr"],
        weights,
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
