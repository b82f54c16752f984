"""Write DATA_DIR/utt2dur (seconds per utterance) from wav.scp (+ segments).

    python -m spkflow.bin.compute_utt2dur DATA_DIR

Durations come from audio headers without decoding; segments from their times; pipes are decoded.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.durations import write_utt2dur


@exits_on(InputError, UtteranceError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="compute_utt2dur", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("data_dir")
    args = p.parse_args(argv)
    setup_logging()
    path = write_utt2dur(args.data_dir, progress=sys.stderr.isatty())
    logging.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
