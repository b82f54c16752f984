"""Who spoke when: one RTTM per recording, with a speaker embedder and its scoring.

    python -m spkflow.bin.diarize --model MODEL --out OUT_DIR [--speech energy|silero|RTTM|DIR]
        [--num-speakers K] [--max-speakers 8] [--method spectral|ahc] [--threshold LLR] [--domain-mean PATH] FILE...

MODEL: anything :meth:`spkflow.Embedder.from_pretrained` loads (a model dir, a pack, another
toolkit's model).  Writes ``OUT_DIR/<stem>.rttm`` per FILE (the recording id is the file's stem;
two files with one stem are refused).  ``--speech``: a detector (``energy``, the default: the
project's energy VAD; ``silero``), or an RTTM file or a folder of ``<stem>.rttm`` files whose
turns' union is the speech of each recording (oracle speech).  The work is the diarization
recipe's (:func:`spkflow.diar.steps.diarize_wave`).  Exit status 1 with one line naming the file
on bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from spkflow.api import Embedder
from spkflow.bin import setup_logging
from spkflow.bin.argtypes import finite_float, int_at_least
from spkflow.core.errors import InputError, UtteranceError
from spkflow.diar.files import diarize_files


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.diarize", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, packed .zip, or another toolkit's model")
    p.add_argument("--out", required=True, help="output folder: <stem>.rttm per recording")
    p.add_argument("--speech", default="energy", help="energy | silero | an RTTM file | a folder of <stem>.rttm")
    p.add_argument("--num-speakers", type=int_at_least(1), default=None, help="the speaker count (default: estimated)")
    p.add_argument("--max-speakers", type=int_at_least(1), default=8, help="bound on the estimated count")
    p.add_argument(
        "--method",
        default=None,
        choices=("spectral", "ahc"),
        help="clustering (default: ahc stopped at the calibrated LLR when the model has a calibration, else spectral)",
    )
    p.add_argument(
        "--threshold",
        type=finite_float,
        default=None,
        help="where ahc stops: an LLR (a score without calibration) tuned on held-out recordings "
        "(default: the model's calibrated decision)",
    )
    p.add_argument(
        "--domain-mean",
        default=None,
        metavar="PATH",
        help="recordings like these to centre on: a data dir, an embedding scp or a gallery (identify --save) "
        "(default: the training mean, which merges speakers of corpora unlike the training data's)",
    )
    p.add_argument("--toolkit", default=None, help="spkflow | espnet | speechbrain | wespeaker (default: detected)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("files", nargs="+", metavar="FILE", help="recordings (anything the project reads)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()
    try:
        emb = Embedder.from_pretrained(args.model, device=args.device, toolkit=args.toolkit)
        done = diarize_files(
            emb.diarize,
            args.files,
            Path(args.out),
            speech=args.speech,
            num_speakers=args.num_speakers,
            max_speakers=args.max_speakers,
            method=args.method,
            threshold=args.threshold,
            domain=args.domain_mean,
        )
    except (InputError, UtteranceError, ValueError, OSError, RuntimeError) as err:
        logging.error("%s", err)
        return 1
    for rttm, n_spk, n_turns in done:
        logging.info("%s: %d speakers, %d turns", rttm, n_spk, n_turns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
