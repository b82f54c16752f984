"""One feature-extraction job: fbank + energy VAD + per-utterance CMVN stats into kaldiio arks.

    python -m spkflow.bin.compute_fbank [--fbank-conf F] [--vad-conf F] [--compress true|false]
        [--compression-method 3] [--skip-bad true|false] DATA_DIR UTT_LIST ARK_DIR NAME JOB

Writes ARK_DIR/{raw_fbank,vad,cmvn_utt,cmvn_utt_voiced}_NAME.JOB.{ark,scp},
ARK_DIR/utt2num_frames_NAME.JOB, ARK_DIR/bad_utts_NAME.JOB and ARK_DIR/stamp_NAME.JOB (see
spkflow.features.jobs).  Exit status 1 names the first bad utterance (unless --skip-bad true), or
the file that could not be written (a full disk).
"""

from __future__ import annotations

import argparse
import sys

from spkflow.bin import exits_on
from spkflow.bin.argtypes import add_bool_option, boolean
from spkflow.core.errors import InputError, OutputError, UtteranceError
from spkflow.core.threads import job_threads, limit_threads
from spkflow.features.fbank import FbankOptions, VadOptions
from spkflow.features.jobs import DEFAULT_COMPRESSION_METHOD, extract_job, fbank_stamp


def add_options(p: argparse.ArgumentParser) -> None:
    """The options that shape the features (shared with ``merge_fbank``, which checks the jobs' stamps)."""
    p.add_argument("--fbank-conf", default="", help="Kaldi-style fbank options (default: FbankOptions())")
    p.add_argument("--vad-conf", default="", help="Kaldi-style compute-vad options (default: VadOptions())")
    p.add_argument("--compress", type=boolean, default=False, help="Kaldi-compress the feature matrices")
    p.add_argument(
        "--compression-method",
        type=int,
        default=DEFAULT_COMPRESSION_METHOD,
        help="Kaldi CompressionMethod for --compress true: 3 two-byte (default), 1 Kaldi's automatic "
        "(1-byte per-column), 2 kSpeechFeature, 5 one-byte",
    )


def options(a: argparse.Namespace) -> tuple[FbankOptions, VadOptions]:
    fbank = FbankOptions.from_kaldi_conf(a.fbank_conf) if a.fbank_conf else FbankOptions()
    vad = VadOptions.from_kaldi_conf(a.vad_conf) if a.vad_conf else VadOptions()
    return fbank, vad


def stamp(a: argparse.Namespace) -> str:
    """The stamp the jobs of these options record (:func:`spkflow.features.jobs.fbank_stamp`)."""
    fbank, vad = options(a)
    return fbank_stamp(fbank, vad, a.compress, a.compression_method)


@exits_on(InputError, UtteranceError, OutputError, ValueError, say="compute_fbank: ERROR")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p)
    p.add_argument("--skip-bad", type=boolean, default=False, help="leave bad utterances out, listed in bad_utts")
    add_bool_option(p, "--progress", default=True, old_negative="--no-progress", help="tqdm progress bar")
    p.add_argument("data_dir")
    p.add_argument("utt_list")
    p.add_argument("ark_dir")
    p.add_argument("name")
    p.add_argument("job")
    a = p.parse_args(argv)
    limit_threads(job_threads())  # torch, OpenMP and BLAS pools: the job's share
    fbank, vad = options(a)
    print(f"fbank options:\n{fbank.to_kaldi_conf()}vad options:\n{vad.to_kaldi_conf()}", file=sys.stderr, end="")
    extract_job(
        a.data_dir,
        a.utt_list,
        a.ark_dir,
        a.name,
        a.job,
        fbank,
        vad,
        compress=a.compress,
        skip_bad=a.skip_bad,
        progress=a.progress,
        compression_method=a.compression_method,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
