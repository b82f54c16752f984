"""Export a trained model (model dir or packed file) to ONNX, checked against PyTorch.

    python -m spkflow.bin.export --model-dir exp/spk_train --out exp/spk_train/model.onnx \\
        [--opset 17] [--tol 1e-4]

Inputs of the graph: ``feats`` float32 [batch, time, feat_dim] (the frontend's output:
``spkflow.Embedder.features``) and ``lengths`` int64 [batch]; output ``embedding`` [batch, dim].
The frontend's options are in the file's metadata (``spkflow.frontend``).  Needs the ``export``
extra (onnx, onnxruntime).  Exit status 1 with a message on bad input or when onnxruntime's
output differs from PyTorch's by more than --tol (nothing is written then).  The work is
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
    p.add_argument("--tol", type=float, default=1e-4, help="largest |onnxruntime - torch| accepted")
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()
    from spkflow.deploy.export import ExportError, export_onnx

    try:
        emb = Embedder.from_pretrained(args.model_dir, device="cpu")
        worst = export_onnx(emb.model, args.out, config=emb.config, opset=args.opset, tol=args.tol)
    except (InputError, ConfigError, ExportError, FileNotFoundError) as err:
        logging.error("%s", err)
        return 1
    logging.info(
        "wrote %s (%s, %d-dim, dynamic batch and time axes); max |onnxruntime - torch| = %.2g on test inputs",
        args.out,
        (emb.config.get("model") or {}).get("name"),
        emb.dim,
        worst,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
