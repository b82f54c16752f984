"""Simulated conversations from a data dir of single-speaker utterances (diar.sh stage 1).

    python -m spkflow.bin.simulate_conversations --stats STATS.json [--num-recordings 8]
        [--min-speakers 2] [--max-speakers 6] [--duration 60] [--seed 0] [--prefix sim]
        POOL_DATA_DIR AUDIO_DIR OUT_RECO_DIR

``STATS.json``: turn-taking statistics of real meetings (``python -m spkflow.bin.turn_statistics``).
Deterministic by seed: :mod:`spkflow.sim.conversations`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import float_at_least, int_at_least
from spkflow.core.errors import InputError, UtteranceError
from spkflow.sim.conversations import load_statistics, simulate_set


@exits_on(InputError, UtteranceError, ValueError, OSError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.simulate_conversations", description=__doc__.split("\n")[0])
    p.add_argument("pool")
    p.add_argument("audio_dir")
    p.add_argument("out_dir")
    p.add_argument("--stats", required=True)
    p.add_argument("--num-recordings", type=int_at_least(1), default=8)
    p.add_argument("--min-speakers", type=int_at_least(1), default=2)
    p.add_argument("--max-speakers", type=int_at_least(1), default=6)
    p.add_argument("--duration", type=float_at_least(1.0), default=60.0, help="seconds per conversation (at least)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="sim")
    args = p.parse_args(argv)
    setup_logging()
    counts = simulate_set(
        args.pool, load_statistics(args.stats), args.out_dir, args.audio_dir,
        num_recordings=args.num_recordings, min_speakers=args.min_speakers, max_speakers=args.max_speakers,
        duration=args.duration, seed=args.seed, prefix=args.prefix,
    )  # fmt: skip
    logging.info("%d conversations of %s speakers -> %s", len(counts), sorted(set(counts.values())), args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
