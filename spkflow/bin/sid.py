"""Speaker identification stages on stage-5 embeddings (the work is in :mod:`spkflow.score.sid`).

    python -m spkflow.bin.sid split --spk2utt data/test/spk2utt --num-enrol 2 --seed 0 --folds 5 \\
        --outdir exp/spk_x/sid/test
    python -m spkflow.bin.sid enrol --xvector-scp exp/spk_x/embed/test/xvector.scp \\
        --sid-dir exp/spk_x/sid/test [--backend cosine|wccn|lda]
    python -m spkflow.bin.sid closed --xvector-scp ... --sid-dir exp/spk_x/sid/test
    python -m spkflow.bin.sid open --xvector-scp ... --sid-dir exp/spk_x/sid/test [--far 0.01]
    python -m spkflow.bin.sid results --sid-root exp/spk_x/sid

Argument parsing only: each subcommand is one call of :mod:`spkflow.score.sid_stages` (what
each stage writes, and that a rerun removes what it and the later stages wrote first).
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import setup_logging
from spkflow.bin.argtypes import boolean, int_at_least
from spkflow.core.errors import InputError
from spkflow.score.backend import BACKENDS
from spkflow.score.sid_stages import closed_stage, enrol_stage, open_stage, split_stage, write_results

log = logging.getLogger("spkflow.score.sid")


def _run(args: argparse.Namespace) -> None:
    """The one call of the subcommand."""
    if args.command == "split":
        split_stage(args.spk2utt, args.outdir, args.num_enrol, args.seed, args.folds)
    elif args.command == "enrol":
        enrol_stage(args.xvector_scp, args.sid_dir, args.backend, args.lda_dim)
    elif args.command == "closed":
        closed_stage(args.xvector_scp, args.sid_dir, args.plots)
    elif args.command == "open":
        open_stage(args.xvector_scp, args.sid_dir, args.backend, args.lda_dim, args.far)
    else:
        write_results(args.sid_root, args.title)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.sid", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="seeded enrolment/test split and open-set folds")
    s.add_argument("--spk2utt", required=True)
    s.add_argument("--num-enrol", type=int_at_least(1), default=2, help="K enrolment utterances per speaker")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--folds", type=int_at_least(2), default=5, help="open-set folds (1/folds of speakers held out)")
    s.add_argument("--outdir", required=True)
    for name, help_ in (
        ("enrol", "fit the backend on enrolment embeddings, write speaker models"),
        ("closed", "closed-set identification of the test utterances"),
        ("open", "open-set identification over the folds"),
    ):
        c = sub.add_parser(name, help=help_)
        c.add_argument("--xvector-scp", required=True, help="stage-5 utterance embeddings of the set")
        c.add_argument("--sid-dir", required=True, help="the split's directory (outputs go there too)")
        if name != "closed":
            c.add_argument("--backend", choices=BACKENDS, default="cosine")
            c.add_argument("--lda-dim", type=int_at_least(0), default=0, help="0: min(D, speakers - 1)")
        if name == "open":
            c.add_argument("--far", type=float, default=0.01, help="false-alarm rate the threshold is set for")
        if name == "closed":
            c.add_argument("--plots", type=boolean, default=True)
    r = sub.add_parser("results", help="RESULTS.md from <sid-root>/*/metrics.json")
    r.add_argument("--sid-root", required=True)
    r.add_argument("--title", default="")
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()

    try:
        _run(args)
    except (InputError, ValueError) as err:
        log.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
