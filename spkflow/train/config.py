"""Training configuration: a YAML file with fixed sections, every key and value checked.

What it guarantees
------------------
* A training config (``conf/train*.yaml``) has the sections ``frontend``, ``model``,
  ``loss``, ``optim``, ``scheduler`` and ``train``.  Every mistake in it (an unknown section or
  key, an unknown ``model``/``loss``/``optim``/``scheduler`` name, a value of the wrong type or
  out of range) is a :class:`ConfigError` whose message starts with the file and names the
  dotted key, raised when the file is loaded, before any data is read.  (ESPnet's ``--config``
  files pass unknown keys on to argparse, which fails only for the top level; sub-dicts such as
  ``encoder_conf`` reach the constructor and fail there with a ``TypeError`` naming no file.)
* Defaults are filled in here, so the ``config.yaml`` written beside a model is complete:
  stage 5 rebuilds exactly the input and the network from it (:func:`spkflow.nnet.models.load_model_dir`).
* ``model`` and ``loss`` names and keys are checked against their builders' registries
  (:func:`spkflow.nnet.models.check_model_config`, :func:`spkflow.nnet.losses.check_loss_config`); values
  only the constructors can judge fail when the trainer builds them, as a ``ConfigError`` too.
* ``augment`` is checked by :func:`spkflow.augment.wave.normalize_augment_config`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

import yaml

from spkflow.augment.fbank import normalize_channel_config
from spkflow.augment.wave import augment_enabled, normalize_augment_config
from spkflow.core.checks import ConfigError, check_choice, check_factors, check_keys, check_value
from spkflow.nnet.losses import check_loss_config
from spkflow.nnet.models import check_model_config

__all__ = ["load_train_config", "normalize_train_config", "TRAIN_DEFAULTS"]


# Sections the trainer owns, with their defaults.  ``model`` and ``loss`` are open here and
# checked by their builders.
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "frontend": {
        "vad": True,  # keep voiced frames only (vad.scp from stage 2)
        "mean_norm": False,  # subtract the per-utterance mean (over the kept frames)
        "fbank": None,  # filled by the trainer from stage 2's fbank.conf (FbankOptions dict)
        "vad_conf": None,  # filled by the trainer from stage 2's vad.conf (VadOptions dict)
        "feats_type": "ark",  # ark: crops of stage 2's features | raw: fbank of (augmented) audio crops
    },
    "optim": {
        "name": "adam",  # adam | adamw | sgd
        "lr": 0.001,
        "weight_decay": 0.0,
        "decay_1d": True,  # false: biases, norm scales and the loss's scalars (any parameter of < 2
        # dimensions) are not decayed, only weight matrices and kernels (timm's and nanoGPT's habit)
        "momentum": 0.9,  # sgd only
        "nesterov": False,  # sgd only: Nesterov momentum (WeSpeaker's SGD)
        "lr_ref_batch": None,  # global batch (utterances per step over all ranks) at which `lr` is the peak;
        # the trainer scales linearly: lr x global batch / lr_ref_batch (WeSpeaker: 64). null: lr as given
    },
    "scheduler": {
        "name": "warmup_cosine",  # constant | warmup_cosine | warmup_exponential | exponential
        "warmup_steps": 0,  # linear warm-up from 0 over this many steps (the same only at one world size) ...
        "warmup_epochs": None,  # ... or over this many epochs (any world size; exclusive with warmup_steps)
        # (optional, not written unless given) "warmup_fraction": ... or over this share of the run's steps
        "final_lr_ratio": 0.0,  # warmup_cosine / warmup_exponential: lr at the end / peak lr
        "gamma": 0.5,  # exponential: factor per epoch
    },
    "train": {
        "grad_clip": 3.0,  # max global L2 norm of the gradients (GE2E paper: 3); 0 = off
        "crop_min_frames": 140,  # per-batch crop length is drawn in [min, max] (GE2E paper: 140-180)
        "crop_max_frames": 180,
        "seed": 0,  # model init, crop offsets, SpecAugment masks
        "amp": True,  # mixed precision (CUDA only; ignored on CPU)
        "amp_dtype": "float16",  # with amp: float16 (with a GradScaler) | bfloat16 (no scaler needed)
        "select": "average",  # model.pth: best | last | average (mean of the last `average_last`)
        "average_last": 3,
        "valid_every": 1,  # validate after every N-th epoch and after the last (monitoring only)
        "valid_batch_size": 32,  # utterances per forward in validation
        "valid_max_frames": 3000,  # longer validation utterances are cut (memory bound)
        "log_every": 10,  # steps between log lines (and TensorBoard points)
        "tensorboard": True,  # event files in <exp>/tensorboard (needs the tensorboard package; else skipped)
        "num_workers": 0,  # DataLoader workers for the training loader (0 = in process)
        "shards": False,  # read the crops from stage 2's shards (<train feats>/shards/shards.list, front to
        # back, a few shards in memory) instead of the arks: the same crops, for slow storage (docs/batches.md)
        "fbank_on": "auto",  # feats_type raw: fbank of the crops in the workers | on the device | auto (device
        # on CUDA); the same numbers within 1e-5 (spkflow/train/raw_loader.py)
        "input_stats_utts": 500,  # utterances used to estimate the global mean/std of the input
        "input_stats_augmented": False,  # add the channel perturbation's curve mean/variance to them
        "speed_perturb": None,  # e.g. [0.9, 1.0, 1.1]: one factor per speaker of a batch, on the
        # fbank crops (spkflow/augment/fbank.py); perturbed speakers are new voices
        "channel_perturb": None,  # e.g. {} (the defaults) or {gain_db: 4, shape_db: 2, shape_terms: 4,
        # tilt_db: 2, prob: 1, band_prob: 0, reverb_prob: 0}: a random level + equaliser curve (and
        # room) per crop, on the fbank crops (spkflow/augment/fbank.py)
        "init_from": None,  # a trained model to start from (fine-tuning): a stage-4 dir (model.pth
        # + its checkpoint.pth's classifier, which must fit this run's speakers) or a model.pth
    },
}


# Value checks of the trainer's own keys: (kind, lower bound, upper bound), bounds inclusive,
# None = unbounded.  "number" accepts int and float, "int" only int; bool is neither.
_VALUES: dict[str, tuple[str, float | None, float | None]] = {
    "frontend.vad": ("bool", None, None),
    "frontend.mean_norm": ("bool", None, None),
    "optim.lr": ("number", 0.0, None),
    "optim.weight_decay": ("number", 0.0, None),
    "optim.decay_1d": ("bool", None, None),
    "optim.momentum": ("number", 0.0, 1.0),
    "optim.nesterov": ("bool", None, None),
    "scheduler.warmup_steps": ("int", 0, None),
    "scheduler.final_lr_ratio": ("number", 0.0, 1.0),
    "scheduler.gamma": ("number", 0.0, None),
    "train.grad_clip": ("number", 0.0, None),
    "train.crop_min_frames": ("int", 1, None),
    "train.crop_max_frames": ("int", 1, None),
    "train.seed": ("int", 0, None),
    "train.amp": ("bool", None, None),
    "train.average_last": ("int", 1, None),
    "train.valid_every": ("int", 1, None),
    "train.valid_batch_size": ("int", 1, None),
    "train.valid_max_frames": ("int", 1, None),
    "train.log_every": ("int", 1, None),
    "train.tensorboard": ("bool", None, None),
    "train.num_workers": ("int", 0, None),
    "train.shards": ("bool", None, None),
    "train.input_stats_utts": ("int", 1, None),
    "train.input_stats_augmented": ("bool", None, None),
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
    # resumed_with_changes: the trainer's record in config.yaml (spkflow.train.resume), not a setting
    known = set(TRAIN_DEFAULTS) | {"model", "loss", "data", "augment", "resumed_with_changes"}
    check_keys("", cfg, known, source)
    for required in ("model", "loss"):
        if not isinstance(cfg.get(required), Mapping) or "name" not in cfg[required]:
            raise ConfigError(f"{source}: section '{required}' with a 'name' is required")
    # scheduler.warmup_fraction is optional and not among the defaults: a config without it is
    # written back (config.yaml) exactly as before
    given_sched = dict(cfg.get("scheduler") or {})
    fraction = given_sched.pop("warmup_fraction", None)
    out: dict[str, Any] = {
        name: _merge(name, given_sched if name == "scheduler" else cfg.get(name), defaults, source)
        for name, defaults in TRAIN_DEFAULTS.items()
    }
    if fraction is not None:
        check_value(source, "scheduler.warmup_fraction", fraction, "number", 0.0, 1.0)
        if fraction >= 1.0 or out["scheduler"]["warmup_steps"] or out["scheduler"]["warmup_epochs"] is not None:
            raise ConfigError(
                f"{source}: scheduler.warmup_fraction ({fraction}) must be below 1 and is exclusive with "
                "warmup_steps and warmup_epochs"
            )
        out["scheduler"]["warmup_fraction"] = fraction
    out["model"] = copy.deepcopy(dict(cfg["model"]))
    out["loss"] = copy.deepcopy(dict(cfg["loss"]))
    if "data" in cfg:  # written by the trainer (batch shape, speakers); informative
        out["data"] = copy.deepcopy(dict(cfg["data"]))
    for key in _VALUES:
        section, name = key.split(".")
        check_value(source, key, out[section][name], *_VALUES[key])

    out["augment"] = normalize_augment_config(cfg.get("augment"), source)
    if out["frontend"]["feats_type"] not in ("ark", "raw"):
        raise ConfigError(f"{source}: frontend.feats_type must be ark | raw, got {out['frontend']['feats_type']!r}")
    if augment_enabled(out["augment"]) and out["frontend"]["feats_type"] != "raw":
        raise ConfigError(f"{source}: augment needs frontend.feats_type: raw (audio crops, fbank on the fly)")
    if out["augment"]["speed"]["factors"] and out["train"]["speed_perturb"]:
        raise ConfigError(f"{source}: augment.speed and train.speed_perturb are two speed perturbations: keep one")
    t = out["train"]
    if t["crop_min_frames"] > t["crop_max_frames"]:
        raise ConfigError(
            f"{source}: need train.crop_min_frames <= train.crop_max_frames, "
            f"got {t['crop_min_frames']} and {t['crop_max_frames']}"
        )
    t["speed_perturb"] = check_factors(source, "train.speed_perturb", t["speed_perturb"])
    t["channel_perturb"] = normalize_channel_config(t["channel_perturb"], "train.channel_perturb", source)
    if t["input_stats_augmented"] and t["channel_perturb"] is None:
        raise ConfigError(f"{source}: train.input_stats_augmented needs train.channel_perturb (the curves it adds)")
    if t["init_from"] is not None and not (isinstance(t["init_from"], str) and t["init_from"]):
        raise ConfigError(f"{source}: train.init_from must be null or a path, got {t['init_from']!r}")
    check_choice(source, "train.select", t["select"], ("best", "last", "average"))
    check_choice(source, "train.amp_dtype", t["amp_dtype"], ("float16", "bfloat16"))
    check_choice(source, "train.fbank_on", t["fbank_on"], ("auto", "workers", "device"))
    check_choice(source, "optim.name", out["optim"]["name"], ("adam", "adamw", "sgd"))
    sc = out["scheduler"]
    check_choice(
        source, "scheduler.name", sc["name"], ("constant", "warmup_cosine", "warmup_exponential", "exponential")
    )
    _check_schedule(out["optim"], sc, source)
    # the builders' registries: names and keys of the model and the loss
    check_model_config(out["model"], source)
    check_loss_config(out["loss"], source)
    return out


def _check_schedule(optim: dict[str, Any], sc: dict[str, Any], source: str) -> None:
    """The keys of the rate's scaling and warm-up that depend on each other."""
    if optim["lr_ref_batch"] is not None:
        check_value(source, "optim.lr_ref_batch", optim["lr_ref_batch"], "int", 1, None)
    if sc["warmup_epochs"] is not None:
        check_value(source, "scheduler.warmup_epochs", sc["warmup_epochs"], "number", 0.0, None)
        if sc["warmup_steps"]:
            raise ConfigError(f"{source}: scheduler.warmup_epochs and scheduler.warmup_steps: give one of them")
    if sc["name"] == "warmup_exponential" and not sc["final_lr_ratio"] > 0:
        raise ConfigError(
            f"{source}: scheduler.final_lr_ratio must be > 0 for warmup_exponential (lr x ratio^progress)"
        )
    if optim["nesterov"] and (optim["name"] != "sgd" or not optim["momentum"] > 0):
        raise ConfigError(f"{source}: optim.nesterov needs optim.name sgd with momentum > 0")


def load_train_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a training config file (see :data:`TRAIN_DEFAULTS`)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the training config: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return normalize_train_config(cfg or {}, source=path)
