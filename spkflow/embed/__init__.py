"""Stage 5: speaker embeddings of a data dir from any supported model, in parallel batched jobs.

``base`` holds the interface every model runs through (:class:`~spkflow.embed.base.Embedder`)
and the length-bounded batch planning; ``native`` runs spkflow's own models, ``espnet`` ESPnet's
speaker models; ``run`` is one job of stage 5 (resumable, sorted, aligned outputs) and the
merge.  :func:`load_embedder` picks the model's adapter by toolkit.

May import: ``core``, ``data``, ``features``, ``nnet``.
"""

from __future__ import annotations

import os

from spkflow.embed.base import Embedder
from spkflow.embed.espnet import EspnetEmbedder
from spkflow.embed.native import SpkflowEmbedder

__all__ = ["load_embedder"]


def load_embedder(
    toolkit: str,
    model_dir: str | os.PathLike[str],
    device: str = "cpu",
    model_file: str | os.PathLike[str] | None = None,
    feats_dir: str | os.PathLike[str] | None = None,
    dtype: str = "float32",
    fbank_on: str = "workers",
) -> Embedder:
    """``toolkit``: ``spkflow`` (a stage-4 model dir) or ``espnet`` (an ESPnet speaker model dir).
    ``fbank_on``: where a spkflow model's frontend runs (:mod:`spkflow.embed.native`)."""
    if toolkit == "spkflow":
        if model_file is not None:
            raise ValueError("--model-file is for --toolkit espnet; a spkflow model dir has model.pth")
        return SpkflowEmbedder(model_dir, device, feats_dir=feats_dir, dtype=dtype, fbank_on=fbank_on)
    if toolkit == "espnet":
        if feats_dir is not None:
            raise ValueError("--feats-dir is for --toolkit spkflow; ESPnet models read audio")
        if fbank_on == "device":
            raise ValueError("--fbank-on device is for --toolkit spkflow (an ESPnet model computes its own frontend)")
        if dtype != "float32":
            raise ValueError("--dtype other than float32 is for --toolkit spkflow (not implemented for ESPnet models)")
        return EspnetEmbedder(model_dir, device, model_file=model_file)
    raise ValueError(f"--toolkit must be spkflow or espnet, got {toolkit!r}")
