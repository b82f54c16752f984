"""Say what stage 4 reads of the training set under a training config: `features` or `audio`.

    python -m spkflow.bin.train_inputs --config conf/train.yaml     # prints: features | audio
    python -m spkflow.bin.train_inputs --config conf/train.yaml --shards   # what its shards hold:
                                                                           # voiced features | features | audio

``audio``: the config trains on audio crops alone (``frontend.feats_type: raw``, no
``frontend.vad``, no ``model.input_norm: global``), so ``spk.sh`` makes no stage-2 features of
the training set and stage 4 reads its data dir; ``features``: stage 4 needs stage 2's output
for it (the reasons go to stderr).  The rule is :func:`spkflow.train.data.features_needed`.
With ``--shards``: what ``spk.sh --train_shards true`` packs into the training shards, the audio
files (``frontend.feats_type: raw``), the features, or with ``frontend.vad`` only their voiced
frames (``make_shards.sh --voiced true``: the frames a crop can take).
Exit status 1 with one error line naming the file for a bad config.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.bin import exits_on
from spkflow.bin.argtypes import add_bool_option
from spkflow.core.checks import ConfigError
from spkflow.train.config import load_train_config
from spkflow.train.data import features_needed


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.train_inputs", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="training config (YAML)")
    add_bool_option(p, "--shards", default=False, help="say what the training shards hold instead", bare=True)
    return p


@exits_on(ConfigError, say="train_inputs: error")
def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    cfg = load_train_config(args.config)
    if args.shards:
        fe = cfg["frontend"]
        print("audio" if fe["feats_type"] == "raw" else "voiced features" if fe["vad"] else "features")
        return 0
    why = features_needed(cfg)
    print("features" if why else "audio")
    if why:
        print(f"{args.config}: stage 4 reads stage 2's output of the training set: {'; '.join(why)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
