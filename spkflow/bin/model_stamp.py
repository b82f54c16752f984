"""Print the stamp of a model (toolkit and the SHA-256 of its config and weights).

    python -m spkflow.bin.model_stamp TOOLKIT CONFIG WEIGHTS [--dtype float32|bfloat16|float16]

``extract_embeddings.sh`` compares it with ``OUT_DIR/jobs/model.stamp`` (resume only with the
same model) and every job records the same stamp beside its embeddings
(:func:`spkflow.embed.base.model_stamp`), which the merge checks.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.embed.base import DTYPES, model_stamp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.model_stamp", description=__doc__.splitlines()[0])
    p.add_argument("toolkit", choices=("spkflow", "espnet"))
    p.add_argument("config")
    p.add_argument("weights")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="model precision (not float32: in the stamp)")
    a = p.parse_args(argv)
    try:
        print(model_stamp(a.toolkit, a.config, a.weights, a.dtype))
    except OSError as err:
        print(f"model_stamp: ERROR: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
