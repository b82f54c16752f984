"""One extraction job: embed a list of utterances of a data dir into a job directory.

    python -m spkflow.bin.extract_embeddings [--toolkit T] --model-dir MODEL \\
        [--keys exp/spk_x/embed/test/jobs/utts.3 --job-id 3] [--device cpu|cuda] \\
        [--batch-size 32] [--max-frames 3000] [--num-workers 1] [--num-threads 1] \\
        [--dtype float32|bfloat16|float16] [--fbank-on auto|workers|device] [--skip-bad false] \\
        [--model-file F] [--feats-dir D] [--trim-silences true|false] DATA_DIR JOB_DIR

Normally started by ``scripts/spk/extract_embeddings.sh`` through ``$cmd JOB=1:N``; the merge
(``spkflow.bin.merge_embeddings``) writes the final ``xvector.scp``.  Utterances already
committed in JOB_DIR (by any job) are skipped, so re-running resumes.  Exit status 1 on bad
input or a full disk (the message names the utterance or file; a model that cannot be loaded,
e.g. a truncated or code-holding weights file, is reported as "cannot load the model: FILE: ...",
which extract_embeddings.sh tells apart: re-running cannot help there), 2 on bad arguments.
The model is opened by :func:`spkflow.embed.open_embedder` (any model it takes but our ONNX
export; a pack is unpacked once, into the cache); the work is :func:`spkflow.embed.run.run_job`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import setup_logging
from spkflow.bin.argtypes import add_bool_option, boolean, int_at_least
from spkflow.core.checks import ConfigError
from spkflow.core.errors import InputError, OutputError, UtteranceError
from spkflow.core.threads import limit_threads
from spkflow.embed import TOOLKITS, open_embedder
from spkflow.embed.base import DTYPES, default_max_frames
from spkflow.embed.native import FBANK_ON
from spkflow.embed.run import job_utterances, run_job

_positive = int_at_least(1)
_non_negative = int_at_least(0)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spkflow.bin.extract_embeddings",
        description="Embed the utterances of one job (batched, resumable).",
    )
    p.add_argument(
        "--toolkit", choices=TOOLKITS, default=None, help="the model's toolkit (default: told from its files)"
    )
    p.add_argument(
        "--model-dir",
        required=True,
        help="the model: a dir (ours or another toolkit's), our pack (.zip) or a WeSpeaker .onnx "
        "(spkflow.embed.open_embedder)",
    )
    p.add_argument(
        "--model-file",
        default=None,
        help="espnet: weights file (default: DIR/model.pth or the only *.pth); "
        "wespeaker: the .onnx (default: the only one)",
    )
    p.add_argument("--feats-dir", default=None, help="spkflow: read feats.scp (+ vad.scp) here instead of audio")
    p.add_argument("--keys", default=None, help="file whose first fields are this job's utterances (default: all)")
    p.add_argument("--job-id", default="1", help="job number (names the outputs)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (cuda = first visible device)")
    p.add_argument("--batch-size", type=_positive, default=32, help="utterances per batch")
    p.add_argument(
        "--max-frames",
        type=_positive,
        default=None,
        help="bound on padded 10 ms frames per batch (batch size x longest utterance); "
        "default 3000 on cpu, 60000 on cuda, divided by the encoder's frames per 10 ms (RawNet3: 10)",
    )
    p.add_argument(
        "--num-workers",
        type=_non_negative,
        default=None,
        help="DataLoader worker processes (0: in process); default 1 on cpu, 4 on cuda (keeps the GPU fed)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="model precision through autocast (float16: cuda only); embeddings are written float32",
    )
    p.add_argument(
        "--fbank-on",
        choices=FBANK_ON,
        default="auto",
        help="spkflow: where fbank, VAD and frontend run: workers (numpy, per utterance in the DataLoader "
        "workers), device (torch, batched on the model's device; workers only decode and pad), "
        "auto (device on cuda when reading audio, else workers)",
    )
    p.add_argument("--num-threads", type=_positive, default=1, help="torch threads of the model")
    p.add_argument("--trim-silences", type=boolean, default=None, help="resemblyzer: webrtcvad trimming (default true)")
    p.add_argument("--skip-bad", type=boolean, default=False, help="list unreadable utterances instead of failing")
    add_bool_option(p, "--progress", default=True, old_negative="--no-progress", help="tqdm progress bar")
    p.add_argument("data_dir", help="Kaldi data directory")
    p.add_argument("job_dir", help="directory of the jobs' partial outputs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()

    limit_threads(args.num_threads)  # torch (loaded above), OpenMP and BLAS pools
    try:
        utts = job_utterances(args.data_dir, args.keys)
        try:
            embedder = open_embedder(
                args.model_dir,
                args.toolkit,
                args.device,
                jobs=True,
                model_file=args.model_file,
                feats_dir=args.feats_dir,
                dtype=args.dtype,
                num_threads=args.num_threads,
                fbank_on=args.fbank_on,
                trim_silences=args.trim_silences,
            )
        except (InputError, ConfigError, FileNotFoundError, ValueError) as err:
            logging.error("cannot load the model: %s", err)  # the stage script looks for this phrase
            return 1
        logging.info(
            "model %s (%s) on %s in %s, %d-dim embeddings%s",
            args.model_dir,
            embedder.name,
            args.device,
            args.dtype,
            embedder.dim,
            {"device": "; fbank on the device", "workers": "; fbank in the loader workers"}.get(
                getattr(embedder, "fbank_on", ""), ""
            ),
        )
        on_cuda = args.device.startswith("cuda")
        max_frames = args.max_frames or default_max_frames(embedder, args.device)
        run_job(
            embedder,
            args.data_dir,
            utts,
            args.job_dir,
            args.job_id,
            batch_size=args.batch_size,
            max_frames=max_frames,
            num_workers=args.num_workers if args.num_workers is not None else (4 if on_cuda else 1),
            skip_bad=args.skip_bad,
            progress=args.progress,
        )
    except UtteranceError as err:
        logging.error("%s (use --skip-bad true to leave it out and list it in bad_utts)", err)
        return 1
    except (InputError, ConfigError, OutputError, FileNotFoundError, RuntimeError, ValueError) as err:
        logging.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
