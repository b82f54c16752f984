"""Who spoke when: one RTTM per recording, with a speaker embedder and its scoring.

    python -m spkflow.bin.diarize --model MODEL --out OUT_DIR [--speech silero|energy|RTTM|DIR]
        [--gallery GALLERY] [--plot PLOT_DIR] [--progress true] [--num-speakers K] [--max-speakers 8]
        [--method spectral|ahc|gmm] [--threshold LLR] [--window 1.5] [--shift 0.75] [--domain-mean PATH]
        [--overwrite false] FILE...

MODEL: anything :meth:`spkflow.Embedder.from_pretrained` loads (a model dir, a pack, another
toolkit's model).  Writes ``OUT_DIR/<id>.rttm`` per FILE, the recording id being the file's stem
with whitespace made ``_`` (two files with one id are refused), and prints each RTTM's path on
standard output as it is written (the logs and progress bars go to standard error; with
``--progress false``, warnings only).  ``--speech``: a detector (see ``--help`` for the default),
or an RTTM file or a folder of ``<id>.rttm`` files whose turns' union is the speech of each
recording (oracle speech; also the reference of ``--plot``).  ``--gallery``: a saved enrolment
(``identify --save``): each speaker is named by the enrolled speaker the calibrated evidence
picks, two never by one name, ``unknown_<k>`` otherwise (:mod:`spkflow.diar.naming`).
``--plot PLOT_DIR``: a timeline ``<id>.png`` per recording.  Every input is checked before
anything is written; a file in OUT_DIR (or PLOT_DIR) that spkflow did not write is refused unless
``--overwrite true``; a rerun keeps the RTTMs an earlier run finished with the same model, options
and files.  The work and the defaults: :mod:`spkflow.diar.file_list` over
:mod:`spkflow.diar.pipeline` (the diarization recipe's code).  Exit status 1 with one line naming
the file on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys

from tqdm.contrib.logging import logging_redirect_tqdm

from spkflow.api import Embedder
from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import add_bool_option, finite_float, float_at_least, int_at_least
from spkflow.core.errors import InputError, OutputError, UtteranceError
from spkflow.core.lock import LockError
from spkflow.core.threads import job_threads, limit_threads
from spkflow.diar.file_list import Done, diarize_files
from spkflow.diar.pipeline import METHODS, Settings
from spkflow.diar.speech import DEFAULT_DETECTOR


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.diarize", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, packed .zip, or another toolkit's model")
    p.add_argument("--out", required=True, help="output folder: <id>.rttm per recording")
    p.add_argument(
        "--speech",
        default=DEFAULT_DETECTOR,
        help=f"silero | energy | an RTTM file | a folder of <id>.rttm (default: {DEFAULT_DETECTOR})",
    )
    p.add_argument("--gallery", default=None, help="a saved enrolment (identify --save) to name the speakers by")
    p.add_argument("--plot", default=None, metavar="PLOT_DIR", help="write a timeline <id>.png per recording here")
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
        "(default: the windows of all the files given when 600 or more, else the training mean, which merges "
        "speakers of corpora unlike the training data's)",
    )
    add_bool_option(p, "--overwrite", default=False, help="replace files in --out / --plot that spkflow did not write")
    add_bool_option(
        p, "--progress", default=True, help="progress bars and a log line per recording (false: warnings only)"
    )
    p.add_argument("--toolkit", default=None, help="spkflow | espnet | speechbrain | wespeaker (default: detected)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("files", nargs="+", metavar="FILE", help="audio files (any format make_data_dir reads)")
    return p


@exits_on(InputError, UtteranceError, OutputError, LockError, ValueError, OSError, RuntimeError)
def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging(logging.INFO if args.progress else logging.WARNING)
    limit_threads(job_threads())  # torch, OpenMP and BLAS pools: the job's share
    a = args
    settings = Settings(a.method, a.num_speakers, a.max_speakers, a.threshold, a.window, a.shift)  # field order
    emb = Embedder.from_pretrained(args.model, device=args.device, toolkit=args.toolkit)
    with logging_redirect_tqdm() if args.progress else contextlib.nullcontext():  # log lines above the bars
        done = _run(emb, args, settings)
    logging.info("%d recordings diarized into %s", len(done), args.out)
    return 0


def _run(emb: Embedder, args: argparse.Namespace, settings: Settings) -> list[Done]:
    return diarize_files(
        emb,
        args.files,
        args.out,
        speech=args.speech,
        settings=settings,
        domain=args.domain_mean,
        gallery=args.gallery,
        overwrite=args.overwrite,
        plot_dir=args.plot,
        progress=args.progress,
        on_done=lambda d: print(d.rttm, flush=True),  # the result, as each is written
    )


if __name__ == "__main__":
    sys.exit(main())
