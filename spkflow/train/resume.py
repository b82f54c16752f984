"""Resuming stage 4 with a training config that differs from the checkpoint's.

``checkpoint.pth`` records the complete config it was trained with (``config``, as written to
``config.yaml``).  When a run resumes from it, :func:`check_resume` compares that with the
config of the new run, key by key (dotted names such as ``optim.lr``):

* **Refused by default**, before anything is written (``config.yaml`` keeps the checkpoint's
  values): a :class:`ResumeRefused` names every differing key with both values and says what
  can be done.  It never suggests running the same command again, which would fail the same
  way.
* **Accepted with** ``--resume-new-schedule true`` (spk.sh ``--resume_new_schedule true``):
  the keys of the schedule, :data:`SCHEDULE_KEYS` (peak learning rate, weight decay, momentum,
  every ``scheduler`` key, the number of epochs, the gradient clipping, the world size at an
  epoch boundary).  They apply from the resume point: the step count, the weights and the
  optimiser's moments are the checkpoint's, the learning rate of every later step follows
  the new schedule (:func:`apply_schedule`).  The change is logged and recorded in
  ``config.yaml`` (``resumed_with_changes``: where and what) and in the checkpoints that follow.
  Fewer epochs than the checkpoint has trained, or a new world size in the middle of an epoch
  (whose batches are split by the old one), are refused even so.
* **Never accepted**: every other key (model, loss, frontend and features, crops, seed,
  augmentation, batch shape, training speakers, optimiser name ...), since the checkpoint's
  weights, classifier or optimiser state were made for the old value; also any key this
  module does not know (a key added to the config later is safe by default).  A key absent
  from the checkpoint's config whose new value is the default (an option added since) is no
  change.
* :data:`FREE_KEYS` (logging, validation, loader workers, model selection, the data dir's path)
  do not change the weights and are taken as they are, with a log line.

PyTorch Lightning restores the checkpoint's optimiser and scheduler states and lets the new
hyperparameters pass unseen; ESPnet's ``--resume`` does the same; fairseq asks for explicit
``--reset-optimizer`` / ``--reset-lr-scheduler`` switches, which restart the state instead of
continuing it.  Here a difference is never silent, and a continued schedule is written down.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from spkflow.core.checks import ConfigError

__all__ = [
    "FREE_KEYS",
    "accept_resume",
    "RECORD_KEY",
    "SCHEDULE_KEYS",
    "Change",
    "ResumeRefused",
    "apply_schedule",
    "check_resume",
    "config_changes",
]

log = logging.getLogger(__name__)

#: Top-level key of config.yaml (and of the checkpoint's config) listing the changes accepted at
#: each resume; not part of the comparison.
RECORD_KEY = "resumed_with_changes"

#: Keys that never change the weights: taken from the new config without asking.
FREE_KEYS = frozenset(
    {
        "train.log_every",
        "train.num_workers",
        "train.valid_every",
        "train.valid_batch_size",
        "train.valid_max_frames",
        "train.select",
        "train.average_last",
        "train.tensorboard",  # TensorBoard event files
        "train.fbank_on",  # where the raw crops' fbank runs: the same features within 1e-5
        "train.shards",  # crops read from shards: the same crops, bit for bit
        "data.train_data",
    }
)
#: Keys that may change from the resume point with ``--resume-new-schedule``; every key of the
#: ``scheduler`` section is one too.
SCHEDULE_KEYS = frozenset(
    {
        "optim.lr",
        "optim.weight_decay",
        "optim.momentum",
        "optim.nesterov",  # SGD's Nesterov momentum
        "optim.lr_ref_batch",  # the lr's linear scaling with the global batch
        "train.grad_clip",
        "data.num_epochs",
        "data.world_size",
    }
)
_ABSENT = "<absent>"
OPTION = "--resume_new_schedule true (spk.sh; train.sh and spkflow.bin.train: --resume-new-schedule true)"


class ResumeRefused(ConfigError):
    """The new run's config differs from the checkpoint's where that cannot go on (the message says what)."""


@dataclasses.dataclass(frozen=True)
class Change:
    key: str  # dotted, e.g. optim.lr
    old: Any  # the checkpoint's value (_ABSENT when it had none)
    new: Any

    @property
    def kind(self) -> str:
        """``free``, ``schedule`` or ``fixed``."""
        if self.key in FREE_KEYS:
            return "free"
        if self.key in SCHEDULE_KEYS or self.key.startswith("scheduler."):
            return "schedule"
        return "fixed"

    def text(self) -> str:
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


def _show(v: Any) -> str:
    return v if v == _ABSENT else repr(v)


def _flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        if not prefix and k == RECORD_KEY:
            continue
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], defaults: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Change]:
    """Every dotted key whose value differs between ``old`` and ``new`` (in ``new``'s order, then
    keys only ``old`` has).  A key only ``new`` has, at its value in ``defaults`` (the trainer's
    section defaults), is no change: an option added since ``old`` was written."""
    a, b = _flatten(old), _flatten(new)
    flat_defaults = _flatten(defaults or {})
    out = []
    for k, v in b.items():
        if k not in a:
            if k in flat_defaults and flat_defaults[k] == v:
                continue
            out.append(Change(k, _ABSENT, v))
        elif a[k] != v:
            out.append(Change(k, a[k], v))
    out += [Change(k, v, _ABSENT) for k, v in a.items() if k not in b]
    return out


def check_resume(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    checkpoint: str,
    source: str,
    position: tuple[int, int, int],
    allow_schedule: bool,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Change]:
    """The changes a resume from ``checkpoint`` (trained with ``old``; next epoch, batch and the
    steps done in ``position``) accepts for the new config ``new`` (read from ``source``): free
    keys, and schedule keys when ``allow_schedule``.  Raises :class:`ResumeRefused` otherwise."""
    changes = config_changes(old, new, defaults)
    epoch, batch, _step = position
    fixed = [c for c in changes if c.kind == "fixed"]
    sched = [c for c in changes if c.kind == "schedule"]
    why: list[str] = []
    for c in sched:
        if c.key == "data.num_epochs" and isinstance(c.new, int) and (epoch, batch) > (c.new + 1, 0):
            why.append(f"it has trained {epoch - 1 + (batch > 0)} epochs, more than data.num_epochs {c.new}")
        if c.key == "data.world_size" and batch > 0:
            why.append(f"it stopped inside epoch {epoch}, whose batches were split among {c.old} ranks")
    if not fixed and not why and (allow_schedule or not sched):
        return changes
    shown = "; ".join(c.text() for c in changes if c.kind != "free")
    msg = (
        f"{checkpoint}: refusing to resume: the training config ({source}) differs from the one the checkpoint "
        f"was trained with: {shown} (checkpoint -> now). Nothing was written."
    )
    if fixed:
        msg += (
            f" {', '.join(c.key for c in fixed)} cannot change in a resumed run (the checkpoint's weights and "
            "optimiser state were made for the old values)"
        )
    if why:
        msg += f"{';' if fixed else ''} the new schedule cannot apply: {'; '.join(why)}"
    if fixed or why:
        msg += ": put the checkpoint's values back, or train afresh (another --tag, or --resume false)."
        if sched and not allow_schedule and not why:
            msg += f" {', '.join(c.key for c in sched)} would also need {OPTION}."
    else:
        msg += (
            f" To go on from the checkpoint with the new {', '.join(c.key for c in sched)} (applied from step "
            f"{_step + 1}, epoch {epoch}), add {OPTION}; else put the checkpoint's values back, or train afresh "
            "(another --tag, or --resume false)."
        )
    raise ResumeRefused(msg)


def apply_schedule(optimizer: Any, scheduler: Any, fresh_groups: Sequence[Mapping[str, Any]]) -> None:
    """After a checkpoint's optimiser and scheduler states were loaded: give every parameter group
    the hyperparameters of ``fresh_groups`` (the groups as built from the new config, before the
    load) and set the learning rate of the current step from the new schedule (the scheduler's
    lambdas are the new config's; its step count is the checkpoint's)."""
    for group, fresh in zip(optimizer.param_groups, fresh_groups, strict=True):
        for k, v in fresh.items():
            if k != "params":
                group[k] = v
    scheduler.base_lrs = [float(g["initial_lr"]) for g in optimizer.param_groups]
    step = int(scheduler.last_epoch)
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(step)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]  # what get_last_lr() reports until the next step


def accept_resume(
    ckpt: Mapping[str, Any],
    cfg: dict[str, Any],
    *,
    checkpoint: str | os.PathLike[str],
    source: str,
    allow_schedule: bool,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Change]:
    """:func:`check_resume` of the loaded checkpoint ``ckpt`` against the new complete config
    ``cfg``: the config the checkpoint records (a checkpoint written before it recorded one: the
    ``config.yaml`` beside it, else no check, with a warning).  Logs the accepted changes and
    puts the record of the earlier resumes, plus this one when it changed the schedule, into
    ``cfg[RECORD_KEY]``."""
    checkpoint = os.fspath(checkpoint)
    old = ckpt.get("config")
    if not isinstance(old, Mapping):
        beside = os.path.join(os.path.dirname(checkpoint), "config.yaml")
        try:
            with open(beside, encoding="utf-8") as f:
                old = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            old = None
        if not isinstance(old, Mapping):
            log.warning("%s records no config and %s is unreadable: the new config is not checked", checkpoint, beside)
            return []
        log.info("%s records no config (written before spkflow did): comparing with %s", checkpoint, beside)
    position = tuple(int(ckpt.get(k, 0)) for k in ("epoch", "batch", "step"))
    changes = check_resume(
        old,
        cfg,
        checkpoint=checkpoint,
        source=source,
        position=position,  # type: ignore[arg-type]
        allow_schedule=allow_schedule,
        defaults=defaults,
    )
    records = list(old.get(RECORD_KEY) or [])
    free = [c.text() for c in changes if c.kind == "free"]
    if free:
        log.info("resuming with settings that do not change the weights: %s", "; ".join(free))
    sched = [c for c in changes if c.kind == "schedule"]
    if sched:
        epoch, batch, step = position
        log.warning(
            "resuming with a changed schedule (--resume-new-schedule), applied from step %d (epoch %d, batch %d): %s",
            step + 1,
            epoch,
            batch + 1,
            "; ".join(c.text() for c in sched),
        )
        records.append(
            {
                "epoch": epoch,
                "batch": batch,
                "step": step,
                "changes": {c.key: {"from": c.old, "to": c.new} for c in sched},
            }
        )
    if records:
        cfg[RECORD_KEY] = records
    return changes
