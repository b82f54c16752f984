"""Generate coloured noise (white, pink, brown) into a Kaldi data dir, an offline noise source.

    python -m spkflow.bin.make_noise [--num 60] [--seconds 10] [--seed 0] \\
        [--colours white pink brown] [--sample-rate 16000] --out data/noise_coloured

Writes ``OUT/audio/<colour>NNNN.flac`` and ``OUT/{wav.scp,utt2spk,spk2utt,utt2dur,info.txt}``
(:mod:`spkflow.augment.sources`); the same options give the same noise.  Use ``OUT`` as an
``augment.noise.data_dirs`` entry of a training config.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.augment.sources import NOISE_COLOURS, noise_items, write_source_dir
from spkflow.bin import setup_logging
from spkflow.bin.argtypes import int_at_least


def main(argv: list[str] | None = None) -> int:

    p = argparse.ArgumentParser(
        prog="make_noise", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, help="data dir to write")
    p.add_argument("--num", type=int_at_least(1), default=60, help="number of recordings")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each recording")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--colours", nargs="+", default=list(NOISE_COLOURS), choices=list(NOISE_COLOURS))
    p.add_argument("--sample-rate", type=int_at_least(1000), default=16000)
    args = p.parse_args(argv)
    setup_logging()
    if args.seconds <= 0:
        p.error(f"--seconds must be > 0, got {args.seconds}")
    info = f"# made by: python -m spkflow.bin.make_noise {' '.join(argv if argv is not None else sys.argv[1:])}\n"
    out = write_source_dir(
        args.out, noise_items(args.num, args.seconds, args.seed, args.sample_rate, args.colours), args.sample_rate, info
    )
    logging.info("wrote %d noise recordings to %s", args.num, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
