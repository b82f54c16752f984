"""What a stage-4 training run carries across steps, interruptions and epochs.

Guarantees:

* :func:`rng_state` / :func:`set_rng_state` hold the torch (CPU and CUDA) and Python generators
  as tensors and plain lists, so a checkpoint that stores them loads with ``weights_only=True``.
* The losses (and gradient norms) of a partly trained epoch are kept in the history as one
  ``{"partial": True}`` row (:func:`remember_partial`), so a resumed epoch reports the mean over
  all its steps.
* :class:`StopFlag` turns SIGINT/SIGTERM into a flag read at step boundaries (the trainer
  checkpoints and stops there) and restores the previous handlers on exit.
* :func:`average_state_dicts` averages floating tensors in float64 and keeps integer tensors
  (BatchNorm counters) of the last state; :func:`select_epochs` picks the epochs whose
  snapshots make ``model.pth`` (``train.select``).
* :func:`write_final`: ``model.pth`` and, for a loss with weights (the AAM classifier),
  ``loss.pth`` from the *same* epochs (``epoch<E>.pth`` / ``epoch<E>.loss.pth``), so fine-tuning
  (``train.init_from``) starts from an embedder and a classifier of one checkpoint choice, as
  WeSpeaker's averaged ``avg_model.pt`` holds both; then ``history.json`` and ``curves.png``.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from spkflow.core.atomic import write_text_atomic
from spkflow.nnet.checkpoint import load_checkpoint, save_checkpoint
from spkflow.score.plots import plot_training_curves

__all__ = [
    "StopFlag",
    "average_state_dicts",
    "forget_partial",
    "partial_losses",
    "progress_bar",
    "remember_partial",
    "rng_state",
    "select_epochs",
    "set_rng_state",
    "write_final",
]

log = logging.getLogger(__name__)


def rng_state() -> dict[str, Any]:
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: Mapping[str, Any]) -> None:
    if "torch" in st:
        torch.set_rng_state(st["torch"])
    if "python" in st:
        random.setstate((3, tuple(int(x) for x in st["python"]), None))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(st["cuda"]))


def remember_partial(
    history: list[dict[str, Any]], epoch: int, losses: list[float], grad_norms: list[float] | None = None
) -> None:
    forget_partial(history, epoch)
    row: dict[str, Any] = {"epoch": epoch, "partial": True, "losses": [float(v) for v in losses]}
    if grad_norms is not None:
        row["grad_norms"] = [float(v) for v in grad_norms]
    history.append(row)


def partial_losses(history: list[dict[str, Any]], epoch: int, key: str = "losses") -> list[float]:
    """The values kept by :func:`remember_partial` for ``epoch`` (``losses`` or ``grad_norms``)."""
    for r in history:
        if r.get("partial") and r.get("epoch") == epoch:
            return list(r.get(key, []))
    return []


def forget_partial(history: list[dict[str, Any]], epoch: int) -> None:
    history[:] = [r for r in history if not (r.get("partial") and r.get("epoch") == epoch)]


def average_state_dicts(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of floating tensors; integer tensors (BatchNorm counters) from the last."""
    if not states:
        raise ValueError("nothing to average")
    out: dict[str, torch.Tensor] = {}
    for k, v in states[-1].items():
        if torch.is_floating_point(v):
            out[k] = sum(s[k].double() for s in states).div(len(states)).to(v.dtype)
        else:
            out[k] = v.clone()
    return out


def select_epochs(history: Sequence[Mapping[str, Any]], select: str, average_last: int) -> list[int]:
    """The epochs whose snapshots make ``model.pth``: the last ``average_last`` (``average``),
    the lowest validation EER (``best``; the last epoch without validation) or the last."""
    epochs = [int(r["epoch"]) for r in history if "epoch" in r and "partial" not in r]
    if select == "best" and any("valid_eer" in r for r in history):
        best = min((r for r in history if "valid_eer" in r), key=lambda r: r["valid_eer"])
        return [int(best["epoch"])]
    if select == "average":
        return epochs[-max(1, int(average_last)) :]
    if select == "best":
        log.warning("train.select=best without validation: using the last epoch")
    return epochs[-1:]


def write_final(out: Path, history: list[dict[str, Any]], tcfg: Mapping[str, Any]) -> list[int]:
    """Write ``model.pth`` (+ ``loss.pth``), ``history.json`` and ``curves.png`` in ``out`` for the
    epochs ``train.select`` picks; returns those epochs."""
    select = tcfg["select"]
    chosen = select_epochs(history, select, int(tcfg["average_last"]))
    save_checkpoint(out / "model.pth", average_state_dicts([load_checkpoint(out / f"epoch{e}.pth") for e in chosen]))
    losses = [out / f"epoch{e}.loss.pth" for e in chosen]
    if all(p.is_file() for p in losses):
        save_checkpoint(out / "loss.pth", average_state_dicts([load_checkpoint(p) for p in losses]))
    else:
        (out / "loss.pth").unlink(missing_ok=True)
    summary = {"select": select, "epochs": chosen, "history": history}
    write_text_atomic(out / "history.json", json.dumps(summary, indent=2) + "\n")
    try:
        rows = [
            {k: v for k, v in r.items() if k in ("epoch", "train_loss", "valid_eer") or (k == "lr" and v > 0)}
            for r in history
        ]
        plot_training_curves(rows, out / "curves.png", title=f"training: {out.name}")
    except Exception as err:  # a plot must not fail a finished training
        log.warning("could not draw curves.png: %s", err)
    return chosen


class StopFlag:
    """SIGINT/SIGTERM set a flag; training stops at the next step boundary with a checkpoint."""

    def __init__(self) -> None:
        self.requested = False
        self.signum = 0
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        log.warning("signal %d: stopping after this step (a checkpoint will be written)", signum)
        self.requested = True
        self.signum = signum

    def __enter__(self) -> StopFlag:
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, initial: int, epoch: int, enabled: bool) -> Any:
    """A tqdm bar over an epoch's batches on stderr (a no-op object when not ``enabled``)."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=f"epoch {epoch}",
        unit="batch",
        file=sys.stderr,
        mininterval=5.0 if not sys.stderr.isatty() else 0.1,
        dynamic_ncols=True,
    )
