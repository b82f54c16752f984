"""A recipe's scoring plan: the sets stages 1 and 5 use, and stage 6 itself (:mod:`spkflow.score.scoring_plan`).

    python -m spkflow.bin.scoring_plan --exp exp/spk_x --test_sets "test dsp20" --calib_set dsp20 \\
        [--score_backend wccn --score_norm true --cohort_size 25 ...] check | data-sets | embed-sets | show | run

The options are ``spk.sh``'s, under its names (an error names the option a user gave).
``check`` refuses options that cannot go together (exit 2); ``data-sets`` and ``embed-sets``
print the sets stage 1 checks and stage 5 embeds on one line; ``show`` prints stage 6's steps
without running them; ``run`` is stage 6 (exit 1 with one error line when a step fails).
Progress goes to standard output, as ``spk.sh``'s own.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import LOG_FORMAT
from spkflow.bin.argtypes import boolean, float_at_least, int_at_least, probability
from spkflow.score.scoring_plan import PlanError, ScoringOptions, run_plan, stage6

log = logging.getLogger("spkflow.score.scoring_plan")
COMMANDS = ("check", "data-sets", "embed-sets", "show", "run")


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.scoring_plan", description=__doc__.split("\n")[0])
    p.add_argument("--exp", required=True, help="the experiment dir (exp/<tag>): embed/, eval/, scoring")
    p.add_argument("--model_dir", default="", help="the model scored with (default: --exp)")
    p.add_argument("--pretrained", default="", help="the pretrained model given to spk.sh, if any")
    p.add_argument("--packed_scoring", type=boolean, default=False, help="the model brings its own scoring")
    p.add_argument("--train_set", default="train")
    p.add_argument("--test_sets", default="test", help="space-separated")
    p.add_argument("--valid_set", default="")
    p.add_argument("--embed_sets", default="", help="space-separated (default: test sets and valid set)")
    p.add_argument("--extract_train", type=boolean, default=False)
    p.add_argument("--calibrate", type=boolean, default=True)
    p.add_argument("--calib_set", default="")
    p.add_argument("--calib_prior", type=probability, default=0.5)
    p.add_argument("--score_norm", type=boolean, default=False)
    p.add_argument("--cohort_size", type=int_at_least(2), default=200)
    p.add_argument("--score_center", type=boolean, default=False)
    p.add_argument("--score_eval_mean", type=boolean, default=False)
    p.add_argument("--score_backend", default="cosine")
    p.add_argument("--backend_reg", type=float_at_least(0.0), default=0.1)
    p.add_argument("--score_skip_missing", type=boolean, default=False)
    p.add_argument("--score_qmf", type=boolean, default=False)
    p.add_argument("--qmf_trials", type=int_at_least(10), default=20000)
    p.add_argument("command", choices=COMMANDS)
    return p


def options(args: argparse.Namespace) -> ScoringOptions:
    kw = {k: v for k, v in vars(args).items() if k not in ("command", "packed_scoring", "model_dir")}
    kw.update(test_sets=tuple(args.test_sets.split()), embed_sets=tuple(args.embed_sets.split()))
    return ScoringOptions(packed=args.packed_scoring, model_dir=args.model_dir or args.exp, **kw)


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    listing = args.command in ("data-sets", "embed-sets", "show")  # standard output is the answer
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr if listing else sys.stdout)
    o = options(args)
    try:
        o.check()
        if args.command == "data-sets":
            print(" ".join(o.data_sets()))
        elif args.command == "embed-sets":
            sets, note = o.embed_sets_and_note()
            if note:
                log.info("%s", note)
            print(" ".join(sets))
        elif args.command == "show":
            print(stage6(o).script(), end="")
        elif args.command == "run":
            run_plan(stage6(o), say=log.info)
    except PlanError as err:
        log.error("%s", err)
        return 2 if args.command == "check" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
