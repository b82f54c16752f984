"""Optimiser and learning-rate schedule of stage 4, built from the config's ``optim`` and
``scheduler`` sections (names and keys already checked by :mod:`spkflow.train.config`).

Guarantees:

* The schedule is a pure function of the global step (``LambdaLR``), the world size and the
  config, so it resumes exactly from a checkpoint's scheduler state and is the same whether the
  ranks run on one node or several.
* **Linear scaling with the global batch** (``optim.lr_ref_batch``): ``optim.lr`` is the peak rate
  at a global batch of ``lr_ref_batch`` utterances; a run whose global batch (world size x
  per-rank batch) is ``B`` peaks at ``lr x B / lr_ref_batch`` (Goyal et al. 2017; WeSpeaker's
  ``scale_ratio = world_size x batch_size / 64``).  Without ``lr_ref_batch`` the rate is
  ``optim.lr`` at any batch, as before.
* **The schedule per sample does not depend on the world size**: warm-up (``warmup_epochs``) and
  decay are functions of the fraction of training done *before* the step (samples seen / all
  samples), so with ``lr_ref_batch`` and ``warmup_epochs`` the rate per utterance of a step,
  ``lr / B``, is the same function of the samples seen at W = 1, 2, 4, ... ranks
  (``test/train/test_optim.py`` checks it on the scheduler and on real ``torchrun`` runs).
  ``warmup_steps`` counts steps instead, which is the same only at one world size;
  ``warmup_fraction`` is a share of the whole run (the same share however long the run is).
* Warm-up is linear from 0 (so that the rate per sample is the same at every world size;
  WeSpeaker's default starts at the unscaled rate, which is a different fraction of the peak at
  each world size).  ``warmup_cosine`` then decays by a cosine to ``final_lr_ratio`` x the peak;
  ``warmup_exponential`` multiplies the warm-up by ``final_lr_ratio ** (step / total_steps)``
  (WeSpeaker's ``ExponentialDecrease``: ``initial_lr -> final_lr`` over the whole run);
  ``exponential`` multiplies by ``gamma`` once per epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = [
    "build_optimizer",
    "build_scheduler",
    "describe_schedule",
    "lr_factor",
    "lr_scale",
    "param_groups",
    "warmup_steps",
]


def lr_scale(optim_cfg: Mapping[str, Any], global_batch: int) -> float:
    """The factor on ``optim.lr``: ``global_batch / optim.lr_ref_batch``, or 1 without a reference."""
    ref = optim_cfg.get("lr_ref_batch")
    return 1.0 if ref is None else float(global_batch) / float(ref)


def warmup_steps(cfg: Mapping[str, Any], steps_per_epoch: int, total_steps: int = 0) -> float:
    """Steps of linear warm-up: ``warmup_fraction`` x ``total_steps`` (a share of the run, the same
    share for any run length), else ``warmup_epochs`` x ``steps_per_epoch`` (a float: part of an
    epoch counts), else ``warmup_steps``."""
    fraction = cfg.get("warmup_fraction")
    if fraction is not None:
        return float(fraction) * total_steps
    epochs = cfg.get("warmup_epochs")
    if epochs is not None:
        return float(epochs) * steps_per_epoch
    return int(cfg["warmup_steps"])


def lr_factor(
    cfg: Mapping[str, Any], total_steps: int, steps_per_epoch: int, scale: float = 1.0
) -> Callable[[int], float]:
    """The factor on ``optim.lr`` before global step ``step`` (0-based): ``scale`` (:func:`lr_scale`)
    x a linear warm-up from 0 over :func:`warmup_steps` x the decay of ``cfg["name"]``."""
    name = cfg["name"]
    warm = warmup_steps(cfg, steps_per_epoch, total_steps)
    final = float(cfg["final_lr_ratio"])
    gamma = float(cfg["gamma"])

    def f(step: int) -> float:
        w = min(1.0, step / warm) if warm > 0 else 1.0
        if name == "constant":
            return scale * w
        if name == "exponential":
            return scale * (w * gamma ** (step // max(1, steps_per_epoch)))
        if name == "warmup_exponential":
            return scale * (w * final ** (min(step, total_steps) / max(1, total_steps)))
        # warmup_cosine: cosine from 1 to final_lr_ratio over the steps after the warmup
        t = min(1.0, max(0, step - warm) / max(1, total_steps - warm))
        return scale * (w * (final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * t))))

    return f


def describe_schedule(
    optim_cfg: Mapping[str, Any],
    sched_cfg: Mapping[str, Any],
    global_batch: int,
    world_size: int,
    steps_per_epoch: int,
    total_steps: int = 0,
) -> str:
    """One train.log line: the global batch, the (scaled) peak rate and the warm-up."""
    scale = lr_scale(optim_cfg, global_batch)
    lr = float(optim_cfg["lr"])
    per_rank = global_batch // max(1, world_size)
    line = f"global batch {global_batch} ({world_size} rank(s) x {per_rank} utterances); "
    if optim_cfg.get("lr_ref_batch") is None:
        line += f"peak lr {lr:g} (optim.lr, not scaled: no optim.lr_ref_batch)"
    else:
        line += (
            f"peak lr {lr * scale:.6g} = optim.lr {lr:g} x {global_batch} / {int(optim_cfg['lr_ref_batch'])} "
            f"(optim.lr_ref_batch; linear scaling)"
        )
    warm = warmup_steps(sched_cfg, steps_per_epoch, total_steps)
    if warm > 0:
        line += f"; warm-up from 0 over {warm:g} steps"
        if sched_cfg.get("warmup_fraction") is not None:
            line += f" ({float(sched_cfg['warmup_fraction']):g} of the run's {total_steps} steps)"
        elif sched_cfg.get("warmup_epochs") is not None:
            line += f" ({float(sched_cfg['warmup_epochs']):g} epochs of {steps_per_epoch} steps)"
    return line + f"; schedule {sched_cfg['name']}"


def param_groups(params: list[nn.Parameter], weight_decay: float, decay_1d: bool = True) -> list[dict[str, Any]]:
    """One group decayed by ``weight_decay``; with ``decay_1d`` false, a second, undecayed group
    holds the parameters of fewer than 2 dimensions (biases, norm scales, GE2E's w and b), in
    their given order."""
    if decay_1d:
        return [{"params": list(params), "weight_decay": weight_decay}]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(cfg: Mapping[str, Any], params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """Adam, AdamW or SGD (with momentum, Nesterov's with ``nesterov: true``) from the ``optim``
    section; ``decay_1d: false`` keeps the weight decay off the parameters of fewer than 2
    dimensions (:func:`param_groups`).  The rate set here is ``optim.lr``; the scheduler's factor
    scales it (:func:`lr_factor`)."""
    name, lr, wd = cfg["name"], float(cfg["lr"]), float(cfg["weight_decay"])
    groups = param_groups(params, wd, bool(cfg["decay_1d"]))
    if name == "adam":
        return torch.optim.Adam(groups, lr=lr, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=wd)
    nesterov = bool(cfg.get("nesterov", False))
    return torch.optim.SGD(groups, lr=lr, weight_decay=wd, momentum=float(cfg["momentum"]), nesterov=nesterov)


def build_scheduler(
    cfg: Mapping[str, Any],
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    steps_per_epoch: int,
    scale: float = 1.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The ``scheduler`` section as a per-step ``LambdaLR`` (call ``step()`` after every optimiser
    step); ``scale``: :func:`lr_scale` of the run's global batch."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, total_steps, steps_per_epoch, scale))
