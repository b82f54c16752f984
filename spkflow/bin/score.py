"""Score a trial list against embeddings: scores, metrics.json, DET and histogram plots.

    python -m spkflow.bin.score --trials data/test/trials \\
        --xvector-scp exp/spk_x/embed/test/xvector.scp --outdir exp/spk_x/eval/test \\
        [--cohort-scp exp/spk_x/embed/train/spk_xvector.scp --cohort-size 200] \\
        [--mean-scp exp/spk_x/embed/train/spk_xvector.scp | --backend exp/spk_x/backend/wccn.npz] \\
        [--scoring-dir exp/spk_x] [--eval-mean true] [--qmf exp/spk_x/qmf/qmf.json --utt2dur data/test/utt2dur] \\
        [--skip-missing] [--model-tag spk_x] [--results-md exp/spk_x]

Argument parsing only; the work is :func:`spkflow.score.eval_report.evaluate_set`.  On failure (exit 1,
one error line, no traceback) the set's earlier outputs are gone and, with ``--results-md``,
RESULTS.md is rewritten without it, so nothing stale looks current.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import setup_logging
from spkflow.bin.argtypes import add_bool_option
from spkflow.core.errors import InputError
from spkflow.score.eval_report import (
    evaluate_set,
    refresh_results_md,
    summary_lines,
    training_calibration_warning,
    write_results_md,
)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.score", description=__doc__.split("\n")[0])
    p.add_argument("--trials", required=True, help="trials file: utt1 utt2 target|nontarget")
    p.add_argument("--xvector-scp", required=True, help="kaldiio scp of utterance embeddings")
    p.add_argument("--outdir", required=True, help="where scores, metrics.json and plots go")
    p.add_argument(
        "--cohort-scp",
        default=None,
        help="scp of cohort embeddings (e.g. training speakers' spk_xvector.scp): enables AS-norm",
    )
    p.add_argument("--cohort-size", type=int, default=200, help="top-K cohort entries for AS-norm")
    p.add_argument(
        "--mean-scp",
        default=None,
        help="scp whose mean vector is subtracted from all embeddings before scoring (centring)",
    )
    p.add_argument(
        "--backend",
        default=None,
        metavar="NPZ",
        help="a fitted linear backend (python -m spkflow.bin.fit_backend) applied to the trial and cohort "
        "embeddings first; it centres on its own training mean, so not with --mean-scp",
    )
    p.add_argument(
        "--scoring-dir",
        default=None,
        metavar="MODEL_DIR",
        help="score with a model's own scoring (its scoring.yaml + scoring.npz: backend, centring, cohort and "
        "calibration; python -m spkflow.bin.calibrate writes them) instead of --backend, --cohort-scp, --mean-scp; "
        "metrics.json then also has the calibrated LLRs' figures",
    )
    add_bool_option(
        p,
        "--eval-mean",
        default=False,
        help="centre on the mean of this set's own embeddings (those its trials name; no labels used) instead "
        "of the training mean: it replaces the backend's mean, or without one is subtracted (not with --mean-scp)",
    )
    add_bool_option(
        p,
        "--skip-missing",
        default=False,
        bare=True,  # a bare --skip-missing means true (older callers; score.sh passes true|false)
        help="leave out trials naming an utterance without an embedding (counted) instead of failing",
    )
    p.add_argument("--model-tag", default="", help="experiment tag written into metrics.json")
    p.add_argument("--set-name", default=None, help="name of the set (default: basename of --outdir)")
    p.add_argument(
        "--results-md",
        default=None,
        metavar="EXP_DIR",
        help="afterwards rewrite EXP_DIR/RESULTS.md from EXP_DIR/eval/*/metrics.json",
    )
    p.add_argument(
        "--qmf",
        default=None,
        metavar="JSON",
        help="a QMF (python -m spkflow.bin.fit_qmf): its calibrated scores go to <outdir>/scores.qmf, "
        "their figures to metrics.json's 'qmf'",
    )
    p.add_argument("--utt2dur", default=None, help="the set's utt2dur (for a QMF with the duration measure)")
    p.add_argument(
        "--results-file",
        default=None,
        metavar="FILE",
        help="with --results-md: write the summary here instead of EXP_DIR/RESULTS.md (e.g. beside an unpacked "
        "model, whose RESULTS.md is the pack's)",
    )
    add_bool_option(p, "--plots", default=True, old_negative="--no-plots", bare=True, help="draw the PNG plots")
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()

    try:
        m = evaluate_set(
            args.trials,
            args.xvector_scp,
            args.outdir,
            cohort_scp=args.cohort_scp,
            cohort_size=args.cohort_size,
            mean_scp=args.mean_scp,
            backend_path=args.backend,
            scoring_dir=args.scoring_dir,
            eval_mean=args.eval_mean,
            skip_missing=args.skip_missing,
            model_tag=args.model_tag,
            set_name=args.set_name,
            plots=args.plots,
            qmf_path=args.qmf,
            utt2dur=args.utt2dur,
        )
    except (InputError, ValueError, OSError) as err:  # bad input (e.g. a mean of another dimension), a full disk
        logging.error("%s", err)
        if args.results_md:  # the set's earlier metrics.json is gone: its RESULTS.md row must go too
            logging.info("%s", refresh_results_md(args.results_md, args.results_file))
        return 1
    for line in summary_lines(m, args.outdir):
        logging.info("%s", line)
    warning = training_calibration_warning(m)
    if warning:
        logging.warning("%s", warning)
    if args.results_md:
        try:
            logging.info("wrote %s", write_results_md(args.results_md, args.results_file))
        except (InputError, OSError) as err:  # another set's metrics.json is damaged, or a full disk
            logging.error("%s (the scores of %s are written)", err, m["set"])
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
