"""Pack a trained model into one file, or unpack such a file into a model dir.

    python -m spkflow.bin.pack --model-dir exp/spk_train --out exp/spk_train/packed/spk_train.zip \\
        [--results exp/spk_train/RESULTS.md] [--name spk_train]
    python -m spkflow.bin.pack --unpack spk_train.zip --out exp/spk_train_unpacked
    python -m spkflow.bin.pack --check spk_train.zip        # verify only: members, checksums, scoring

The pack is a zip with config.yaml, model.pth, fbank.conf, vad.conf, README.md (model card),
RESULTS.md (when present) and meta.yaml (checksums); see :mod:`spkflow.deploy.pack` (writing) and
:mod:`spkflow.embed.packed` (reading).  Both modes check the model and exit with status 1 and a
message naming the file on bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.core.errors import InputError
from spkflow.deploy.pack import pack_model
from spkflow.embed.packed import read_packed, unpack_model


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spkflow.bin.pack", description="Pack a stage-4 model dir into one zip (or unpack one)."
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-dir", help="stage-4 model dir (config.yaml + model.pth) to pack")
    src.add_argument("--unpack", metavar="FILE", help="packed model to unpack into --out (a model dir)")
    src.add_argument(
        "--check", metavar="FILE", help="verify a packed model (members, checksums, scoring) and say what it holds"
    )
    p.add_argument("--out", default=None, help="the packed file (.zip), or the model dir with --unpack")
    p.add_argument("--results", default=None, help="results table to include (default: MODEL_DIR/RESULTS.md if any)")
    p.add_argument("--name", default=None, help="model name in the model card (default: --out without .zip)")
    return p


@exits_on(InputError)
def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()

    if args.check is None and args.out is None:
        get_parser().error("--out is needed with --model-dir and --unpack")
    if args.check is not None:
        packed = read_packed(args.check)
        scoring = packed.scoring
        logging.info(
            "%s: a sound packed model (%s); scoring: %s",
            args.check,
            ", ".join(sorted(packed.members)),
            scoring.label if scoring is not None else "plain cosine (no scoring.yaml)",
        )
        return 0
    if args.unpack is not None:
        out = unpack_model(args.unpack, args.out)
        logging.info("unpacked %s into %s", args.unpack, out)
        return 0
    if not args.out.endswith(".zip"):
        raise InputError(args.out, None, "the packed file must end in .zip")
    out = pack_model(args.model_dir, args.out, results=args.results, name=args.name)
    meta = read_packed(out).meta
    logging.info("packed %s into %s: %s", args.model_dir, out, ", ".join(sorted(meta["files"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
