"""Fit a model's score calibration and write its scoring (backend, cohort, calibration) into the model dir.

    python -m spkflow.bin.calibrate --trials data/dsp20_8k/trials \\
        --xvector-scp exp/spk_x/embed/dsp20_8k/xvector.scp --out-dir exp/spk_x \\
        [--backend exp/spk_x/backend/wccn.npz | --mean-scp exp/spk_x/embed/train/spk_xvector.scp] \\
        [--cohort-scp exp/spk_x/embed/train/spk_xvector.scp --cohort-size 25] [--p-target 0.5] [--set-name dsp20_8k]

Stage 6 of ``spk.sh`` runs it before scoring the test sets.  The trials are scored as stage 6
scores (the same backend, centring and cohort) after centring on their own recordings, as
``spkflow.bin.verify`` centres a batch; a linear logistic regression maps those scores to
log-likelihood ratios (:mod:`spkflow.score.calibration`), and ``OUT_DIR/scoring.yaml`` +
``scoring.npz`` (:mod:`spkflow.score.model_scoring`) hold all of it, which stage 7 packs.  Exit
status 1 with one error line naming the file on bad input (trials of one label, a missing
embedding, a bad scp line).
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import int_at_least, probability
from spkflow.core.errors import InputError
from spkflow.score.calibration import calibration_trials_problem
from spkflow.score.model_scoring import Decision, fit_scoring


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--trials", required=True, help="labelled trials to fit on: utt1 utt2 target|nontarget")
    p.add_argument("--xvector-scp", required=True, help="embeddings of the trials' utterances")
    p.add_argument("--out-dir", required=True, help="the model dir: scoring.yaml and scoring.npz are written there")
    p.add_argument("--backend", default=None, metavar="NPZ", help="a fitted WCCN/LDA backend (spkflow.bin.fit_backend)")
    p.add_argument("--mean-scp", default=None, help="embeddings whose raw mean is the training mean (no backend)")
    p.add_argument("--cohort-scp", default=None, help="AS-norm cohort (the training speakers' spk_xvector.scp)")
    p.add_argument("--cohort-size", type=int_at_least(2), default=200, help="top-K cohort entries for AS-norm")
    p.add_argument(
        "--p-target", type=probability, default=0.5, help="target prior of the decision threshold (equal costs)"
    )
    p.add_argument("--set-name", default="", help="name of the trials' set (for the model card)")
    return p


@exits_on(InputError, ValueError, OSError)
def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()
    scoring = fit_scoring(
        args.trials,
        args.xvector_scp,
        backend_path=args.backend,
        cohort_scp=args.cohort_scp,
        cohort_size=args.cohort_size,
        mean_scp=args.mean_scp,
        decision=Decision(args.p_target),
        set_name=args.set_name,
    )
    yaml_path, _ = scoring.save(args.out_dir)
    f = scoring.fitted
    _, few = calibration_trials_problem(f["n_target"], f["n_nontarget"])
    if few:
        logging.warning("%s: %s", args.trials, few)
    logging.info(
        "calibration of %s scores on %s (%d target / %d non-target trials, centred on %s): LLR = %.4g x score "
        "%+.4g; in-sample Cllr %.3f, decisions HTER %.2f%% against EER %.2f%% -> %s",
        scoring.label,
        args.trials,
        f["n_target"],
        f["n_nontarget"],
        f["centred_on"],
        scoring.calibration.weights[0],
        scoring.calibration.bias,
        f["in_sample"]["cllr"],
        f["in_sample"]["hter"],
        f["eer"],
        yaml_path,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
