"""Training configuration: a YAML file with fixed sections, every key checked.

What it guarantees
------------------
* A training config (``conf/train*.yaml``) has the sections ``frontend``, ``model``,
  ``loss``, ``optim``, ``scheduler`` and ``train``; a section or key that is not known is a
  :class:`ConfigError` naming the file, the dotted key and the accepted keys, never ignored.
  (ESPnet's ``--config`` files pass unknown keys on to argparse, which fails only for the
  top level; sub-dicts such as ``encoder_conf`` reach the constructor and fail there with a
  ``TypeError`` that does not name the file.)
* Defaults are filled in here, so the ``config.yaml`` written beside a model is complete:
  stage 5 rebuilds exactly the input and the network from it (:func:`spkflow.models.load_model_dir`).
* ``model`` and ``loss`` keys are checked by their builders (:func:`spkflow.models.build_model`,
  :func:`spkflow.losses.build_loss`); this module checks the trainer's own sections.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

import yaml

__all__ = ["ConfigError", "check_keys", "load_train_config", "normalize_train_config", "TRAIN_DEFAULTS"]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and the file."""


def check_keys(
    section: str,
    cfg: Mapping[str, Any],
    allowed: Mapping[str, Any] | set[str] | tuple[str, ...],
    source: str = "config",
) -> None:
    """Raise :class:`ConfigError` when ``cfg`` has a key that ``allowed`` lacks."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{source}: '{section}' must be a mapping, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        keys = ", ".join(f"{section}.{k}" if section else k for k in unknown)
        raise ConfigError(f"{source}: unknown key(s) {keys}; accepted: {', '.join(sorted(allowed))}")


# Sections the trainer owns, with their defaults.  ``model`` and ``loss`` are open here and
# checked by their builders.
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "frontend": {
        "vad": True,  # keep voiced frames only (vad.scp from stage 2)
        "mean_norm": False,  # subtract the per-utterance mean (over the kept frames)
        "fbank": None,  # filled by the trainer from stage 2's fbank.conf (FbankOptions dict)
        "vad_conf": None,  # filled by the trainer from stage 2's vad.conf (VadOptions dict)
    },
    "optim": {
        "name": "adam",  # adam | adamw | sgd
        "lr": 0.001,
        "weight_decay": 0.0,
        "momentum": 0.9,  # sgd only
    },
    "scheduler": {
        "name": "warmup_cosine",  # constant | warmup_cosine | exponential
        "warmup_steps": 0,
        "final_lr_ratio": 0.0,  # warmup_cosine: lr at the last step / peak lr
        "gamma": 0.5,  # exponential: factor per epoch
    },
    "train": {
        "grad_clip": 3.0,  # max global L2 norm of the gradients (GE2E paper: 3); 0 = off
        "crop_min_frames": 140,  # per-batch crop length is drawn in [min, max] (GE2E paper: 140-180)
        "crop_max_frames": 180,
        "seed": 0,  # model init, crop offsets, SpecAugment masks
        "amp": True,  # mixed precision (CUDA only; ignored on CPU)
        "select": "average",  # model.pth: best | last | average (mean of the last `average_last`)
        "average_last": 3,
        "valid_batch_size": 32,  # utterances per forward in validation
        "valid_max_frames": 3000,  # longer validation utterances are cut (memory bound)
        "log_every": 10,  # steps between log lines
        "num_workers": 0,  # DataLoader workers for the training loader (0 = in process)
        "input_stats_utts": 500,  # utterances used to estimate the global mean/std of the input
        "speed_perturb": None,  # e.g. [0.9, 1.0, 1.1]: one factor per speaker of a batch, on the
        # fbank crops (spkflow/augment.py); perturbed speakers are new voices
    },
}


def _merge(section: str, given: Any, defaults: dict[str, Any], source: str) -> dict[str, Any]:
    if given is None:
        given = {}
    check_keys(section, given, defaults, source)
    out = copy.deepcopy(defaults)
    out.update(copy.deepcopy(dict(given)))
    return out


def normalize_train_config(cfg: Mapping[str, Any], source: str = "config") -> dict[str, Any]:
    """Check sections and trainer keys, fill defaults; returns a new dict."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{source}: a training config must be a mapping of sections")
    known = set(TRAIN_DEFAULTS) | {"model", "loss", "data"}
    check_keys("", cfg, known, source)
    for required in ("model", "loss"):
        if not isinstance(cfg.get(required), Mapping) or "name" not in cfg[required]:
            raise ConfigError(f"{source}: section '{required}' with a 'name' is required")
    out: dict[str, Any] = {
        name: _merge(name, cfg.get(name), defaults, source) for name, defaults in TRAIN_DEFAULTS.items()
    }
    out["model"] = copy.deepcopy(dict(cfg["model"]))
    out["loss"] = copy.deepcopy(dict(cfg["loss"]))
    if "data" in cfg:  # written by the trainer (batch shape, speakers); informative
        out["data"] = copy.deepcopy(dict(cfg["data"]))
    t = out["train"]
    if not 1 <= int(t["crop_min_frames"]) <= int(t["crop_max_frames"]):
        raise ConfigError(
            f"{source}: need 1 <= train.crop_min_frames <= train.crop_max_frames, "
            f"got {t['crop_min_frames']} and {t['crop_max_frames']}"
        )
    sp = t["speed_perturb"]
    if sp is not None and (
        not isinstance(sp, list) or not sp or not all(isinstance(f, (int, float)) and 0.5 <= f <= 2.0 for f in sp)
    ):
        raise ConfigError(f"{source}: train.speed_perturb must be null or a list of factors in [0.5, 2], got {sp!r}")
    if t["select"] not in ("best", "last", "average"):
        raise ConfigError(f"{source}: train.select must be best | last | average, got {t['select']!r}")
    if out["optim"]["name"] not in ("adam", "adamw", "sgd"):
        raise ConfigError(f"{source}: optim.name must be adam | adamw | sgd, got {out['optim']['name']!r}")
    if out["scheduler"]["name"] not in ("constant", "warmup_cosine", "exponential"):
        raise ConfigError(
            f"{source}: scheduler.name must be constant | warmup_cosine | exponential, got {out['scheduler']['name']!r}"
        )
    return out


def load_train_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a training config file (see :data:`TRAIN_DEFAULTS`)."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        try:
            cfg = yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return normalize_train_config(cfg or {}, source=path)
