"""Turn a folder of recordings (one subfolder per speaker) or a list of files into a Kaldi data dir.

    python -m spkflow.bin.make_data_dir AUDIO_DIR DATA_DIR [--speaker-regex REGEX] [--model MODEL | --rate 16000] \\
        [--trials true] [--skip-bad true]
    python -m spkflow.bin.make_data_dir --list files.txt DATA_DIR        # lines "path [speaker]"
    python -m spkflow.bin.make_data_dir --split data/test [--test-speakers 0.2] AUDIO_DIR data/train

Writes DATA_DIR/{wav.scp,utt2spk,spk2utt,utt2dur} (sorted, validated, speaker-prefixed unique
ids; ``trials`` too with ``--trials true``: the target pairs, at most 500 per speaker (a seeded
sample beyond; ``--max-targets-per-spk all`` for every pair), and 10 non-target pairs per target
pair).  ``--split TEST_DIR`` holds out a share of the speakers (``--test-speakers``: 0.2 by default,
at least 2; or a count) chosen by ``--split-seed``, written to TEST_DIR with trials, and writes the
other speakers to DATA_DIR: no speaker in both, the same sets from the same folder on any machine
(:mod:`spkflow.corpora.split`).  Nothing outside DATA_DIR is changed: the files are written and validated in a folder
beside it and renamed into place; an existing DATA_DIR is replaced only when this command wrote
it (its marker file ``.spkflow-data-dir``) or with ``--overwrite``; recordings inside DATA_DIR (or
DATA_DIR inside the recordings) are refused; a second run into the same DATA_DIR is refused
while the first holds its lock (:mod:`spkflow.corpora.destination`).  Any audio libsndfile reads
(wav, flac, ogg, opus, mp3, ...) or ffmpeg decodes (m4a, aac, wma, webm: a wav.scp pipe).
Symbolic links are followed; a folder reached again (a link loop) is read once.  Logs the counts,
durations and sample rates seen, with a warning naming the files below the model's rate, and
one when the layout looks like corpus/subset/speaker/file.  The rules (speakers, ids, what is
checked): :mod:`spkflow.corpora.folder`.  Exit status 1 on bad input, naming every unreadable
file (one line each); ``--skip-bad true`` decodes every file and leaves the unreadable ones
out instead (listed in DATA_DIR/bad_files, counted at the end).
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import setup_logging
from spkflow.bin.argtypes import add_bool_option, float_at_least, int_at_least, int_at_least_or_all
from spkflow.core.errors import InputError, OutputError, UtteranceError
from spkflow.corpora.base import summary, write_data_dir
from spkflow.corpora.destination import check_apart, check_destination
from spkflow.corpora.folder import BadFilesError, collect_folder
from spkflow.corpora.split import split_speakers
from spkflow.corpora.trials import DEFAULT_MAX_TARGETS_PER_SPK
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
    add_bool_option(p, "--trials", default=False, help="also write a trials list (target pairs + sampled others)")
    p.add_argument(
        "--max-targets-per-spk",
        type=int_at_least_or_all(1),
        default=DEFAULT_MAX_TARGETS_PER_SPK,
        help=f"target trials per speaker: a seeded sample of this many, or all (default {DEFAULT_MAX_TARGETS_PER_SPK})",
    )
    p.add_argument("--nontarget-ratio", type=float_at_least(0.0), default=10.0, help="non-target trials per target")
    p.add_argument("--trials-seed", type=int, default=0, help="seed of the non-target sample")
    p.add_argument(
        "--split",
        metavar="TEST_DIR",
        default=None,
        help="write a held-out share of the speakers here (with trials), the others to DATA_DIR",
    )
    p.add_argument(
        "--test-speakers",
        type=float_at_least(0.0),
        default=0.2,
        help="with --split: a share (0-1) or a number of the speakers for TEST_DIR, at least 2 (default 0.2)",
    )
    p.add_argument("--split-seed", type=int, default=0, help="with --split: seed of the choice of test speakers")
    add_bool_option(
        p, "--skip-bad", default=False, help="decode every file and leave unreadable ones out (listed in bad_files)"
    )
    add_bool_option(
        p,
        "--overwrite",
        default=False,
        help="replace an existing DATA_DIR that this command did not write, and all in it",
    )
    p.epilog = (
        "Symbolic links below AUDIO_DIR are followed; a folder reached a second time (a link loop, two links "
        "to one folder) is read once."
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if (args.audio_dir is None) == (args.list is None):
        parser.error("give AUDIO_DIR or --list FILE (and DATA_DIR)")
    outs = [args.data_dir] + ([args.split] if args.split else [])
    try:
        sources = [args.audio_dir] if args.audio_dir else []
        for out in outs:  # before reading anything
            check_destination(out, overwrite=args.overwrite, sources=sources)
        if args.split:
            check_apart(args.split, [args.data_dir])  # neither inside the other: one would replace the other
        model_rate = model_sample_rate(args.model) if args.model else args.rate
        data, report = collect_folder(
            args.audio_dir,
            list_file=args.list,
            speaker_regex=args.speaker_regex,
            model_rate=model_rate,
            skip_bad=args.skip_bad,
        )
        sets = [(data, args.data_dir, args.trials)]
        if args.split:
            train, test = split_speakers(data, args.test_speakers, args.split_seed)
            sets = [(train, args.data_dir, args.trials), (test, args.split, True)]
        written = [
            write_data_dir(
                part,
                out,
                trials=trials,
                nontarget_ratio=args.nontarget_ratio,
                seed=args.trials_seed,
                max_targets_per_spk=args.max_targets_per_spk,
                overwrite=args.overwrite,
                sources=sources,
                files=report.files,
                extra={"bad_files": "".join(f"{line}\n" for line in report.bad_lines())} if report.bad else None,
            )
            for part, out, trials in sets
        ]
    except BadFilesError as exc:
        for line in exc.lines:
            logging.error("%s", line)
        logging.error("%s", exc)
        return 1
    except (InputError, UtteranceError, OutputError, ValueError, OSError) as exc:
        logging.error("%s", exc)
        return 1
    for d in written:
        logging.info("wrote %s", summary(d))
    if args.split:
        logging.info("split by speaker with --split-seed %d: no speaker in both", args.split_seed)
    for line in report.bad_lines():
        logging.warning("left out: %s", line)
    for line in report.lines(model_rate):
        if line.startswith("WARNING: "):
            logging.warning("%s", line.removeprefix("WARNING: "))
        else:
            logging.info("%s", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
