"""Filter, sort and verify embedding scp files against a data dir.

    python -m spkflow.bin.align_embed_scp [--check-only] DATA_DIR SCP [SCP ...]

Each SCP keeps only the data dir's keys (utterances, or speakers for a file of speaker ids such
as spk_xvector.scp), in the data dir's LC_ALL=C order, and must then list every key: otherwise
the first differing line is reported, the file is left untouched and the exit status is 1.
No set names, no ``text`` file needed.  The work is :func:`spkflow.embed.run.align_scp`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import setup_logging
from spkflow.core.errors import InputError
from spkflow.embed.run import align_scp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m spkflow.bin.align_embed_scp",
        description="Filter, sort and verify embedding scp files against a data dir.",
    )
    p.add_argument("--check-only", action="store_true", help="verify, do not rewrite the files")
    p.add_argument("data_dir")
    p.add_argument("scp", nargs="+")
    args = p.parse_args(argv)
    setup_logging()

    status = 0
    for scp in args.scp:
        try:
            logging.info("%s", align_scp(args.data_dir, scp, write=not args.check_only))
        except InputError as err:
            logging.error("%s", err)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
