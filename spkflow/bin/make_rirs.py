"""Simulate room impulse responses (pyroomacoustics, image-source model) into a Kaldi data dir.

    python -m spkflow.bin.make_rirs [--num 200] [--seed 0] [--sample-rate 16000] \\
        [--rt60 0.2 0.8] [--room-xy 3 10] [--room-z 2.4 4] --out data/rirs

Writes ``OUT/audio/rirNNNNN.flac`` and ``OUT/{wav.scp,utt2spk,spk2utt,utt2dur,info.txt}``
(:mod:`spkflow.augment.sources`); the same options give the same RIRs.  Use ``OUT`` as
``augment.reverb.data_dir`` of a training config.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from spkflow.augment.sources import simulate_rirs, write_source_dir
from spkflow.bin import setup_logging
from spkflow.bin.argtypes import int_at_least


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="make_rirs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, help="data dir to write")
    p.add_argument("--num", type=int_at_least(1), default=200, help="number of rooms")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-rate", type=int_at_least(1000), default=16000)
    p.add_argument("--rt60", type=float, nargs=2, default=(0.2, 0.8), metavar=("LO", "HI"), help="seconds")
    p.add_argument("--room-xy", type=float, nargs=2, default=(3.0, 10.0), metavar=("LO", "HI"), help="metres")
    p.add_argument("--room-z", type=float, nargs=2, default=(2.4, 4.0), metavar=("LO", "HI"), help="metres")
    args = p.parse_args(argv)
    setup_logging()
    for name in ("rt60", "room_xy", "room_z"):
        lo, hi = getattr(args, name)
        if not 0 < lo <= hi:
            p.error(f"--{name.replace('_', '-')}: need 0 < LO <= HI, got {lo} {hi}")

    t0 = time.time()
    rooms = []

    def items():
        for key, h, info in simulate_rirs(
            args.num, args.seed, args.sample_rate, tuple(args.rt60), tuple(args.room_xy), tuple(args.room_z)
        ):
            rooms.append(f"{key} " + " ".join(f"{k}={v:.3f}" for k, v in info.items()))
            if len(rooms) % 50 == 0:
                logging.info("%d/%d rooms (%.0f s)", len(rooms), args.num, time.time() - t0)
            yield key, h

    info = (
        f"# made by: python -m spkflow.bin.make_rirs {' '.join(argv if argv is not None else sys.argv[1:])}\n"
        "# image-source shoebox rooms (pyroomacoustics); per RIR: room size (m), RT60 (s), distance (m)\n"
    )
    out = write_source_dir(args.out, items(), args.sample_rate, info)
    with open(out / "info.txt", "a", encoding="utf-8") as f:
        f.write("".join(r + "\n" for r in rooms))
    logging.info("wrote %d RIRs to %s in %.0f s", len(rooms), out, time.time() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
