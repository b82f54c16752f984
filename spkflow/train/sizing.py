"""Warnings when a training config does not suit the run it is given: the log says so at the start
of stage 4 instead of a quietly wasted run.

* **A warm-up longer than the run** (``scheduler.warmup_steps: 500`` in an 8-step run): the rate
  climbs for the whole run and peaks at a small share of ``optim.lr`` (8e-06 instead of 2.5e-04);
  the warning gives the peak reached and names ``scheduler.warmup_fraction``, which scales with
  the run.  A warm-up over more than half the run is warned about too.
* **A model large for its data**: more than :data:`PARAMS_PER_UTTERANCE` parameters per
  training utterance (a 6.19 M-parameter ECAPA-TDNN on 240 one-second clips: 25,800; the
  speechocean762 demo's: about 250; VoxCeleb2's ECAPA-512: about 6), or more than
  :data:`PARAMS_PER_SPEAKER` per training speaker (the same ECAPA on 20 speakers: 310,000; the
  demo: about 3,000; VoxCeleb2's: about 1,000; LibriSpeech's 251 train-clean-100 speakers, a set
  such models are still trained on: 24,700), with the parameter count, the utterances and
  speakers, and the smaller template configs to try.  Stage 3 says it too, before planning
  (:mod:`spkflow.train.preflight`).

ESPnet and WeSpeaker take a warm-up in steps or epochs and any model size without comment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from spkflow.train.optim import describe_schedule, lr_factor, lr_scale, warmup_steps

__all__ = ["PARAMS_PER_SPEAKER", "PARAMS_PER_UTTERANCE", "log_run_scale", "model_size_warning", "warmup_warning"]

#: parameters per training utterance above which the model is called large for the data
PARAMS_PER_UTTERANCE = 5000
#: parameters per training speaker above which it is too (what the embedding must separate is speakers)
PARAMS_PER_SPEAKER = 50000


def warmup_warning(
    optim_cfg: Mapping[str, Any], sched_cfg: Mapping[str, Any], global_batch: int, steps_per_epoch: int, total: int
) -> str | None:
    """A warning when the warm-up takes more than half of the ``total`` steps (else None)."""
    warm = warmup_steps(sched_cfg, steps_per_epoch, total)
    if total <= 0 or warm <= total / 2:
        return None
    scale = lr_scale(optim_cfg, global_batch)
    f = lr_factor(sched_cfg, total, steps_per_epoch, scale)
    stride = max(1, total // 2000)
    reached = max(f(s) for s in [*range(0, total, stride), total - 1]) * float(optim_cfg["lr"])
    what = "is longer than" if warm >= total else "takes more than half of"
    return (
        f"the scheduler's warm-up of {warm:g} steps {what} the run's {total} steps: the learning rate peaks at "
        f"{reached:.3g} instead of {float(optim_cfg['lr']) * scale:.3g}; give scheduler.warmup_fraction "
        "(e.g. 0.05, a twentieth of any run) instead, or fewer warmup_steps"
    )


def model_size_warning(n_params: int, n_utts: int, n_spk: int) -> str | None:
    """A warning when the model has more than :data:`PARAMS_PER_UTTERANCE` parameters per training
    utterance or :data:`PARAMS_PER_SPEAKER` per training speaker (else None)."""
    over = []
    if n_utts > 0 and n_params > PARAMS_PER_UTTERANCE * n_utts:
        over.append(f"{n_params // n_utts:,} per utterance, above {PARAMS_PER_UTTERANCE:,}")
    if n_spk > 0 and n_params > PARAMS_PER_SPEAKER * n_spk:
        over.append(f"{n_params // n_spk:,} per speaker, above {PARAMS_PER_SPEAKER:,}")
    if not over:
        return None
    return (
        f"{n_params / 1e6:.2f} M parameters for {n_utts} training utterances of {n_spk} speakers "
        f"({'; '.join(over)}): the model is large for the data "
        "and will learn the recordings rather than the voices; a smaller one (fewer channels, e.g. "
        "conf/train_dvector_lstm_small.yaml or model.channels 128) or more data"
    )


def log_run_scale(
    log: logging.Logger,
    cfg: Mapping[str, Any],
    global_batch: int,
    world_size: int,
    steps_per_epoch: int,
    total: int,
    sizes: tuple[int, int, int],
) -> None:
    """Log the schedule line, then the warnings above; ``sizes``: (parameters, utterances, speakers)."""
    log.info("%s", describe_schedule(cfg["optim"], cfg["scheduler"], global_batch, world_size, steps_per_epoch, total))
    for warning in (
        warmup_warning(cfg["optim"], cfg["scheduler"], global_batch, steps_per_epoch, total),
        model_size_warning(*sizes),
    ):
        if warning:
            log.warning("%s", warning)
