"""What a model path is, for the shell scripts: one ``name=value`` line each, quoted for ``eval``.

    python -m spkflow.bin.model_info [--toolkit T] [--jobs true] [--model-file F] [--feats-dir D]
        [--fbank-on W] [--dtype D] [--trim-silences B] MODEL

prints (:func:`spkflow.embed.inspect_model`; a pack is verified and unpacked once into the cache)::

    model_toolkit=spkflow        # told from the files unless --toolkit names it
    model_ours=true              # a spkflow model: dir, pack or ONNX export
    model_kind=pack              # dir | pack | onnx (ours); dir | file (another toolkit's)
    model_dir=/home/u/.cache/spkflow/packs/3f2c...   # where its files are (a pack: its unpacked copy)
    model_name=spk_train         # the file or folder name without .zip / .onnx
    model_scoring=true           # it holds stage 6's scoring (scoring.yaml + scoring.npz)

Used as ``info=$(python -m spkflow.bin.model_info "${model}") || exit 1; eval "${info}"``.
``--jobs`` refuses what stage 5's jobs cannot run (our ONNX export), and the options the jobs
will get are checked against the toolkit.  Exit status 1 with a message naming the path on bad
input, before anything is written; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from spkflow.bin.argtypes import add_bool_option, boolean
from spkflow.core.errors import InputError
from spkflow.embed import TOOLKITS, inspect_model
from spkflow.embed.base import DTYPES
from spkflow.embed.open import check_options


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.model_info", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a model dir, our pack (.zip) or ONNX export, or another toolkit's dir or .onnx")
    p.add_argument("--toolkit", choices=TOOLKITS, default=None, help="the model's toolkit (default: from its files)")
    add_bool_option(p, "--jobs", default=False, help="for stage 5's jobs: refuse our ONNX export")
    p.add_argument("--model-file", default=None, help="checked: espnet / wespeaker only")
    p.add_argument("--feats-dir", default=None, help="checked: spkflow only")
    p.add_argument("--fbank-on", default="workers", help="checked: device is for spkflow only")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="checked: wespeaker runs float32 only")
    p.add_argument("--trim-silences", type=boolean, default=None, help="checked: resemblyzer only")
    a = p.parse_args(argv)
    try:
        info = inspect_model(a.model, a.toolkit, jobs=a.jobs)
        opts = {"model_file": a.model_file, "feats_dir": a.feats_dir, "fbank_on": a.fbank_on, "dtype": a.dtype}
        check_options(info.toolkit, **opts, trim_silences=a.trim_silences)
    except (InputError, ValueError, OSError) as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 1
    fields = {
        "model_toolkit": info.toolkit,
        "model_ours": str(info.ours).lower(),
        "model_kind": info.kind,
        "model_dir": str(info.model_dir),
        "model_name": info.name,
        "model_scoring": str(info.scoring_dir is not None).lower(),
    }
    print("\n".join(f"{k}={shlex.quote(v)}" for k, v in fields.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
