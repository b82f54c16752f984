"""What stage 4 reads before it trains: a rank's batch lists, M, the input statistics and the
complete config.

Guarantees:

* :func:`rank_batches`: rank r of W gets lines r, r+W, ... of ``epoch<E>.txt``, cut to
  floor(B/W) lines so every rank takes the same number of steps; a missing list or one too
  short to share is an :class:`~spkflow.core.errors.InputError` naming the file.
* :func:`input_stats`: the per-dimension mean and std of what the model sees (stage 2's
  features through the frontend), from ``n`` utterances evenly spaced in ``feats.scp``: the
  same on every rank, accumulated in float64.
* :func:`complete_config`: the training config with stage 2's fbank and VAD options and the
  batch shape filled in, checked against the features' dimension (InputError naming
  ``feats.scp``), so the ``config.yaml`` written beside a model rebuilds its input in stage 5.
* :func:`epoch_dataset`: an epoch's N x M dataset over the run's store (opened once,
  :func:`spkflow.train.stores.open_store`), features or audio by ``frontend.feats_type``.
* :func:`features_needed` / :func:`train_features`: training on audio crops
  (``frontend.feats_type: raw``) without VAD or global input statistics reads nothing of stage 2
  for the training set; the feature dimension then comes from the fbank options (stage 2's
  ``fbank.conf``), not from an ark.  Whatever does need stage 2's features of the training set
  says so by name when they are missing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spkflow.core.errors import InputError
from spkflow.data.ark import KaldiArkReader
from spkflow.features.fbank import FbankOptions, VadOptions, apply_frontend
from spkflow.train.batches import read_batch_list
from spkflow.train.loader import NxMCropDataset
from spkflow.train.raw_loader import CropFbank, NxMWaveDataset

__all__ = [
    "complete_config",
    "crop_fbank",
    "epoch_dataset",
    "features_needed",
    "infer_num_utt",
    "input_stats",
    "rank_batches",
    "train_features",
]

log = logging.getLogger(__name__)


def rank_batches(batches_dir: str, epoch: int, num_epochs: int, rank: int, world_size: int) -> list[list[str]]:
    """This rank's batches of ``<batches_dir>/epoch<epoch>.txt``."""

    path = os.path.join(batches_dir, f"epoch{epoch}.txt")
    if not os.path.isfile(path):
        raise InputError(
            path,
            None,
            f"batch list of epoch {epoch} not found (stage 3 plans --num_epochs epochs; plan at least {num_epochs})",
        )
    batches = read_batch_list(path)
    per_rank = len(batches) // world_size
    if per_rank == 0:
        raise InputError(path, None, f"{len(batches)} batches cannot be shared by {world_size} ranks")
    return batches[rank : per_rank * world_size : world_size]


def infer_num_utt(batch: Sequence[str], utt2spk: Mapping[str, str]) -> int:
    """M from a speaker-major batch: the length of the first run of one speaker."""
    spk = utt2spk.get(batch[0])
    m = 0
    while m < len(batch) and utt2spk.get(batch[m]) == spk:
        m += 1
    return max(m, 1)


def features_needed(cfg: Mapping[str, Any]) -> list[str]:
    """Why stage 4 reads stage 2's output for the training set under ``cfg`` (a normalised
    training config): the config keys that need it, none when it trains on audio alone."""
    why = []
    if cfg["frontend"]["feats_type"] != "raw":
        why.append("frontend.feats_type ark (crops of stage 2's feature arks)")
    if cfg["frontend"]["vad"]:
        why.append("frontend.vad (stage 2's vad.scp)")
    if cfg["model"].get("input_norm", "global") == "global":
        why.append("model.input_norm global (input statistics from stage 2's features)")
    return why


def train_features(
    cfg: Mapping[str, Any], train_feats: str, fbank_conf: str | None, first_utt: str
) -> tuple[str | None, int]:
    """(``<train_feats>/feats.scp``, or None when the dimension did not come from it; the input's
    feature dimension).  A config that trains on audio alone (:func:`features_needed` empty)
    reads no ark: the dimension is that of ``fbank_conf`` (or ``frontend.fbank``, or the default
    options)."""
    why = features_needed(cfg)
    if not why:
        if fbank_conf:
            return None, FbankOptions.from_kaldi_conf(fbank_conf).dim
        given = cfg["frontend"].get("fbank")
        return None, (FbankOptions.from_dict(given) if given else FbankOptions()).dim
    scp = os.path.join(train_feats, "feats.scp")
    if not os.path.isfile(scp):
        raise InputError(scp, None, f"not found, and {'; '.join(why)} needs it: run stage 2 for the training set")
    return scp, KaldiArkReader(scp).read_rows(first_utt, 0, 1).shape[1]


def epoch_dataset(
    frontend: Mapping[str, Any],
    store: Any,
    batches: list[list[str]],
    *,
    seed: int,
    epoch: int,
    crop: tuple[int, int],
    wave_aug: Any,
    vad_scp: str,
    num_utt: int,
    utt2spk: Mapping[str, str],
    fbank_on: str = "workers",
) -> NxMWaveDataset | NxMCropDataset:
    """An epoch's N x M crops from ``store`` (:func:`spkflow.train.stores.open_store`), indexed by
    batch: with ``frontend.feats_type: raw`` the fbank of (augmented, ``wave_aug``) audio crops
    (``fbank_on`` device: the crops themselves, their fbank computed in the training process;
    VAD from ``vad_scp``), else crops of stage 2's features."""
    if frontend["feats_type"] == "raw":
        dataset: NxMWaveDataset | NxMCropDataset = NxMWaveDataset(
            store,
            batches,
            fbank=frontend["fbank"],
            seed=seed,
            epoch=epoch,
            crop=crop,
            use_vad=bool(frontend["vad"]),
            vad_scp=vad_scp,
            mean_norm="crop" if frontend["mean_norm"] else "none",
            augment=wave_aug,
            num_utt=num_utt,
            utt2spk=utt2spk,
            fbank_on=fbank_on,
        )
    else:
        dataset = NxMCropDataset(
            store,
            batches,
            seed=seed,
            epoch=epoch,
            crop=crop,
            mean_norm="utterance" if frontend["mean_norm"] else "none",
        )
    what = "audio" if frontend["feats_type"] == "raw" else "features"
    log.info("epoch %d: %s read from %s", epoch, what, dataset.store.describe())
    return dataset


def crop_fbank(cfg: Mapping[str, Any], wave_aug: Any, device: Any) -> CropFbank | None:
    """The fbank of audio crops computed in the training process (``train.fbank_on`` device, or
    auto on CUDA; the loader workers then only decode and augment), or None: fbank in the workers,
    or stage 2's features (no ``wave_aug``)."""
    on = cfg["train"]["fbank_on"]
    if wave_aug is None or not (on == "device" or (on == "auto" and device.type == "cuda")):
        return None
    return CropFbank(cfg["frontend"]["fbank"], "crop" if cfg["frontend"]["mean_norm"] else "none")


def input_stats(train_feats: str, frontend: Mapping[str, Any], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and std (float64) of the frontend's output over ``n`` utterances
    evenly spaced in ``<train_feats>/feats.scp``."""

    reader = KaldiArkReader(os.path.join(train_feats, "feats.scp"))
    vad = KaldiArkReader(os.path.join(train_feats, "vad.scp")) if frontend["vad"] else None
    total = None
    count = 0
    keys = reader.keys()
    for u in keys[:: max(1, len(keys) // n)][:n]:  # spread over the list (and so over speakers)
        x = apply_frontend(
            reader.read(u),
            vad.read(u) if vad is not None else None,
            use_vad=bool(frontend["vad"]),
            mean_norm=bool(frontend["mean_norm"]),
        ).astype(np.float64)
        s = np.stack([x.sum(0), np.square(x).sum(0)])
        total = s if total is None else total + s
        count += len(x)
    assert total is not None
    mean = total[0] / count
    std = np.sqrt(np.maximum(total[1] / count - mean**2, 1e-10))
    log.info("input statistics from %d utterances (%d frames)", min(n, len(reader)), count)
    return mean, std


def complete_config(
    cfg: Mapping[str, Any],
    *,
    feat_dim: int,
    train_feats: str,
    fbank_conf: str | None,
    vad_conf: str | None,
    data: Mapping[str, Any],
    dim_source: str | None = None,
) -> dict[str, Any]:
    """A copy of ``cfg`` with ``frontend.fbank``/``frontend.vad_conf`` from stage 2's conf files,
    ``model.input_dim`` and the ``data`` section (batch shape, speakers, ranks).  ``dim_source``:
    where ``feat_dim`` came from, named by a mismatch (default: ``<train_feats>/feats.scp``)."""

    cfg = json.loads(json.dumps(cfg))  # deep copy of plain data
    fe = cfg["frontend"]
    if fbank_conf:
        fe["fbank"] = FbankOptions.from_kaldi_conf(fbank_conf).to_dict()
    elif fe.get("fbank") is None:
        fe["fbank"] = FbankOptions(num_mel_bins=feat_dim).to_dict()
    if vad_conf:
        fe["vad_conf"] = dataclasses.asdict(VadOptions.from_kaldi_conf(vad_conf))
    elif fe.get("vad_conf") is None:
        fe["vad_conf"] = dataclasses.asdict(VadOptions())
    scp = dim_source or os.path.join(train_feats, "feats.scp")
    fb_dim = FbankOptions.from_dict(fe["fbank"]).dim
    if fb_dim != feat_dim:
        raise InputError(scp, None, f"features have {feat_dim} dimensions but the fbank options give {fb_dim}")
    cfg["model"].setdefault("input_dim", feat_dim)
    if int(cfg["model"]["input_dim"]) != feat_dim:
        raise InputError(
            scp, None, f"features have {feat_dim} dimensions but model.input_dim is {cfg['model']['input_dim']}"
        )
    cfg["data"] = dict(data)
    return cfg
