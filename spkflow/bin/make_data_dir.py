"""Turn a folder of recordings (one subfolder per speaker) or a list of files into a Kaldi data dir.

    python -m spkflow.bin.make_data_dir AUDIO_DIR DATA_DIR [--speaker-regex REGEX] [--model MODEL | --rate 16000] \\
        [--trials true] [--skip-bad true]
    python -m spkflow.bin.make_data_dir --list files.txt DATA_DIR        # lines "path [speaker]"

Writes DATA_DIR/{wav.scp,utt2spk,spk2utt,utt2dur} (sorted, validated, speaker-prefixed unique
ids; ``trials`` too with ``--trials true``: every target pair and 10 non-target pairs per target
pair) atomically; a previous DATA_DIR goes to DATA_DIR/.backup.  Any audio libsndfile reads
(wav, flac, ogg, opus, mp3, ...) or ffmpeg decodes (m4a, aac, wma, webm: a wav.scp pipe).  Logs
the counts, durations and sample rates seen, with a warning naming the files below the model's
rate.  The rules (speakers, ids, what is checked): :mod:`spkflow.corpora.folder`.  Exit status 1
with a line naming the file on bad input; ``--skip-bad`` leaves unreadable files out instead
(listed in DATA_DIR/bad_files).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from spkflow.bin import setup_logging
from spkflow.bin.argtypes import add_bool_option, float_at_least, int_at_least
from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError, UtteranceError
from spkflow.corpora.base import summary, write_data_dir
from spkflow.corpora.folder import collect_folder
from spkflow.embed.packed import model_sample_rate


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.make_data_dir", description=__doc__.split("\n")[0])
    p.add_argument("audio_dir", nargs="?", default=None, help="folder of recordings, one subfolder per speaker")
    p.add_argument("data_dir", help="the Kaldi data dir to write")
    p.add_argument("--list", default=None, help="instead of a folder: a file of 'path [speaker]' lines")
    p.add_argument(
        "--speaker-regex",
        default=None,
        help="speaker = this regex's group 'spk' (or first group, or match) in the path below AUDIO_DIR "
        "(default: the first folder)",
    )
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--model", default=None, help="model dir or packed .zip: warn about files below its rate")
    rate.add_argument("--rate", type=int_at_least(1), default=16000, help="the model's sample rate (default 16000)")
    add_bool_option(p, "--trials", default=False, help="also write a trials list (all target pairs + sampled others)")
    p.add_argument("--nontarget-ratio", type=float_at_least(0.0), default=10.0, help="non-target trials per target")
    p.add_argument("--trials-seed", type=int, default=0, help="seed of the non-target sample")
    add_bool_option(p, "--skip-bad", default=False, help="leave unreadable files out (bad_files)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if (args.audio_dir is None) == (args.list is None):
        parser.error("give AUDIO_DIR or --list FILE (and DATA_DIR)")
    try:
        model_rate = model_sample_rate(args.model) if args.model else args.rate
        data, report = collect_folder(
            args.audio_dir,
            list_file=args.list,
            speaker_regex=args.speaker_regex,
            model_rate=model_rate,
            skip_bad=args.skip_bad,
        )
        d = write_data_dir(
            data, args.data_dir, trials=args.trials, nontarget_ratio=args.nontarget_ratio, seed=args.trials_seed
        )
        d.validate(no_feats=True, no_text=True)
        if report.bad:
            write_text_atomic(
                Path(args.data_dir) / "bad_files", "".join(f"{p} {why}\n" for p, why in report.bad.items())
            )
    except (InputError, UtteranceError, ValueError, FileNotFoundError) as exc:
        logging.error("%s", exc)
        return 1
    logging.info("wrote %s", summary(d))
    for line in report.lines(model_rate):
        if line.startswith("WARNING: "):
            logging.warning("%s", line.removeprefix("WARNING: "))
        else:
            logging.info("%s", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
