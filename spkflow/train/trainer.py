"""Stage 4: train a speaker embedder on N x M batch lists, one process or DDP, resumable.

What it guarantees (the reasoning behind it: docs/training.md):

* **Determinism**: a step is a pure function of (files, config, seed, epoch, batch index, the weights
  before it): crops come from :class:`spkflow.train.loader.NxMCropDataset` (or, with ``frontend.feats_type:
  raw``, augmented audio crops from :class:`spkflow.train.raw_loader.NxMWaveDataset`) seeded by (seed, epoch,
  batch), and the global torch generator (SpecAugment masks) is re-seeded with :func:`step_seed` before every step.
* **Resume**: ``checkpoint.pth`` (tensors and plain containers only, ``weights_only=True``) is
  written atomically at the end of every epoch and mid-epoch when ``max_steps`` or a signal
  stops training; a resumed run continues the exact batch
  sequence and ends with the weights of an uninterrupted one (``test/train/test_trainer.py``).
  ESPnet's and WeSpeaker's trainers resume at epoch boundaries only and re-draw the order.
  The checkpoint records its config: a resume with another one is refused, or takes a new
  schedule with ``resume_new_schedule`` (:mod:`spkflow.train.resume`); ``config.yaml`` is
  written only once the run has accepted its config.
* **DDP** (``torchrun``, ``WORLD_SIZE > 1``): rank r of W trains on lines r, r+W, ... of each
  epoch's batch list, cut to floor(B/W) lines; rank 0 validates and writes files; a non-finite
  loss or a stop request on any rank stops every rank at the same step.
* **Non-finite loss** (without AMP also a non-finite gradient norm): :class:`TrainingDiverged`
  names the epoch, the batch list line and its first utterances; nothing is written, the last
  good checkpoint stays.
* **Signals**: SIGINT / SIGTERM / SIGHUP write ``checkpoint.pth`` at once with the state of the last
  completed step (:class:`~spkflow.train.state.StopFlag`'s thread, while the step in progress runs
  on: it is dropped and trained again on resume, so the resumed run still ends with the weights of an
  uninterrupted one); ``spkflow.bin.train`` then exits 128 + signal number without finishing it.
  A step's changes (weights, optimiser, schedule, step count, losses, the BatchNorm statistics its
  forward pass updates) are taken under one lock, so the checkpoint never holds half a step.
* **Validation** on rank 0 after every ``train.valid_every``-th epoch and the last, with stage 5's
  input and stage 6's scoring (:mod:`spkflow.train.validation`); it draws no random numbers, so how often
  it runs never changes the weights; **model selection** by ``train.select`` (average of the last
  ``average_last`` epochs, best validation EER, or last) into ``model.pth``, a plain state dict.
* **Outputs** in ``out_dir``: ``config.yaml`` (complete, with stage 2's fbank/VAD options in
  ``frontend``, so stage 5 rebuilds the input), ``checkpoint.pth``, ``epoch<E>.pth``,
  ``model.pth`` (and, for a loss with weights, ``epoch<E>.loss.pth`` and ``loss.pth`` of the same
  epochs), ``history.json`` (with gradient-norm statistics), ``curves.png`` and ``tensorboard/``
  (:mod:`spkflow.train.monitor`).  The learning rate follows the global batch
  (:mod:`spkflow.train.optim`); train.log states both.

The run's setup (device, process group, batch lists, model, loss, optimiser, resume or
initialisation, ``config.yaml``) is :mod:`spkflow.train.build`; this module is the loop: epochs,
steps, validation and checkpoints.  The optimiser, run state, data, resume, monitor and
validation helpers are their own modules.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from spkflow.augment.wave import format_counts
from spkflow.core.errors import InputError
from spkflow.nnet.checkpoint import save_checkpoint
from spkflow.nnet.losses import batch_labels
from spkflow.train.build import CHECKPOINT, Ranks, Run, TrainOptions, setup
from spkflow.train.config import normalize_train_config
from spkflow.train.data import epoch_dataset, rank_batches
from spkflow.train.loader import make_loader
from spkflow.train.monitor import loader_bound
from spkflow.train.state import (
    BufferSnapshot,
    StopFlag,
    average_state_dicts,
    forget_partial,
    partial_losses,
    progress_bar,
    remember_partial,
    rng_state,
    write_final,
)

__all__ = [
    "TrainingDiverged",
    "TrainOptions",
    "Trainer",
    "average_state_dicts",
    "step_seed",
]

log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """A non-finite loss; the message names the batch."""


def step_seed(seed: int, epoch: int, batch: int) -> int:
    """The torch seed of one step: a pure function of (seed, epoch, batch index)."""
    ss = np.random.SeedSequence([int(seed), int(epoch), int(batch), 0x74726E])  # "trn"
    return int(ss.generate_state(1, dtype=np.uint64)[0] & ((1 << 63) - 1))


def _seed_generators(seed: int, device: torch.device) -> None:
    """Seed the generators a step draws from, the CPU's and the current CUDA device's on CUDA: what
    ``torch.manual_seed`` sets of them, without seeding every other backend it knows
    (``test/bench/bench_step_host.py``)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # the current device: the run's (spkflow.train.build sets it)


class Trainer:
    """Runs stage 4; see the module docstring.  ``Trainer(opts).run()`` returns the history."""

    def __init__(self, opts: TrainOptions, exit_on_signal: bool = False) -> None:
        """``exit_on_signal``: after the checkpoint a signal ends the process at once (128 + N), as the
        command line wants; else :meth:`run` returns at the next step boundary."""
        self.opts = opts
        self.exit_on_signal = exit_on_signal
        # What a checkpoint holds changes only under this lock: a step's update and bookkeeping, an
        # epoch's end; the signal thread (StopFlag) writes checkpoint.pth holding it.
        self._lock = threading.Lock()
        self._position = 0  # the next batch of run.epoch that no step has been taken on
        self._buffers: BufferSnapshot | None = None  # during a step: the buffers before it
        self._snapshot: BufferSnapshot | None = None  # the epoch's copies of the buffers (taken each step)
        self._saved: tuple[int, int] | None = None  # (epoch, batch) that checkpoint.pth holds
        self.cfg = normalize_train_config(opts.config, source=opts.config_source)
        self.ranks = Ranks.from_env()
        self.world_size, self.rank = self.ranks.world_size, self.ranks.rank
        self.out = Path(opts.out_dir)
        self.is_main = self.ranks.is_main
        # why run() returned before the last epoch: None (it did not), "signal" or "max_steps";
        # ``stop_signal`` is the signal number (on a rank that did not get it: SIGTERM's)
        self.stopped_by: str | None = None
        self.stop_signal = 0

    # ----------------------------------------------------------------- batches
    def _epoch_batches(self, epoch: int) -> list[list[str]]:
        return rank_batches(self.opts.batches_dir, epoch, self.opts.num_epochs, self.rank, self.world_size)

    def _labels(self, run: Run, utts: Sequence[str], epoch: int, index: int) -> torch.Tensor:
        try:
            return batch_labels(utts, run.utt2spk, run.spk2idx, run.num_utt)
        except ValueError as err:
            line = index * self.world_size + self.rank + 1
            raise InputError(os.path.join(self.opts.batches_dir, f"epoch{epoch}.txt"), line, str(err)) from None

    # ----------------------------------------------------------------- main loop
    def run(self) -> list[dict[str, Any]]:
        run = setup(self.opts, self.cfg, self.ranks)
        if self.opts.resume and (self.out / CHECKPOINT).is_file():
            self._saved = (run.epoch, run.start_batch)
        with StopFlag(on_stop=lambda: self._checkpoint_on_signal(run), exit_after=self.exit_on_signal) as stop:
            try:
                while run.epoch <= self.opts.num_epochs:
                    outcome = self._train_epoch(run, stop)
                    if outcome == "mid":  # stopped inside the epoch; the checkpoint is written
                        remember_partial(run.history, run.epoch, run.losses, run.monitor.norms)
                        return run.history  # with the epoch's losses so far, as the checkpoint has them
                    self._end_epoch(run)
                    if self._stop_between_epochs(run, stop, requested=outcome == "end"):
                        return run.history
            finally:
                run.monitor.close()
        self.stopped_by, self.stop_signal = None, 0  # every epoch was trained
        if self.is_main:
            self._finish(run.history, run.cfg)
        if self.world_size > 1:
            torch.distributed.barrier()
        return run.history

    def _train_epoch(self, run: Run, stop: StopFlag) -> str | None:
        """Train ``run.epoch`` from ``run.start_batch``.  Returns None when the epoch ran to its
        end, "end" when a stop was requested at its last batch, "mid" when training stopped
        inside it (after writing the checkpoint)."""

        opts, epoch = self.opts, run.epoch
        batches = run.first if epoch == 1 else self._epoch_batches(epoch)
        if len(batches) != len(run.first):
            log.warning(
                "epoch %d has %d batches per rank (epoch 1: %d); the schedule assumes %d",
                epoch,
                len(batches),
                len(run.first),
                len(run.first),
            )
        dataset = self._dataset(run, batches)
        loader = make_loader(
            dataset,
            start_batch=run.start_batch,
            num_workers=int(run.cfg["train"]["num_workers"]),
            pin_memory=run.device.type == "cuda",  # the .to(device, non_blocking=True) below then overlaps
        )
        assert run.net is not None
        run.net.train()
        self._snapshot = BufferSnapshot(run.objective)  # the buffers each step copies first
        run.epoch_start = time.time()
        with self._lock:
            run.losses = [] if run.start_batch == 0 else partial_losses(run.history, epoch)
            run.monitor.start_epoch([] if run.start_batch == 0 else partial_losses(run.history, epoch, "grad_norms"))
            self._position = run.start_batch
        bar = progress_bar(len(batches), run.start_batch, epoch, opts.progress and self.is_main)
        aug_counts: collections.Counter[str] = collections.Counter()  # raw path: crops per augmentation
        try:
            for index, (x, utts, *wave_speed) in enumerate(run.monitor.batches(loader), start=run.start_batch):
                if len(wave_speed) > 1:
                    aug_counts.update(wave_speed[1])
                flags = self._step(run, x, utts, index, len(batches), stop, wave_speed[0] if wave_speed else None)
                if flags[1] > 0:  # a signal on some rank: this step was not taken
                    self.stopped_by, self.stop_signal = "signal", stop.signum or int(signal.SIGTERM)
                    with self._lock:
                        self._checkpoint_here(run)
                        if self._buffers is not None:  # the model as the checkpoint holds it
                            self._buffers.put_back()
                        self._buffers = None
                    return "mid"
                bar.update(1)
                if flags[2] > 0:
                    self.stopped_by, self.stop_signal = "max_steps", 0
                    if index + 1 == len(batches):
                        return "end"  # finish the epoch's bookkeeping, then stop
                    with self._lock:
                        self._checkpoint_here(run)
                    return "mid"
        finally:
            bar.close()
            if aug_counts and self.is_main:
                log.info(
                    "augment: epoch %d batches %d-%d%s, %s",
                    epoch,
                    run.start_batch + 1,
                    index + 1,
                    " (rank 0)" if self.world_size > 1 else "",
                    format_counts(aug_counts, aug_counts.pop("crops", 0)),
                )
        return None

    def _dataset(self, run: Run, batches: list[list[str]]) -> Any:
        """The epoch's N x M crops (indexed by batch): a pure function of (files, seed, epoch, batch)."""
        return epoch_dataset(
            run.cfg["frontend"],
            run.store,
            batches,
            seed=run.seed,
            epoch=run.epoch,
            crop=run.crop,
            wave_aug=run.wave_aug,
            vad_scp=os.path.join(self.opts.train_feats, "vad.scp"),
            num_utt=run.num_utt,
            utt2spk=run.utt2spk,
            fbank_on="workers" if run.wave_fbank is None else "device",
        )

    def _agree(self, run: Run, values: list[float]) -> torch.Tensor:
        """The sum of ``values`` over all ranks (the values themselves in one process)."""
        flags = torch.tensor(values)
        if self.world_size > 1:
            flags = flags.to(run.device)
            torch.distributed.all_reduce(flags)
            flags = flags.cpu()
        return flags

    def _step(
        self,
        run: Run,
        x: torch.Tensor,
        utts: list[str],
        index: int,
        num_batches: int,
        stop: StopFlag,
        wave_speed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One optimiser step on batch ``index``.  Returns the flags all ranks agree on: summed
        loss, stop requested (then the step is not taken: nothing changed but the gradients),
        max_steps reached.  Raises TrainingDiverged on a non-finite loss."""
        opts, epoch = self.opts, run.epoch
        _seed_generators(step_seed(run.seed, epoch, index), run.device)
        labels = self._labels(run, utts, epoch, index)
        if run.speed is not None:
            x, factor = run.speed(x, run.num_utt)
            labels = labels + factor * len(run.spk2idx)
        elif wave_speed is not None and run.wave_aug is not None and run.wave_aug.speed_factors:
            labels = labels + wave_speed * len(run.spk2idx)  # raw path: factor per speaker from the loader
        if run.channel is not None and run.wave_fbank is None:
            x = run.channel(x)
        labels, x = labels.to(run.device), x.to(run.device, non_blocking=True)
        if run.wave_fbank is not None:  # audio crops: their fbank here, then the feature-domain channel
            x = run.wave_fbank(x) if run.channel is None else run.channel(run.wave_fbank(x))
        assert run.net is not None
        with self._lock:  # the forward pass updates buffers (BatchNorm statistics): keep them as they are
            assert self._snapshot is not None
            self._snapshot.take()
            self._buffers = self._snapshot
        run.objective.loss.schedule(run.step, len(run.first))  # e.g. the AAM margin warm-up
        loss = run.net(x, labels, run.num_spk, run.num_utt, run.amp_dtype if run.amp else None)
        bad = loss.detach().float().item()
        last = opts.max_steps is not None and run.step + 1 >= opts.max_steps
        flags = self._agree(run, [bad, float(stop.requested), float(last)])
        if not math.isfinite(float(flags[0])):
            if math.isfinite(bad):
                self._diverged(f"non-finite loss on another rank at epoch {epoch}, batch {index}")
            self._diverged(f"non-finite loss {bad} at {self._where(epoch, index, utts)}")
        if flags[1] > 0:
            return flags  # a stop: the step is not taken (the checkpoint puts the buffers back)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()
        run.scaler.unscale_(run.optimizer)
        clip = float(run.cfg["train"]["grad_clip"])
        norm = nn.utils.clip_grad_norm_(run.params, clip if clip > 0 else float("inf"))
        run.grad_norm = float(norm)  # before clipping: train.log, history.json, TensorBoard
        if not run.scaler.is_enabled() and not math.isfinite(float(norm)):  # (a scaler skips such steps)
            self._diverged(f"non-finite gradient norm {float(norm)} at {self._where(epoch, index, utts)}")
        with self._lock:  # the step's update and its bookkeeping, all or nothing for a checkpoint
            run.step_lr = float(run.optimizer.param_groups[0]["lr"])
            run.scaler.step(run.optimizer)
            run.scaler.update()
            run.scheduler.step()
            run.step += 1
            run.losses.append(float(flags[0]) / self.world_size)
            run.monitor.step(
                epoch=epoch,
                step=run.step,
                batch=index + 1,
                num_batches=num_batches,
                loss=run.losses[-1],
                lr=run.step_lr,
                grad_norm=run.grad_norm,
                scalars=run.objective.loss.scalars(),
            )
            self._position, self._buffers = index + 1, None
            if opts.trace_batches:  # the steps taken: a step dropped by a stop is not listed
                with open(self.out / f"batch_trace.rank{self.rank}.txt", "a", encoding="utf-8") as tf:
                    tf.write(f"{epoch} {index} {self._line(index)} {' '.join(utts)}\n")
        return flags

    def _line(self, index: int) -> int:
        """The 1-based line of the epoch's batch list that is this rank's batch ``index``."""
        return index * self.world_size + self.rank + 1

    def _where(self, epoch: int, index: int, utts: Sequence[str]) -> str:
        return (
            f"epoch {epoch}, batch {index} (line {self._line(index)} of {self.opts.batches_dir}/epoch{epoch}.txt, "
            f"rank {self.rank}), utterances {' '.join(utts[:3])} ..."
        )

    def _diverged(self, msg: str) -> None:
        log.error("%s; the last good checkpoint %s is kept", msg, self.out / CHECKPOINT)
        raise TrainingDiverged(msg)

    def _why(self) -> str:
        return "a signal" if self.stopped_by == "signal" else f"max_steps={self.opts.max_steps}"

    def _end_epoch(self, run: Run) -> None:
        """History row, ``epoch<E>.pth``, validation (rank 0), then the checkpoint at the next epoch."""
        epoch, losses = run.epoch, run.losses
        row: dict[str, Any] = {
            "epoch": epoch,
            "train_loss": float(np.mean(losses)) if losses else float("nan"),
            "lr": float(run.scheduler.get_last_lr()[0]),
            "seconds": round(time.time() - run.epoch_start, 1),
            "steps": run.step,
        }
        row.update({k: float(v) for k, v in run.objective.loss.scalars().items() if math.isfinite(v)})
        row.update(run.monitor.epoch_stats())
        if self.is_main:
            save_checkpoint(self.out / f"epoch{epoch}.pth", run.objective.model.state_dict())
            if any(True for _ in run.objective.loss.parameters()):  # the classifier, chosen as the model is
                save_checkpoint(self.out / f"epoch{epoch}.loss.pth", run.objective.loss.state_dict())
            tcfg = run.cfg["train"]
            due = epoch % int(tcfg["valid_every"]) == 0 or epoch == self.opts.num_epochs
            if run.validator is not None and due:
                tv = time.time()
                row["valid_eer"] = run.validator.eer(
                    run.objective.model, run.device, int(tcfg["valid_batch_size"]), int(tcfg["valid_max_frames"])
                )
                row["valid_seconds"] = round(time.time() - tv, 1)
            log.info("epoch %d done: %s", epoch, json.dumps(row))
            starved = loader_bound(row) if run.device.type == "cuda" else None  # a CPU run's steps share its cores
            if starved:
                log.warning("%s", starved)
            run.monitor.end_epoch(row)
        with self._lock:  # a signal until here checkpoints the epoch's last batch; from here, the next epoch
            forget_partial(run.history, epoch)
            run.history.append(row)
            run.epoch, run.start_batch = epoch + 1, 0
            self._position = 0
            self._save_checkpoint(run, run.epoch, 0)
        if self.world_size > 1:
            torch.distributed.barrier()

    def _stop_between_epochs(self, run: Run, stop: StopFlag, requested: bool) -> bool:
        """Whether to stop before ``run.epoch``: a stop requested at the last batch, or a signal
        that came during the epoch's bookkeeping (validation), on any rank."""
        if run.epoch > self.opts.num_epochs:
            return False  # every epoch is trained: finish
        if not requested and self._agree(run, [float(stop.requested)])[0] > 0:
            requested = True
            self.stopped_by, self.stop_signal = "signal", stop.signum or int(signal.SIGTERM)
        if requested:
            log.info(
                "stopped by %s at the end of epoch %d (step %d); checkpoint %s",
                self._why(),
                run.epoch - 1,
                run.step,
                self.out / CHECKPOINT,
            )
        return requested

    def _checkpoint_on_signal(self, run: Run) -> None:
        """(StopFlag's thread, at the signal) ``checkpoint.pth`` of the last completed step, on rank 0."""
        self.stopped_by = "signal"
        with self._lock:
            self._checkpoint_here(run)

    def _checkpoint_here(self, run: Run) -> None:
        """(Holding the lock) ``checkpoint.pth`` of the last step taken: ``run.epoch`` at the batch after
        it, with the epoch's losses so far; during a step, with the buffers as they were before it.
        Nothing when it holds that already, or nothing has been trained."""
        where = (run.epoch, self._position)
        if run.step == 0:
            log.info("stopped by %s before the first step: nothing to save", self._why())
            return
        took = ""
        if self._saved != where:
            t0 = time.monotonic()
            history = list(run.history)
            remember_partial(history, run.epoch, run.losses, run.monitor.norms)
            saved = None if self._buffers is None else self._buffers.saved()
            self._save_checkpoint(run, *where, history=history, buffers=saved)
            took = f" (written in {time.monotonic() - t0:.1f} s)" if self.is_main else ""
        log.info(
            "stopped by %s at epoch %d batch %d (step %d); checkpoint %s%s",
            self._why(),
            run.epoch,
            self._position,
            run.step,
            self.out / CHECKPOINT,
            took,
        )

    def _save_checkpoint(
        self,
        run: Run,
        next_epoch: int,
        next_batch: int,
        history: list[dict[str, Any]] | None = None,
        buffers: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    ) -> None:
        """Rank 0 writes ``checkpoint.pth``: everything needed to go on at (next_epoch, next_batch);
        ``buffers`` replace the model's and the loss's (as they were before a step in progress)."""
        if not self.is_main:
            return
        state = {
            "model": {**run.objective.model.state_dict(), **(buffers or {}).get("model", {})},
            "loss": {**run.objective.loss.state_dict(), **(buffers or {}).get("loss", {})},
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(),
            "epoch": next_epoch,
            "batch": next_batch,
            "step": run.step,
            "history": run.history if history is None else history,
            "rng": rng_state(),
            "world_size": self.world_size,
            "sampler": {"seed": run.seed, "epoch": next_epoch, "position": next_batch},
            "config": run.cfg,  # what a resume compares its config with (spkflow.train.resume)
        }
        if run.amp:
            state["scaler"] = run.scaler.state_dict()
        save_checkpoint(self.out / CHECKPOINT, state)
        self._saved = (next_epoch, next_batch)

    def _finish(self, history: list[dict[str, Any]], cfg: Mapping[str, Any]) -> None:
        chosen = write_final(self.out, history, cfg["train"])
        log.info("model.pth = %s of epoch(s) %s", "average" if len(chosen) > 1 else "weights", chosen)
