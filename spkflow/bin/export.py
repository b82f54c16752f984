"""Export a trained model (model dir or packed file) to ONNX, checked against PyTorch.

    python -m spkflow.bin.export --model-dir exp/spk_train --out exp/spk_train/model.onnx \\
        [--opset 17] [--tol 1e-5]

Inputs of the graph: ``feats`` float32 [batch, time, feat_dim] (the frontend's output:
``spkflow.Embedder.features``) and ``lengths`` int64 [batch]; output ``embedding`` [batch, dim].
The frontend's options are in the file's metadata (``spkflow.frontend``).  Needs the ``export``
extra (onnx, onnxruntime).  Exit status 1 with a message on bad input or when an embedding of
onnxruntime differs from PyTorch's by more than --tol of its norm (nothing is written then; the
tolerance is relative, as the API's equality checks, so it holds at any thread count:
docs/benchmarks.md).  The work is
:func:`spkflow.deploy.export.export_onnx`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.api import Embedder
from spkflow.bin import setup_logging
from spkflow.core.checks import ConfigError
from spkflow.core.errors import InputError


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.export", description="Export a spkflow model to ONNX.")
    p.add_argument("--model-dir", required=True, help="stage-4 model dir (config.yaml + model.pth) or packed .zip")
    p.add_argument("--out", required=True, help="the ONNX file to write")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    p.add_argument(
        "--tol",
        type=float,
        default=None,
        help="largest |onnxruntime - torch| / ||torch|| accepted per embedding (default: 1e-5, export.TOL)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()
    from spkflow.deploy.export import TOL, ExportError, export_onnx  # torch: imported when the command runs

    tol = TOL if args.tol is None else args.tol

    try:
        emb = Embedder.from_pretrained(args.model_dir, device="cpu")
        worst, absolute = export_onnx(emb.model, args.out, config=emb.config, opset=args.opset, tol=tol)
    except (InputError, ConfigError, ExportError, FileNotFoundError) as err:
        logging.error("%s", err)
        return 1
    logging.info(
        "wrote %s (%s, %d-dim, dynamic batch and time axes); max |onnxruntime - torch| on test inputs = %.2g "
        "of the embedding's norm (tolerance %g), %.2g absolute",
        args.out,
        (emb.config.get("model") or {}).get("name"),
        emb.dim,
        worst,
        tol,
        absolute,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
