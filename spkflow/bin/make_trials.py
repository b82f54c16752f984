"""Write a verification trial list for a data dir: target pairs (at most 500 per speaker by default)
plus a seeded sample of non-target pairs (at most NONTARGET_RATIO per target pair).

    python -m spkflow.bin.make_trials [--max-targets-per-spk 500|all] [--nontarget-ratio 10] [--seed 0] \\
        [--max-per-spk N] DATA_DIR [OUT]

OUT defaults to DATA_DIR/trials.  Lines ``utt1 utt2 target|nontarget``, utt1 < utt2, LC_ALL=C sorted.
A speaker with more than 500 same-speaker pairs keeps a seeded sample of 500 (VoxCeleb1-O has 472
per speaker on average; every pair of 4,000 recordings of 10 speakers would be ~800,000): the trials
stay a size that scores in seconds and still measures an EER to a few tenths of a percent;
``--max-targets-per-spk all`` lists every pair (spkflow.corpora.trials).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import float_at_least, int_at_least, int_at_least_or_all
from spkflow.core.errors import InputError
from spkflow.corpora.trials import DEFAULT_MAX_TARGETS_PER_SPK, make_trials, write_trials
from spkflow.data.datadir import DataDir


@exits_on(InputError, ValueError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="make_trials", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("data_dir")
    p.add_argument("out", nargs="?", default=None)
    p.add_argument(
        "--max-targets-per-spk",
        type=int_at_least_or_all(1),
        default=DEFAULT_MAX_TARGETS_PER_SPK,
        help="same-speaker trials per speaker: a seeded sample of this many, or all "
        f"(default {DEFAULT_MAX_TARGETS_PER_SPK})",
    )
    p.add_argument("--nontarget-ratio", type=float_at_least(0.0), default=10.0, help="non-target trials per target")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-per-spk",
        type=int_at_least(2),
        default=None,
        help="pair a seeded sample of at most N utterances per speaker (bounds a big set's trials)",
    )
    args = p.parse_args(argv)
    setup_logging()
    out = Path(args.out) if args.out else Path(args.data_dir) / "trials"
    trials = make_trials(
        DataDir(args.data_dir).utt2spk(),
        args.nontarget_ratio,
        args.seed,
        args.max_per_spk,
        max_targets_per_spk=args.max_targets_per_spk,
    )
    write_trials(out, trials)
    ntar = sum(1 for t in trials if t[2])
    logging.info("wrote %s: %d target + %d nontarget trials", out, ntar, len(trials) - ntar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
