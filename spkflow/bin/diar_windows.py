"""Speech regions and sliding windows of a recording dir (diar.sh stage 2).

    python -m spkflow.bin.diar_windows [--speech oracle|energy|silero] [--silero-opts onset=0.2,...]
        [--window 1.5] [--shift 0.75] [--min-window 0.5] RECO_DIR OUT_DIR

Writes ``OUT_DIR/speech`` (a data dir whose ``segments`` are the speech regions) and
``OUT_DIR/windows`` (the data dir of windows stage 5 embeds); :func:`spkflow.diar.recipe_stages.make_windows`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import float_at_least
from spkflow.core.errors import InputError, UtteranceError
from spkflow.core.threads import job_threads, limit_threads
from spkflow.diar.recipe_stages import make_windows
from spkflow.diar.speech import DETECTORS, SileroOptions


@exits_on(InputError, UtteranceError, ValueError, OSError, RuntimeError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.diar_windows", description=__doc__.split("\n")[0])
    p.add_argument("reco_dir")
    p.add_argument("out_dir")
    p.add_argument("--speech", default="oracle", choices=DETECTORS, help="speech detection")
    p.add_argument(
        "--silero-opts",
        type=SileroOptions.parse,
        default=None,
        metavar="KEY=VALUE,...",
        help="silero's rules: onset, offset, min_speech, min_silence, pad (default: spkflow.diar.speech.SileroOptions)",
    )
    p.add_argument("--window", type=float_at_least(0.1), default=1.5, help="window length (s)")
    p.add_argument("--shift", type=float_at_least(0.01), default=0.75, help="window shift (s)")
    p.add_argument("--min-window", type=float_at_least(0.01), default=0.5, help="shortest window (s)")
    args = p.parse_args(argv)
    setup_logging()
    limit_threads(job_threads())  # torch, OpenMP and BLAS pools: the job's share
    n = make_windows(
        args.reco_dir,
        args.out_dir,
        speech=args.speech,
        window=args.window,
        shift=args.shift,
        min_window=args.min_window,
        silero=args.silero_opts,
    )
    logging.info(
        "%d recordings (%d without speech): %d %s speech regions, %d windows of %.2f s every %.2f s -> %s",
        n["recordings"], n["silent"], n["regions"], args.speech, n["windows"], args.window, args.shift, args.out_dir,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
