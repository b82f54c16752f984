"""Tiny spkflow models with random weights: a stage-4-style model dir (with or without the scoring
stage 6 fits), BatchNorm statistics that make a padding leak show, L2 normalisation of embeddings."""

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


def make_spkflow_model_dir(path: Path, seed: int = 0, mean_norm: bool = False) -> Path:
    """A stage-4-style model dir (config.yaml + model.pth) of a tiny ECAPA with random weights."""
    import torch

    from spkflow.features.fbank import FbankOptions
    from spkflow.features.vad import VadOptions
    from spkflow.nnet.models import build_model

    cfg = {
        "frontend": {
            "vad": True,
            "mean_norm": mean_norm,
            "fbank": FbankOptions(num_mel_bins=24).to_dict(),
            "vad_conf": dataclasses.asdict(VadOptions()),
        },
        "model": {"name": "ecapa_tdnn", "input_dim": 24, "channels": 32, "scale": 4, "embed_dim": 16},
    }
    torch.manual_seed(seed)
    model = build_model(cfg["model"])
    perturb_batchnorm(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), path / "model.pth")
    return path


def make_scored_model_dir(path: Path, audio_root: Path, seed: int = 0) -> Path:
    """A tiny model dir with a scoring, as stage 6 leaves it: a WCCN backend and an AS-norm cohort
    from the embeddings of a synthetic training set, and a calibration fitted on a second set's
    trials (``scoring.yaml`` + ``scoring.npz``).  Embedded in this process through the API."""
    import kaldiio

    from helpers.audio import make_speakers
    from spkflow import Embedder
    from spkflow.corpora.trials import make_trials, write_trials
    from spkflow.data.tables import read_kv
    from spkflow.score.backend import fit_backend
    from spkflow.score.verification import fit_scoring

    model = make_spkflow_model_dir(path, seed=seed)
    emb = Embedder.from_pretrained(model)
    scps = {}
    for name, s, n_spk in (("train", seed + 10, 5), ("dev", seed + 11, 4)):
        data = make_speakers(audio_root / name, num_spk=n_spk, num_utt=3, seed=s)
        wav = read_kv(data / "wav.scp")
        vecs = {u: emb.embed_file(p) for u, p in wav.items()}
        with kaldiio.WriteHelper(f"ark,scp:{audio_root / name}.ark,{audio_root / name}.scp") as w:
            for u in sorted(vecs):
                w(u, vecs[u])
        scps[name] = (data, vecs)
    train_data, train_vecs = scps["train"]
    u2s = read_kv(train_data / "utt2spk")
    (path / "backend").mkdir()
    keys = sorted(train_vecs)
    fit_backend("wccn", np.stack([train_vecs[u] for u in keys]), [u2s[u] for u in keys]).save(
        path / "backend" / "wccn.npz"
    )
    means = {s: np.mean([v for u, v in train_vecs.items() if u2s[u] == s], axis=0) for s in set(u2s.values())}
    with kaldiio.WriteHelper(f"ark,scp:{audio_root}/cohort.ark,{audio_root}/cohort.scp") as w:
        for s in sorted(means):
            w(s, means[s].astype(np.float32))
    dev_data, _ = scps["dev"]
    write_trials(dev_data / "trials", make_trials(read_kv(dev_data / "utt2spk"), nontarget_ratio=100))
    fit_scoring(
        str(dev_data / "trials"),
        f"{audio_root}/dev.scp",
        backend_path=str(path / "backend" / "wccn.npz"),
        cohort_scp=f"{audio_root}/cohort.scp",
        cohort_size=3,
        set_name="dev",
    ).save(path)
    return path
