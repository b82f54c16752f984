"""Optimiser and learning-rate schedule of stage 4, built from the config's ``optim`` and
``scheduler`` sections (names and keys already checked by :mod:`spkflow.train.config`).

Guarantees: the schedule is a pure function of the global step (``LambdaLR``), so it resumes
exactly from a checkpoint's scheduler state; ``warmup_cosine`` reaches ``final_lr_ratio`` x the
peak at the last step of the last epoch, ``exponential`` multiplies by ``gamma`` once per epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["build_optimizer", "build_scheduler", "lr_factor", "param_groups"]


def lr_factor(cfg: Mapping[str, Any], total_steps: int, steps_per_epoch: int) -> Callable[[int], float]:
    """The factor on the peak learning rate at each global step (0-based), after a linear warmup."""
    name = cfg["name"]
    warm = int(cfg["warmup_steps"])
    final = float(cfg["final_lr_ratio"])
    gamma = float(cfg["gamma"])

    def f(step: int) -> float:
        w = min(1.0, (step + 1) / warm) if warm > 0 else 1.0
        if name == "constant":
            return w
        if name == "exponential":
            return w * gamma ** (step // max(1, steps_per_epoch))
        # warmup_cosine: cosine from 1 to final_lr_ratio over the steps after the warmup
        t = min(1.0, max(0, step - warm) / max(1, total_steps - warm))
        return w * (final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * t)))

    return f


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
    """Adam, AdamW or SGD (with momentum) from the ``optim`` section; ``decay_1d: false`` keeps
    the weight decay off the parameters of fewer than 2 dimensions (:func:`param_groups`)."""
    name, lr, wd = cfg["name"], float(cfg["lr"]), float(cfg["weight_decay"])
    groups = param_groups(params, wd, bool(cfg["decay_1d"]))
    if name == "adam":
        return torch.optim.Adam(groups, lr=lr, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=wd)
    return torch.optim.SGD(groups, lr=lr, weight_decay=wd, momentum=float(cfg["momentum"]))


def build_scheduler(
    cfg: Mapping[str, Any], optimizer: torch.optim.Optimizer, total_steps: int, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The ``scheduler`` section as a per-step ``LambdaLR`` (call ``step()`` after every optimiser step)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, total_steps, steps_per_epoch))
