"""What a stage-4 training run carries across steps, interruptions and epochs.

Guarantees:

* :func:`rng_state` / :func:`set_rng_state` hold the torch (CPU and CUDA) and Python generators
  as tensors and plain lists, so a checkpoint that stores them loads with ``weights_only=True``.
* The losses (and gradient norms) of a partly trained epoch are kept in the history as one
  ``{"partial": True}`` row (:func:`remember_partial`), so a resumed epoch reports the mean over
  all its steps.
* :class:`StopFlag`: SIGINT / SIGTERM / SIGHUP make a thread of its own write the checkpoint of
  the last completed step at once (the step in progress may take a minute, a supervisor kills
  after seconds), then end the process (the command line) or leave a flag read at the next step
  boundary; the previous handlers come back on exit.
* :class:`BufferSnapshot`: the model's and the loss's buffers as they were before the step in
  progress (a forward pass updates the BatchNorm statistics), for a checkpoint written during
  it; one fused copy into tensors kept for the epoch, not a fresh tensor per buffer each step.
* :func:`average_state_dicts` averages floating tensors in float64 and keeps integer tensors
  (BatchNorm counters) of the last state; :func:`select_epochs` picks the epochs whose
  snapshots make ``model.pth`` (``train.select``).
* :func:`write_final`: ``model.pth`` and, for a loss with weights (the AAM classifier),
  ``loss.pth`` from the *same* epochs (``epoch<E>.pth`` / ``epoch<E>.loss.pth``), so fine-tuning
  (``train.init_from``) starts from an embedder and a classifier of one checkpoint choice, as
  WeSpeaker's averaged ``avg_model.pt`` holds both; then ``history.json`` and ``curves.png``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from spkflow.core.atomic import write_text_atomic
from spkflow.core.procs import SAVING_THREAD, name_this_thread
from spkflow.nnet.checkpoint import load_checkpoint, save_checkpoint
from spkflow.score.plots import plot_training_curves

__all__ = [
    "BufferSnapshot",
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


class BufferSnapshot:
    """The buffers of ``objective.model`` and ``objective.loss`` that their state dicts hold, as
    they were at the last :meth:`take` (before a step: its forward pass updates them in place).

    The live buffers are found once (an epoch's steps change their values, never the tensors)
    and copied each step by one ``torch._foreach_copy_`` into copies kept here, where a state-dict
    walk and a fresh tensor per buffer each step cost the step's main thread 13x as much for
    ECAPA's 101 buffers, and as many kernel launches on a GPU (``test/bench/bench_step_host.py``)."""

    def __init__(self, objective: torch.nn.Module) -> None:
        self._names: list[tuple[str, str]] = []
        self._live: list[torch.Tensor] = []
        for part in ("model", "loss"):
            module = getattr(objective, part)
            kept = module.state_dict(keep_vars=True).keys()
            for name, buffer in module.named_buffers():
                if name in kept:
                    self._names.append((part, name))
                    self._live.append(buffer)
        self._saved = [b.detach().clone() for b in self._live]

    def take(self) -> None:
        """Copy the live buffers (before a step)."""
        if self._live:
            with torch.no_grad():
                torch._foreach_copy_(self._saved, self._live)

    def put_back(self) -> None:
        """Make the live buffers what :meth:`take` copied (a step dropped)."""
        if self._live:
            with torch.no_grad():
                torch._foreach_copy_(self._live, self._saved)

    def saved(self) -> dict[str, dict[str, torch.Tensor]]:
        """The copies by part (``model``, ``loss``) and state-dict name, for a checkpoint."""
        out: dict[str, dict[str, torch.Tensor]] = {"model": {}, "loss": {}}
        for (part, name), value in zip(self._names, self._saved, strict=True):
            out[part][name] = value
        return out


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
    """SIGINT / SIGTERM / SIGHUP stop training with a checkpoint of the last completed step, written
    at the signal, not after the step in progress.

    The signal's C-level handler wakes a thread of this object's own (``signal.set_wakeup_fd``),
    which calls ``on_stop`` (the trainer writes the state of the last step it completed) while the
    main thread may still be inside a step: on a loaded CPU a step of a 6 M-parameter model took
    30-100 s, and a supervisor (``utils/supervise.sh``, Slurm's KillWait) kills a few seconds after
    its signal.  With ``exit_after`` the thread then ends the process with 128 + N at once (the
    command line: the step in progress is dropped, a rerun trains it again); without it,
    ``requested`` is read at the next step boundary and the trainer drops that step itself.  A
    second signal changes nothing.  Outside the main thread (where no handler can be installed)
    nothing is: the signals keep their previous handlers.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, on_stop: Callable[[], None] | None = None, exit_after: bool = False) -> None:
        self.requested = False
        self.signum = 0
        self.on_stop = on_stop
        self.exit_after = exit_after
        self._old: dict[int, Any] = {}
        self._old_fd = -1
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._done = threading.Event()

    def _handler(self, signum: int, frame: Any) -> None:  # the main thread, when it next runs Python
        self.requested = True
        self.signum = self.signum or signum

    def _watch(self, fd: int) -> None:
        stops = {int(s) for s in self.SIGNALS}
        while True:
            try:
                data = os.read(fd, 512)  # one byte per signal the process got (SIGCHLD of loader workers too)
            except OSError:
                return
            if not data:
                return  # closed by __exit__
            for signum in data:
                if signum in stops and not self._stopping:
                    self._stop(signum)

    def _stop(self, signum: int) -> None:
        self._stopping = True
        self.signum = self.signum or signum
        self.requested = True
        log.warning("signal %d: writing the checkpoint of the last completed step now", signum)
        name_this_thread(SAVING_THREAD)  # a supervisor waits for it beyond its grace (spkflow.core.procs)
        code = 128 + signum
        try:
            if self.on_stop is not None:
                self.on_stop()
        except BaseException as err:  # noqa: BLE001  (the thread must still end the process)
            log.error("signal %d: the checkpoint could not be written: %s", signum, err)
            code = 1
        finally:
            self._done.set()
        if self.exit_after:
            for h in logging.getLogger().handlers:
                with contextlib.suppress(Exception):
                    h.flush()
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def __enter__(self) -> StopFlag:
        r, w = os.pipe()
        os.set_blocking(w, False)  # set_wakeup_fd needs it; the thread's end blocks
        try:
            self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            os.close(r)
            os.close(w)
            return self
        self._pipe = (r, w)
        for s in self.SIGNALS:
            self._old[s] = signal.signal(s, self._handler)
        self._thread = threading.Thread(target=self._watch, args=(r,), name="stop-on-signal", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._pipe is None:
            return
        if self.requested:
            # the checkpoint is being written (the exception may be a rank's collective failing because
            # another rank stopped): wait for it; with exit_after the process ends there
            self._done.wait()
        for s, h in self._old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(self._old_fd)
        r, w = self._pipe
        os.close(w)
        if self._thread is not None:
            self._thread.join()
        os.close(r)
        self._pipe = None


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
