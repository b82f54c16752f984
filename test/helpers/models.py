"""Tiny spkflow models with random weights: a stage-4-style model dir, BatchNorm statistics that
make a padding leak show, L2 normalisation of embeddings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import yaml


def perturb_batchnorm(model, seed: int) -> None:
    """Non-trivial BatchNorm running statistics, so that a padding leak would show."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.normal_(0.0, 0.5, generator=g)
                mod.running_var.uniform_(0.5, 2.0, generator=g)


def l2(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def make_spkflow_model_dir(
    path: Path, seed: int = 0, mean_norm: bool = False, channels: int = 32, num_mel_bins: int = 24, embed_dim: int = 16
) -> Path:
    """A stage-4-style model dir (config.yaml + model.pth) of an ECAPA with random weights (tiny by
    default; ``channels=512, num_mel_bins=80, embed_dim=192``: the ECAPA-512 of the papers)."""
    import torch

    from spkflow.features.fbank import FbankOptions
    from spkflow.features.vad import VadOptions
    from spkflow.nnet.models import build_model

    cfg = {
        "frontend": {
            "vad": True,
            "mean_norm": mean_norm,
            "fbank": FbankOptions(num_mel_bins=num_mel_bins).to_dict(),
            "vad_conf": dataclasses.asdict(VadOptions()),
        },
        "model": {
            "name": "ecapa_tdnn",
            "input_dim": num_mel_bins,
            "channels": channels,
            "scale": 4 if channels < 64 else 8,
            "embed_dim": embed_dim,
        },
    }
    torch.manual_seed(seed)
    model = build_model(cfg["model"])
    perturb_batchnorm(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), path / "model.pth")
    return path
