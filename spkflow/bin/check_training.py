"""Check the training settings against the corpus before stage 3 plans any batch: say what to change.

    python -m spkflow.bin.check_training --spk2utt dump/fbank/train/spk2utt --num-spk 32 --num-utt 6 \\
        [--short-speakers drop] [--world-size 1] [--config conf/train.yaml] \\
        [--train-dir dump/fbank/train] [--fbank-conf conf/fbank.conf]

Errors (exit 1): N x M batches that the training speakers cannot fill (``--num_spk`` above the
speakers with M utterances), fewer batches per epoch than processes.  Warnings (exit 0): crops
much longer than the training utterances' median voiced length (``train.crop_min_frames`` /
``crop_max_frames``), a model large for the speakers and utterances.  Each line names the option
to change (spk.sh's, or the config key); the rules and their thresholds:
:mod:`spkflow.train.preflight`.  ``--train-dir``: stage 2's features dir (vad.scp,
utt2num_frames), or the data dir (utt2dur) for a config that trains on audio.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.bin.argtypes import int_at_least
from spkflow.core.checks import ConfigError
from spkflow.core.errors import InputError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.check_training", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="the training config (without it: the N x M check only)")
    p.add_argument("--spk2utt", required=True, help="the training set's spk2utt (what stage 3 plans from)")
    p.add_argument("--num-spk", type=int_at_least(1), required=True, help="N speakers per batch")
    p.add_argument("--num-utt", type=int_at_least(1), required=True, help="M utterances per speaker")
    p.add_argument("--short-speakers", choices=("drop", "repeat"), default="drop", help="speakers with fewer than M")
    p.add_argument("--world-size", type=int_at_least(1), default=1, help="training processes in all")
    p.add_argument("--train-dir", default=None, help="stage 2's features dir of the training set (or its data dir)")
    p.add_argument("--fbank-conf", default=None, help="stage 2's fbank options (the model's input size)")
    args = p.parse_args(argv)
    from spkflow.train.config import load_train_config, normalize_train_config
    from spkflow.train.preflight import check_training

    try:
        cfg = normalize_train_config(load_train_config(args.config), source=args.config) if args.config else None
        found = check_training(
            cfg,
            spk2utt=args.spk2utt,
            num_spk=args.num_spk,
            num_utt=args.num_utt,
            short_speakers=args.short_speakers,
            world_size=args.world_size,
            train_dir=args.train_dir,
            fbank_conf=args.fbank_conf,
        )
    except (ConfigError, InputError, OSError, ValueError) as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 1
    for line in found.warnings:
        print(f"Warning: {line}", file=sys.stderr)
    for line in found.errors:
        print(f"Error: {line}", file=sys.stderr)
    return 1 if found.errors else 0


if __name__ == "__main__":
    sys.exit(main())
