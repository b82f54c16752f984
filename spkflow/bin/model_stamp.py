"""Print the stamp of a model (toolkit and the SHA-256 of the files that make its embeddings).

    python -m spkflow.bin.model_stamp TOOLKIT MODEL_DIR [--model-file F] [--dtype float32|bfloat16|float16]
        [--trim-silences true|false]

``extract_embeddings.sh`` compares it with ``OUT_DIR/jobs/model.stamp`` (resume only with the
same model) and every job records the same stamp beside its embeddings; the merge checks it.
The files are :func:`spkflow.embed.base.model_files`' (spkflow: config.yaml + model.pth; espnet:
config.yaml + weights; speechbrain: hyperparams.yaml + *.ckpt; wespeaker: [config.yaml +] .onnx;
resemblyzer: the .pt), hashed by :func:`spkflow.embed.base.model_stamp`, with the options that
change the numbers (a dtype other than float32; Resemblyzer without its silence trimming).  Exit
status 1 naming the file when one is missing or ambiguous.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.bin import exits_on
from spkflow.bin.argtypes import boolean
from spkflow.core.errors import InputError
from spkflow.embed.base import DTYPES, TOOLKITS, model_files, model_stamp
from spkflow.embed.resemblyzer import stamp_options


@exits_on(InputError, OSError, say="model_stamp: ERROR")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.model_stamp", description=__doc__.splitlines()[0])
    p.add_argument("toolkit", choices=TOOLKITS)
    p.add_argument("model_dir", help="the model directory (wespeaker: or the .onnx file; resemblyzer: the .pt)")
    p.add_argument("--model-file", default=None, help="espnet / wespeaker: the weights file, when there are several")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="model precision (not float32: in the stamp)")
    p.add_argument("--trim-silences", type=boolean, default=True, help="resemblyzer: false is in the stamp")
    a = p.parse_args(argv)
    stamp = model_stamp(a.toolkit, *model_files(a.toolkit, a.model_dir, a.model_file), dtype=a.dtype)
    print(" ".join([stamp, *stamp_options(a.trim_silences)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
