"""Command-line front end for the data-dir utilities (argument parsing only).

    python -m spkflow.bin.datadir validate [--no-feats] [--no-text] [--no-wav] [--no-spk-sort] [--non-print] DIR
    python -m spkflow.bin.datadir fix [--utt-extra-files "a b"] [--spk-extra-files "c"] DIR
    python -m spkflow.bin.datadir subset (--first|--last|--per-spk|--speakers|--shortest|--spread) N SRC DEST
    python -m spkflow.bin.datadir subset (--utt-list|--spk-list) FILE SRC DEST
    python -m spkflow.bin.datadir combine [--extra-files "a b"] [--skip-fix] DEST SRC...
    python -m spkflow.bin.datadir copy [--utt-prefix P] [--utt-suffix S] [--spk-prefix P] [--spk-suffix S] SRC DEST

The Kaldi-style scripts in ``utils/`` call this.  Exit status 1 with a message
``file:line: problem`` on bad input.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.data.combine import combine_data, copy_data_dir
from spkflow.data.datadir import DataDir
from spkflow.data.fix import fix_data_dir
from spkflow.data.subset import subset_data_dir


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spkflow.bin.datadir", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    v = sub.add_parser("validate", help="check a data dir like Kaldi's validate_data_dir.sh")
    for flag in ("--no-feats", "--no-text", "--no-wav", "--no-spk-sort", "--non-print"):
        v.add_argument(flag, action="store_true")
    v.add_argument("--name", default="validate_data_dir.sh", help="program name used in messages")
    v.add_argument("data")

    f = sub.add_parser("fix", help="make a data dir consistent like Kaldi's fix_data_dir.sh")
    f.add_argument("--utt-extra-files", default="")
    f.add_argument("--spk-extra-files", default="")
    f.add_argument("data")

    s = sub.add_parser("subset", help="subset a data dir like Kaldi's subset_data_dir.sh")
    g = s.add_mutually_exclusive_group(required=True)
    for mode in ("first", "last", "per-spk", "speakers", "shortest", "spread"):
        g.add_argument(f"--{mode}", type=int, metavar="N")
    g.add_argument("--utt-list")
    g.add_argument("--spk-list")
    s.add_argument("src")
    s.add_argument("dest")

    c = sub.add_parser("combine", help="combine data dirs like Kaldi's combine_data.sh")
    c.add_argument("--extra-files", default="")
    c.add_argument("--skip-fix", action="store_true")
    c.add_argument("dest")
    c.add_argument("srcs", nargs="+")

    cp = sub.add_parser("copy", help="copy a data dir like Kaldi's copy_data_dir.sh (without its final validation)")
    for opt in ("--utt-prefix", "--utt-suffix", "--spk-prefix", "--spk-suffix"):
        cp.add_argument(opt, default="")
    cp.add_argument("src")
    cp.add_argument("dest")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    say = print
    try:
        if args.cmd == "validate":
            for w in DataDir(args.data).validate(
                no_feats=args.no_feats,
                no_text=args.no_text,
                no_wav=args.no_wav,
                no_spk_sort=args.no_spk_sort,
                non_print=args.non_print,
            ):
                say(f"{args.name}: WARNING: {w}")
            say(f"{args.name}: Successfully validated data-directory {args.data}")
        elif args.cmd == "fix":
            fix_data_dir(
                args.data,
                utt_extra_files=args.utt_extra_files.split(),
                spk_extra_files=args.spk_extra_files.split(),
                log=say,
            )
        elif args.cmd == "subset":
            if args.utt_list is not None or args.spk_list is not None:
                subset_data_dir(args.src, args.dest, utt_list=args.utt_list, spk_list=args.spk_list, log=say)
            else:
                for mode in ("first", "last", "per_spk", "speakers", "shortest", "spread"):
                    n = getattr(args, mode)
                    if n is not None:
                        subset_data_dir(args.src, args.dest, num_utt=n, mode=mode, log=say)
        elif args.cmd == "combine":
            combine_data(args.dest, args.srcs, extra_files=args.extra_files.split(), skip_fix=args.skip_fix, log=say)
        elif args.cmd == "copy":
            copy_data_dir(
                args.src,
                args.dest,
                utt_prefix=args.utt_prefix,
                utt_suffix=args.utt_suffix,
                spk_prefix=args.spk_prefix,
                spk_suffix=args.spk_suffix,
                log=say,
            )
    except ValueError as e:  # InputError (it names the file and line) among them
        print(f"{_script(args)}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # an unwritable destination, a full disk: the file and the reason, no traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"{_script(args)}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _script(args: argparse.Namespace) -> str:
    return {
        "validate": getattr(args, "name", "validate_data_dir.sh"),
        "fix": "fix_data_dir.sh",
        "subset": "subset_data_dir.sh",
        "combine": "combine_data.sh",
        "copy": "copy_data_dir.sh",
    }[args.cmd]


if __name__ == "__main__":
    sys.exit(main())
