"""Merge the jobs' embeddings: check them against the data dir, write the final files.

    python -m spkflow.bin.merge_embeddings [--skip-bad false] [--spk-mean raw|l2] DATA_DIR JOB_DIR OUT_DIR

Writes OUT_DIR/xvector.{ark,scp} (utt2spk order) and OUT_DIR/spk_xvector.{ark,scp} (speaker
means, spk2utt order), plus OUT_DIR/bad_utts and OUT_DIR/bad_spks when there are any.  Exit
status 1, listing the keys, when an utterance has no embedding (not excused by --skip-bad) or
an embedding has no utterance, when the jobs' embeddings come from different models (their stamps
against JOB_DIR/model.stamp), or when an output cannot be written (a full disk; then no output
file is left).  The work is :func:`spkflow.embed.run.merge_embeddings`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import boolean
from spkflow.core.errors import InputError, OutputError
from spkflow.embed.run import MergeError, merge_embeddings


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spkflow.bin.merge_embeddings",
        description="Check and merge per-job embeddings into xvector.scp + spk_xvector.scp.",
    )
    p.add_argument(
        "--skip-bad",
        type=boolean,
        default=False,
        help="utterances that failed in the jobs are listed in OUT_DIR/bad_utts instead of failing",
    )
    p.add_argument(
        "--spk-mean",
        choices=("raw", "l2"),
        default="raw",
        help="speaker means of raw vectors (ESPnet's convention) or of L2-normalised ones",
    )
    p.add_argument("data_dir")
    p.add_argument("job_dir")
    p.add_argument("out_dir")
    return p


@exits_on(MergeError, InputError, OutputError)
def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()

    rep = merge_embeddings(args.data_dir, args.job_dir, args.out_dir, skip_bad=args.skip_bad, spk_mean=args.spk_mean)
    bad = f", {len(rep.bad_utts)} bad utterance(s) left out (listed in {args.out_dir}/bad_utts)" if rep.bad_utts else ""
    logging.info(
        "%s: %d utterances, %s: %d speakers, %d dims%s",
        rep.xvector_scp,
        rep.num_utts,
        rep.spk_xvector_scp,
        rep.num_spks,
        rep.dim,
        bad,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
