"""Prepare a Kaldi data dir from a corpus folder: the one route from a corpus to a data dir.

    python -m spkflow.bin.prepare_corpus CORPUS [options] CORPUS_DIR OUT_DIR
    python -m spkflow.bin.prepare_corpus CORPUS --help      # that corpus's layout and options

Finds the corpus folder (or clones its public release with --download true), collects the
utterances (spkflow.corpora.<module>), writes and validates the data dir beside OUT_DIR and renames
it into place (an existing OUT_DIR is replaced only when spkflow wrote it, or with --overwrite;
spkflow.corpora.destination), and prints a summary.  Exit status 1 on bad input, with the file
(and line) named; nothing is changed then.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import setup_logging
from spkflow.bin.argtypes import add_bool_option, boolean
from spkflow.core.errors import InputError, OutputError, UtteranceError
from spkflow.corpora import CORPORA, collect, spec
from spkflow.corpora.base import CorpusSpec, summary, write_data_dir
from spkflow.corpora.destination import check_destination
from spkflow.corpora.fetch import CorpusNotFound, ensure_corpus


def _add_corpus_parser(sub: argparse._SubParsersAction, s: CorpusSpec) -> None:
    p = sub.add_parser(
        s.name,
        help=s.layout,
        description=f"{s.name} ({s.db_var} in db.sh): {s.layout}",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("corpus_dir", help=f"the corpus folder (db.sh: {s.db_var})")
    p.add_argument("out_dir", help="the data dir to write (replaced only when spkflow wrote it, or --overwrite)")
    for o in s.options:
        flag = "--" + o.name.replace("_", "-")
        kind = {"bool": boolean, "list": str}.get(o.kind, str)
        metavar = None if o.choices else ("true|false" if o.kind == "bool" else o.name.upper())
        p.add_argument(
            flag, dest=f"opt_{o.name}", type=kind, default=o.default, choices=o.choices, metavar=metavar, help=o.help
        )
    p.add_argument("--utt2dur", type=boolean, metavar="true|false", default=True, help="write utt2dur (true|false)")
    p.add_argument(
        "--text", type=boolean, metavar="true|false", default=True, help="write text when every utterance has one"
    )
    p.add_argument(
        "--trials", type=boolean, metavar="true|false", default=False, help="also write a sampled trials list"
    )
    p.add_argument("--nontarget-ratio", type=float, default=10.0, help="non-target pairs per target pair (max)")
    p.add_argument("--trials-seed", type=int, default=0, help="seed of the non-target sample")
    p.add_argument(
        "--download",
        type=boolean,
        metavar="true|false",
        default=False,
        help="clone the public release when CORPUS_DIR is missing",
    )
    p.add_argument("--download-timeout", type=float, default=30.0, help="seconds allowed to reach the host")
    add_bool_option(
        p, "--overwrite", default=False, help="replace an existing OUT_DIR that spkflow did not write, and all in it"
    )
    p.set_defaults(spec=s)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prepare_corpus", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="corpus", required=True, metavar="CORPUS", help=" | ".join(CORPORA))
    for name in CORPORA:
        _add_corpus_parser(sub, spec(name))
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()
    s: CorpusSpec = args.spec
    opts: dict[str, object] = {}
    for o in s.options:
        v = getattr(args, f"opt_{o.name}")
        opts[o.name] = v.split() if o.kind == "list" and isinstance(v, str) else v
    try:
        marker = s.marker.format(**opts)
        check_destination(args.out_dir, overwrite=args.overwrite, sources=[args.corpus_dir])  # before any work
        ensure_corpus(args.corpus_dir, marker, s.db_var, s.url, args.download, args.download_timeout)
        data = collect(s.name, args.corpus_dir, **opts)
        d = write_data_dir(
            data,
            args.out_dir,
            utt2dur=args.utt2dur,
            text=args.text,
            trials=args.trials,
            nontarget_ratio=args.nontarget_ratio,
            seed=args.trials_seed,
            progress=sys.stderr.isatty(),
            overwrite=args.overwrite,
            sources=[args.corpus_dir],
        )
    except CorpusNotFound as exc:
        logging.error("Error: %s", exc)
        return 1
    except (InputError, UtteranceError, OutputError, ValueError, OSError) as exc:
        logging.error("%s", exc)
        return 1
    logging.info("validated; wrote %s", summary(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
