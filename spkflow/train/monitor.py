"""What a training run reports while it runs: train.log step lines, gradient-norm statistics,
TensorBoard events.

Guarantees:

* Every ``train.log_every``-th step, rank 0 logs one line: epoch, step, batch, loss, the learning
  rate (6 significant digits), the global gradient L2 norm before any clipping, and the loss's
  scalars (the AAM margin and accuracy, GE2E's w and b).
* The gradient norm of every step is kept for the epoch; the epoch's row in ``history.json``
  gets ``grad_norm_p50``, ``grad_norm_p99`` and ``grad_norm_max`` over its finite norms (and
  ``grad_norm_nonfinite``, steps an AMP scaler skipped), so ``train.grad_clip`` can be chosen
  from data.  A run stopped mid-epoch keeps the norms so far beside the losses in its checkpoint:
  a resumed epoch reports the statistics of an uninterrupted one.
* With ``train.tensorboard`` (default on) and the ``tensorboard`` package installed (the
  optional extra: ``pip install '.[tensorboard]'`` in the checkout), rank 0 writes event files to
  ``<exp>/tensorboard/`` beside ``history.json``: ``train/{loss,lr,grad_norm,<loss scalars>}`` every ``log_every``
  steps, ``epoch/{train_loss,valid_eer,lr,grad_norm_p99,data_wait_share}`` once per epoch, all against the global
  step (so curves of runs with different world sizes differ only in their step axis); a resumed
  run purges the events written after its checkpoint (``purge_step``), as ESPnet's and
  WeSpeaker's trainers do not.  Without the package training goes on and says so once.
* Whether the loader or the model set an epoch's pace: the step loop takes its batches through
  :meth:`Monitor.batches`, which times each wait for the next batch
  (:class:`spkflow.core.batch_wait.BatchWait`).  The epoch's row gets
  ``first_batch_seconds`` (the first batch: workers starting, first reads), ``data_wait_seconds``
  (every wait, the first included) and ``data_wait_share``, the share of the loop after the
  first batch spent waiting (with two batches or more): near 0 when the model is the limit (the
  loader's workers keep batches ready), the loader's shortfall when it is.  On CUDA a share above
  :data:`spkflow.core.batch_wait.LOADER_BOUND` is a warning naming what to change.  ESPnet's trainer reports the same
  wait per iteration (``iter_time``); WeSpeaker and SpeechBrain report none.  A resumed epoch
  counts from its resume, as its ``seconds`` does.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from spkflow.core.batch_wait import LOADER_BOUND, BatchWait

__all__ = ["Monitor", "grad_norm_stats", "loader_bound"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: the row keys of :func:`grad_norm_stats`
GRAD_KEYS = ("grad_norm_p50", "grad_norm_p99", "grad_norm_max", "grad_norm_nonfinite")


def grad_norm_stats(norms: list[float]) -> dict[str, float]:
    """Median, 99th percentile and maximum of the finite ``norms``, and how many were not finite."""
    a = np.asarray(norms, dtype=np.float64)
    ok = a[np.isfinite(a)]
    out: dict[str, float] = {"grad_norm_nonfinite": int(len(a) - len(ok))}
    if len(ok):
        out.update(
            grad_norm_p50=float(np.percentile(ok, 50)),
            grad_norm_p99=float(np.percentile(ok, 99)),
            grad_norm_max=float(ok.max()),
        )
    return out


def loader_bound(row: dict[str, Any]) -> str | None:
    """What to say of an epoch's row whose ``data_wait_share`` is above :data:`LOADER_BOUND`, else None."""
    share = row.get("data_wait_share")
    if share is None or share <= LOADER_BOUND:
        return None
    return (
        f"epoch {row.get('epoch')}: the steps waited for their batches {100 * share:.0f}% of the time after the "
        f"first batch: the loader, not the model, set the pace (more train.num_workers where CPUs are free; raw "
        f"audio: train.fbank_on device; slow storage: shards; docs/gpu.md)"
    )


class Monitor:
    """Step lines, gradient norms and TensorBoard events of one run (see the module docstring).

    ``main``: this process is rank 0 (logs and writes events); ``purge_step``: the global step a
    resumed run starts from (None for a new run)."""

    def __init__(self, out_dir: str | Path, *, main: bool, log_every: int, tensorboard: bool, purge_step: int | None):
        self.main = main
        self.log_every = max(1, int(log_every))
        self.norms: list[float] = []
        self.wait = BatchWait()
        self.writer: Any = None
        if main and tensorboard:
            try:  # an optional extra: training must not need it
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.info("TensorBoard events off: the tensorboard package is not installed (pip install tensorboard)")
            else:
                logdir = Path(out_dir) / "tensorboard"
                self.writer = SummaryWriter(log_dir=str(logdir), purge_step=purge_step or None)
                log.info("TensorBoard events: %s (tensorboard --logdir %s)", logdir, logdir)

    def start_epoch(self, norms: list[float]) -> None:
        """Begin an epoch, with the norms of its steps already trained (a resumed epoch)."""
        self.norms = [float(v) for v in norms]
        self.wait = BatchWait()

    def batches(self, loader: Iterable[T]) -> Iterator[T]:
        """The epoch's batches from ``loader``, each wait for one timed (:class:`BatchWait`)."""
        return self.wait.over(loader)

    def step(
        self,
        *,
        epoch: int,
        step: int,
        batch: int,
        num_batches: int,
        loss: float,
        lr: float,
        grad_norm: float,
        scalars: dict[str, float],
    ) -> None:
        """After global step ``step`` (1-based count of steps done), batch ``batch`` (1-based)."""
        self.norms.append(float(grad_norm))
        if not self.main or step % self.log_every:
            return
        extra = " ".join(f"{k}={v:.3f}" for k, v in scalars.items())
        line = f"epoch {epoch} step {step} batch {batch}/{num_batches} loss {loss:.4f} lr {lr:.6g}"
        log.info("%s grad_norm %.4g %s", line, grad_norm, extra)
        if self.writer is not None:
            values = {"loss": loss, "lr": lr, "grad_norm": grad_norm, **scalars}
            for k, v in values.items():
                if math.isfinite(v):
                    self.writer.add_scalar(f"train/{k}", v, step)

    def epoch_stats(self) -> dict[str, float]:
        """The epoch's gradient-norm statistics and waits for batches, for its history row."""
        return {**grad_norm_stats(self.norms), **self.wait.stats()}

    def end_epoch(self, row: dict[str, Any]) -> None:
        """Write the epoch's row (loss, validation EER, lr, gradient norm) as events."""
        if self.writer is None:
            return
        for key in ("train_loss", "valid_eer", "lr", "grad_norm_p99", "data_wait_share"):
            v = row.get(key)
            if v is not None and math.isfinite(float(v)):
                self.writer.add_scalar(f"epoch/{key}", float(v), int(row["steps"]))
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
