"""Check a recording dir (``wav.scp``, ``rttm``, ``uem``, ``reco2dur``) and summarise it (diar.sh stage 1).

    python -m spkflow.bin.diar_data [--need-rttm true] RECO_DIR

Writes ``reco2dur`` when it is missing (from the audio headers).  Exit status 1 with one line
naming the file and line on bad input: :func:`spkflow.diar.recordings.load_recordings`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import add_bool_option
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.durations import format_duration
from spkflow.data.tables import write_kv
from spkflow.diar.recordings import describe, load_recordings


@exits_on(InputError, UtteranceError, OSError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.diar_data", description=__doc__.split("\n")[0])
    p.add_argument("reco_dir")
    add_bool_option(p, "--need-rttm", default=True, help="the reference rttm must be there")
    args = p.parse_args(argv)
    setup_logging()
    rs = load_recordings(args.reco_dir, need_rttm=args.need_rttm)
    if not (Path(args.reco_dir) / "reco2dur").is_file():
        write_kv(Path(args.reco_dir) / "reco2dur", {k: format_duration(v) for k, v in rs.durations.items()})
    for note in rs.notes:
        logging.warning("%s", note)
    logging.info("%s: %s", args.reco_dir, describe(rs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
