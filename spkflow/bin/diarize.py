"""Who spoke when: one RTTM per recording, with a speaker embedder and its scoring.

    python -m spkflow.bin.diarize --model MODEL --out OUT_DIR [--speech energy|silero|RTTM|DIR]
        [--num-speakers K] [--max-speakers 8] [--method spectral|ahc|gmm] [--threshold LLR]
        [--window 1.5] [--shift 0.75] [--domain-mean PATH] [--overwrite false] FILE...

MODEL: anything :meth:`spkflow.Embedder.from_pretrained` loads (a model dir, a pack, another
toolkit's model).  Writes ``OUT_DIR/<id>.rttm`` per FILE, the recording id being the file's stem
with whitespace made ``_`` (two files with one id are refused).  ``--speech``: a detector
(``energy``, the default: the project's energy VAD; ``silero``), or an RTTM file or a folder of
``<id>.rttm`` files whose turns' union is the speech of each recording (oracle speech).  Every
input is checked before anything is written; an RTTM in OUT_DIR that spkflow did not write is
refused unless ``--overwrite true``; a rerun keeps the RTTMs an earlier run finished with the same
model, options and files.  The work and the defaults: :mod:`spkflow.diar.file_list` over
:mod:`spkflow.diar.pipeline` (the diarization recipe's code).  Exit status 1 with one line naming
the file on bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.api import Embedder
from spkflow.bin import setup_logging
from spkflow.bin.argtypes import add_bool_option, finite_float, float_at_least, int_at_least
from spkflow.core.errors import InputError, OutputError, UtteranceError
from spkflow.core.lock import LockError
from spkflow.diar.file_list import diarize_files
from spkflow.diar.pipeline import METHODS, Settings


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.diarize", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, packed .zip, or another toolkit's model")
    p.add_argument("--out", required=True, help="output folder: <id>.rttm per recording")
    p.add_argument("--speech", default="energy", help="energy | silero | an RTTM file | a folder of <id>.rttm")
    p.add_argument("--num-speakers", type=int_at_least(1), default=None, help="the speaker count (default: estimated)")
    p.add_argument("--max-speakers", type=int_at_least(1), default=8, help="bound on the estimated count")
    p.add_argument(
        "--method",
        default=None,
        choices=METHODS,
        help="clustering (default: ahc stopped at the calibrated LLR when the model has a calibration, else gmm: "
        "stopped by a two-component fit of the recording's own scores)",
    )
    p.add_argument(
        "--threshold",
        type=finite_float,
        default=None,
        help="where ahc stops: an LLR (a score without calibration) tuned on held-out recordings "
        "(default: the model's calibrated decision)",
    )
    p.add_argument("--window", type=float_at_least(0.1), default=1.5, help="window length (s)")
    p.add_argument("--shift", type=float_at_least(0.01), default=0.75, help="window shift (s), at most --window")
    p.add_argument(
        "--domain-mean",
        default=None,
        metavar="PATH",
        help="recordings like these to centre on: a data dir, an embedding scp or a gallery (identify --save) "
        "(default: the training mean, which merges speakers of corpora unlike the training data's)",
    )
    add_bool_option(p, "--overwrite", default=False, help="replace RTTMs in --out that spkflow did not write")
    p.add_argument("--toolkit", default=None, help="spkflow | espnet | speechbrain | wespeaker (default: detected)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("files", nargs="+", metavar="FILE", help="audio files (any format make_data_dir reads)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()
    try:
        a = args
        settings = Settings(a.method, a.num_speakers, a.max_speakers, a.threshold, a.window, a.shift)  # field order
        emb = Embedder.from_pretrained(args.model, device=args.device, toolkit=args.toolkit)
        done = diarize_files(
            emb,
            args.files,
            args.out,
            speech=args.speech,
            settings=settings,
            domain=args.domain_mean,
            overwrite=args.overwrite,
        )
    except (InputError, UtteranceError, OutputError, LockError, ValueError, OSError, RuntimeError) as err:
        logging.error("%s", err)
        return 1
    for d in done:
        logging.info("%s: %d speakers, %d turns%s", d.rttm, d.speakers, d.turns, " (kept)" if d.kept else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
