"""Prepare a Kaldi data dir from a corpus folder (front end of :mod:`spkflow.corpora`).

python -m spkflow.bin.prepare_corpus [--split test] [--trials] CORPUS CORPUS_DIR OUT_DIR
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.corpora import CORPORA, collect
from spkflow.corpora.base import summary, write_data_dir
from spkflow.errors import InputError, UtteranceError


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prepare_corpus", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("corpus", choices=CORPORA)
    p.add_argument("corpus_dir", help="the corpus folder")
    p.add_argument("out_dir", help="the data dir to write (previous contents go to OUT_DIR/.backup)")
    p.add_argument("--split", default=None, help="speechocean762: train | test")
    p.add_argument("--subsets", default=None, help="librispeech: space-separated subset names (default: all)")
    p.add_argument("--rounds", default=None, help="dspspeech20: space-separated rounds to keep (default: all)")
    p.add_argument(
        "--exclude-speakers",
        default=None,
        help="dspspeech20: space-separated speakers to leave out (default: 15307130191)",
    )
    p.add_argument("--no-utt2dur", dest="utt2dur", action="store_false", help="do not write utt2dur")
    p.add_argument("--no-text", dest="text", action="store_false", help="do not write text")
    p.add_argument("--trials", action="store_true", help="also write a trials list")
    p.add_argument("--nontarget-ratio", type=float, default=10.0, help="non-target pairs per target pair (max)")
    p.add_argument("--seed", type=int, default=0, help="seed of the non-target sample")
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s (%(module)s:%(lineno)d) %(levelname)s: %(message)s")
    opts: dict[str, object] = {}
    if args.corpus == "speechocean762":
        opts["split"] = args.split or "train"
    elif args.split:
        get_parser().error("--split applies to speechocean762 only")
    if args.subsets is not None:
        opts["subsets"] = args.subsets.split()
    if args.rounds is not None:
        opts["rounds"] = args.rounds.split()
    if args.exclude_speakers is not None:
        opts["exclude_speakers"] = args.exclude_speakers.split()
    try:
        data = collect(args.corpus, args.corpus_dir, **opts)
        d = write_data_dir(
            data,
            args.out_dir,
            utt2dur=args.utt2dur,
            text=args.text,
            trials=args.trials,
            nontarget_ratio=args.nontarget_ratio,
            seed=args.seed,
            progress=sys.stderr.isatty(),
        )
    except (InputError, UtteranceError, ValueError, FileNotFoundError) as exc:
        logging.error("%s", exc)
        return 1
    except TypeError as exc:  # an option the corpus does not take
        logging.error("%s: %s", args.corpus, exc)
        return 2
    logging.info("wrote %s", summary(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
