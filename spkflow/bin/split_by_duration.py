"""Split a data dir's utterances into NJ consecutive lists of about equal audio duration.

    python -m spkflow.bin.split_by_duration DATA_DIR NJ OUT_DIR   # writes OUT_DIR/utts.{1..NJ}

Durations come from utt2dur when present, else utt2num_frames, else file headers and segment times
(see :func:`spkflow.data.jobs.utterance_durations`).
"""

from __future__ import annotations

import argparse
import sys

from spkflow.bin import exits_on
from spkflow.core.errors import InputError
from spkflow.data.jobs import write_split


@exits_on(InputError, ValueError, say="split_by_duration")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dir")
    p.add_argument("nj", type=int)
    p.add_argument("out_dir")
    a = p.parse_args(argv)
    write_split(a.data_dir, a.out_dir, a.nj)
    return 0


if __name__ == "__main__":
    sys.exit(main())
