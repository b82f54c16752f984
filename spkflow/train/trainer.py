"""Stage 4: train a speaker embedder on N x M batch lists, one process or DDP, resumable.

What it guarantees (the reasoning behind it: docs/training.md):

* **Determinism**: a step is a pure function of (files, config, seed, epoch, batch index, the weights
  before it): crops come from :class:`spkflow.train.loader.NxMCropDataset` (or, with ``frontend.feats_type:
  raw``, augmented audio crops from :class:`spkflow.train.raw_loader.NxMWaveDataset`) seeded by (seed, epoch,
  batch), and the global torch generator (SpecAugment masks) is re-seeded with :func:`step_seed` before every step.
* **Resume**: ``checkpoint.pth`` (tensors and plain containers only, ``weights_only=True``) is
  written atomically at the end of every epoch and mid-epoch when ``max_steps`` or
  SIGINT/SIGTERM stops training at a step boundary; a resumed run continues the exact batch
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
* **Signals**: SIGINT/SIGTERM checkpoint, and ``spkflow.bin.train`` exits 128 + signal number.
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

Why about 700 lines: the :class:`Trainer`'s setup, epoch, step, validation and checkpoint parts
only; the optimiser, run state, data, resume, monitor and validation helpers are their own modules.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from spkflow.augment.fbank import FbankChannelPerturb, FbankSpeedPerturb
from spkflow.augment.wave import WaveAugment, format_counts
from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError
from spkflow.data.tables import read_kv
from spkflow.nnet.checkpoint import load_checkpoint, load_init, restore, save_checkpoint
from spkflow.nnet.losses import batch_labels, build_loss
from spkflow.nnet.models import SpeakerEmbedder, build_model
from spkflow.train.config import TRAIN_DEFAULTS, normalize_train_config
from spkflow.train.data import (
    complete_config,
    crop_fbank,
    epoch_dataset,
    infer_num_utt,
    input_stats,
    rank_batches,
    train_features,
)
from spkflow.train.loader import make_loader
from spkflow.train.monitor import Monitor
from spkflow.train.optim import build_optimizer, build_scheduler, lr_scale
from spkflow.train.resume import accept_resume, apply_schedule
from spkflow.train.sizing import log_run_scale
from spkflow.train.state import (
    StopFlag,
    average_state_dicts,
    forget_partial,
    partial_losses,
    progress_bar,
    remember_partial,
    rng_state,
    set_rng_state,
    write_final,
)
from spkflow.train.validation import Validator

__all__ = [
    "TrainingDiverged",
    "TrainOptions",
    "Trainer",
    "average_state_dicts",
    "step_seed",
]

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pth"


class TrainingDiverged(RuntimeError):
    """A non-finite loss; the message names the batch."""


@dataclasses.dataclass
class TrainOptions:
    """Where the trainer reads and writes (what ``spk.sh`` stage 4 passes)."""

    config: Mapping[str, Any]  # the training config (see spkflow.train.config)
    train_data: str  # data/<train_set> (utt2spk, spk2utt)
    train_feats: str  # dump/fbank/<train_set> (feats.scp, vad.scp, cmvn stats)
    batches_dir: str  # <exp>/batches (epoch<E>.txt)
    out_dir: str  # <exp>
    num_epochs: int
    num_utt: int | None = None  # M (checked against the batch lists; inferred when None)
    valid_data: str | None = None  # data/<valid_set> with trials
    valid_feats: str | None = None  # dump/fbank/<valid_set>
    fbank_conf: str | None = None  # stage 2's fbank.conf (recorded in config.yaml)
    vad_conf: str | None = None  # stage 2's vad.conf
    resume: bool = True
    resume_new_schedule: bool = False  # accept a changed lr / schedule / epochs at resume (spkflow.train.resume)
    max_steps: int | None = None  # stop (with a checkpoint) after this global step
    device: str = "auto"  # auto | cpu | cuda
    progress: bool = True
    trace_batches: bool = False  # append "epoch batch line utt..." per step to batch_trace.rank<R>.txt
    config_source: str = "config"  # where the config came from (its file), named by ConfigError


def step_seed(seed: int, epoch: int, batch: int) -> int:
    """The torch seed of one step: a pure function of (seed, epoch, batch index)."""
    ss = np.random.SeedSequence([int(seed), int(epoch), int(batch), 0x74726E])  # "trn"
    return int(ss.generate_state(1, dtype=np.uint64)[0] & ((1 << 63) - 1))


class _Objective(nn.Module):
    """Model + loss in one module, so that DDP averages the gradients of both."""

    def __init__(self, model: SpeakerEmbedder, loss: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(
        self, feats: torch.Tensor, labels: torch.Tensor, num_spk: int, num_utt: int, autocast: torch.dtype | None
    ) -> torch.Tensor:
        lengths = torch.full((feats.shape[0],), feats.shape[1], dtype=torch.long, device=feats.device)
        dtype = autocast or torch.float16
        with torch.autocast(device_type=feats.device.type, dtype=dtype, enabled=autocast is not None):
            emb = self.model(feats, lengths)
        return self.loss(emb.float().view(num_spk, num_utt, -1), labels)


@dataclasses.dataclass
class _Run:
    """The live state of one training run: what the step loop reads and a checkpoint saves."""

    cfg: dict[str, Any]  # the complete config (as written to config.yaml)
    device: torch.device
    objective: _Objective
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    amp: bool
    seed: int
    speed: Any  # spkflow.augment.fbank.FbankSpeedPerturb or None
    channel: Any  # spkflow.augment.fbank.FbankChannelPerturb or None
    feats: Any  # spkflow.data.ark.KaldiArkReader of the training features
    first: list[list[str]]  # this rank's batches of epoch 1
    num_spk: int  # N
    crop: tuple[int, int]  # crop lengths read from the arks (longer than the config's with speed perturbation)
    net: nn.Module | None = None  # the objective, wrapped in DDP when WORLD_SIZE > 1
    validator: Any = None  # spkflow.train.validation.Validator on rank 0 with --valid-data
    epoch: int = 1  # the epoch being trained (num_epochs + 1 when all are done)
    start_batch: int = 0  # the first batch of that epoch still to train
    step: int = 0  # global steps done
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)  # of the current epoch
    epoch_start: float = 0.0
    amp_dtype: torch.dtype = torch.float16  # train.amp_dtype (used when amp)
    wave_aug: Any = None  # spkflow.augment.wave.WaveAugment with frontend.feats_type raw, else None
    grad_norm: float = 0.0  # the global gradient norm of the last step (before clipping)
    step_lr: float = 0.0  # the learning rate the last step used
    monitor: Any = None  # spkflow.train.monitor.Monitor: step lines, gradient norms, TensorBoard
    wave_fbank: Any = None  # raw path with the fbank on the device (train.fbank_on): CropFbank, else None


class Trainer:
    """Runs stage 4; see the module docstring.  ``Trainer(opts).run()`` returns the history."""

    def __init__(self, opts: TrainOptions) -> None:
        self.opts = opts
        self.cfg = normalize_train_config(opts.config, source=opts.config_source)
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.out = Path(opts.out_dir)
        self.is_main = self.rank == 0
        # why run() returned before the last epoch: None (it did not), "signal" or "max_steps";
        # ``stop_signal`` is the signal number (on a rank that did not get it: SIGTERM's)
        self.stopped_by: str | None = None
        self.stop_signal = 0

    # ----------------------------------------------------------------- setup
    def _device(self) -> torch.device:
        want = self.opts.device
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want.startswith("cuda"):
            if not torch.cuda.is_available():
                raise RuntimeError("--device cuda: CUDA is not available")
            dev = torch.device("cuda", self.local_rank if self.world_size > 1 else torch.cuda.current_device())
            torch.cuda.set_device(dev)
            return dev
        return torch.device("cpu")

    def _init_distributed(self, device: torch.device) -> None:
        if self.world_size > 1 and not torch.distributed.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend=backend)
            log.info("DDP: rank %d of %d (%s)", self.rank, self.world_size, backend)

    def _epoch_batches(self, epoch: int) -> list[list[str]]:
        return rank_batches(self.opts.batches_dir, epoch, self.opts.num_epochs, self.rank, self.world_size)

    def _labels(self, utts: Sequence[str], epoch: int, index: int) -> torch.Tensor:
        try:
            return batch_labels(utts, self.utt2spk, self.spk2idx, self.num_utt)
        except ValueError as err:
            line = index * self.world_size + self.rank + 1
            raise InputError(os.path.join(self.opts.batches_dir, f"epoch{epoch}.txt"), line, str(err)) from None

    def _read_batches(self) -> tuple[list[list[str]], int]:
        """utt2spk, speaker indices, M; checks every epoch's batch list exists.  Returns this
        rank's batches of epoch 1 and N."""
        opts = self.opts
        self.utt2spk = read_kv(os.path.join(opts.train_data, "utt2spk"))
        self.spk2idx = {s: i for i, s in enumerate(sorted(set(self.utt2spk.values())))}
        for e in range(1, opts.num_epochs + 1):  # fail now, not after hours of training
            path = os.path.join(opts.batches_dir, f"epoch{e}.txt")
            if not os.path.isfile(path):
                raise InputError(
                    path,
                    None,
                    f"batch list of epoch {e} not found (stage 3 must plan at least {opts.num_epochs} epochs)",
                )
        first = self._epoch_batches(1)
        batch_len = len(first[0])
        self.num_utt = int(opts.num_utt) if opts.num_utt else infer_num_utt(first[0], self.utt2spk)
        if batch_len % self.num_utt:
            raise InputError(
                os.path.join(opts.batches_dir, "epoch1.txt"),
                1,
                f"{batch_len} utterances per batch is not a multiple of M={self.num_utt}",
            )
        return first, batch_len // self.num_utt

    def _build(
        self, cfg: dict[str, Any], device: torch.device, first: list[list[str]], num_spk: int, feats: Any
    ) -> _Run:
        """Model, loss, optimiser and schedule, initialised from the seed (before any resume)."""
        opts, tcfg = self.opts, cfg["train"]
        seed = int(tcfg["seed"])
        torch.manual_seed(seed)
        model = build_model(cfg["model"], source=opts.config_source)
        speed = None
        if tcfg["speed_perturb"]:
            speed = FbankSpeedPerturb(tcfg["speed_perturb"], cfg["frontend"]["fbank"])
        channel = None
        if tcfg["channel_perturb"]:
            channel = FbankChannelPerturb(tcfg["channel_perturb"], cfg["frontend"]["fbank"])
        wave_aug = None  # feats_type raw: audio crops, waveform augmentation, fbank in the loader
        if cfg["frontend"]["feats_type"] == "raw":
            wave_aug = WaveAugment(cfg["augment"], int(cfg["frontend"]["fbank"]["sample_frequency"]))
        wave_fbank = crop_fbank(cfg, wave_aug, device)  # train.fbank_on: raw crops' fbank here, or None
        factors = speed.factors if speed is not None else (wave_aug.speed_factors if wave_aug is not None else None)
        # with speed perturbation a classification loss sees speaker x factor as its classes
        num_classes = len(self.spk2idx) * (len(factors) if factors else 1)
        loss_fn = build_loss(cfg["loss"], model.embed_dim, num_classes=num_classes, source=opts.config_source)
        objective = _Objective(model, loss_fn).to(device)
        params = [p for p in objective.parameters() if p.requires_grad]
        optimizer = build_optimizer(cfg["optim"], params)
        steps_per_epoch = len(first)
        global_batch = self.world_size * len(first[0])  # the lr follows it (optim.lr_ref_batch)
        scale = lr_scale(cfg["optim"], global_batch)
        total = steps_per_epoch * opts.num_epochs
        scheduler = build_scheduler(cfg["scheduler"], optimizer, total, steps_per_epoch, scale)
        amp = bool(tcfg["amp"]) and device.type == "cuda"
        amp_dtype = getattr(torch, str(tcfg["amp_dtype"]))  # bfloat16 has float32's range: no scaler
        log.info(
            "%s: %.2fM parameters, loss %s; %d x %d batches, %d steps per epoch%s, %d epochs; device %s (%d threads)%s",
            cfg["model"]["name"],
            sum(p.numel() for p in model.parameters()) / 1e6,
            cfg["loss"]["name"],
            num_spk,
            self.num_utt,
            steps_per_epoch,
            f" per rank ({self.world_size} ranks)" if self.world_size > 1 else "",
            opts.num_epochs,
            device,
            torch.get_num_threads(),
            (f", AMP {tcfg['amp_dtype']}" if amp else "") + (", crops' fbank on the device" if wave_fbank else ""),
        )
        sizes = (sum(p.numel() for p in model.parameters()), len(self.utt2spk), len(self.spk2idx))
        log_run_scale(log, cfg, global_batch, self.world_size, steps_per_epoch, total, sizes)
        crop = (int(tcfg["crop_min_frames"]), int(tcfg["crop_max_frames"]))
        if speed is not None:  # read longer crops; after the warp every speaker has the configured length
            crop = (speed.read_frames(crop[0]), speed.read_frames(crop[1]))
        return _Run(
            cfg=cfg,
            device=device,
            objective=objective,
            params=params,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=torch.amp.GradScaler("cuda", enabled=amp and amp_dtype == torch.float16),
            amp=amp,
            seed=seed,
            speed=speed,
            channel=channel,
            feats=feats,
            first=first,
            num_spk=num_spk,
            crop=crop,
            amp_dtype=amp_dtype,
            wave_aug=wave_aug,
            wave_fbank=wave_fbank,
        )

    def _resume_or_init(self, run: _Run) -> None:
        """Load ``checkpoint.pth`` (with ``resume``) or set the input statistics of a new model."""
        ckpt_path = self.out / CHECKPOINT
        if self.opts.resume and ckpt_path.is_file():
            ck = load_checkpoint(ckpt_path)
            changes = accept_resume(  # ResumeRefused before anything is written
                ck,
                run.cfg,
                checkpoint=ckpt_path,
                source=self.opts.config_source,
                allow_schedule=self.opts.resume_new_schedule,
                defaults=TRAIN_DEFAULTS,
            )
            fresh = [dict(g) for g in run.optimizer.param_groups]  # the new config's hyperparameters
            parts = {
                "model": run.objective.model,
                "loss": run.objective.loss,
                "optimizer": run.optimizer,
                "scheduler": run.scheduler,
            }
            restore(ckpt_path, ck, parts, required=("epoch", "batch", "step"))
            if "scaler" in ck and run.amp:
                run.scaler.load_state_dict(ck["scaler"])
            if any(c.kind == "schedule" for c in changes):
                apply_schedule(run.optimizer, run.scheduler, fresh)
            run.epoch, run.start_batch, run.step = int(ck["epoch"]), int(ck["batch"]), int(ck["step"])
            run.history = list(ck.get("history", []))
            set_rng_state(ck.get("rng", {}))
            log.info("resumed from %s: epoch %d, batch %d, step %d", ckpt_path, run.epoch, run.start_batch, run.step)
        elif run.cfg["train"]["init_from"]:
            log.info(
                "initialised from %s", load_init(run.cfg["train"]["init_from"], run.objective.model, run.objective.loss)
            )
            run.objective.to(run.device)
        else:
            if run.objective.model.input_norm == "global":
                fe, n = run.cfg["frontend"], int(run.cfg["train"]["input_stats_utts"])
                mean, std = input_stats(self.opts.train_feats, fe, n)  # the same on every rank
                if run.cfg["train"]["input_stats_augmented"]:  # the config requires channel_perturb with it
                    shift, var = run.channel.curve_moments()  # the statistics of what the model is fed
                    wider = np.sqrt(np.square(std) + var)
                    ratio = wider / std
                    log.info("input statistics with the channel curves: std x %.2f-%.2f", ratio.min(), ratio.max())
                    mean, std = mean + shift, wider
                run.objective.model.set_input_stats(torch.from_numpy(mean).float(), torch.from_numpy(std).float())
            run.objective.to(run.device)

    def _setup(self) -> _Run:
        opts = self.opts
        device = self._device()
        self._init_distributed(device)
        self.out.mkdir(parents=True, exist_ok=True)
        first, num_spk = self._read_batches()
        feats, feat_dim = train_features(self.cfg, opts.train_feats, opts.fbank_conf, first[0][0])
        data = {
            "train_data": opts.train_data,
            "num_spk": num_spk,
            "num_utt": self.num_utt,
            "num_epochs": opts.num_epochs,
            "num_train_speakers": len(self.spk2idx),
            "world_size": self.world_size,
        }
        cfg = complete_config(
            self.cfg,
            feat_dim=feat_dim,
            train_feats=opts.train_feats,
            fbank_conf=opts.fbank_conf,
            vad_conf=opts.vad_conf,
            data=data,
            dim_source=None if feats is not None else opts.fbank_conf or "the default fbank options",
        )
        run = self._build(cfg, device, first, num_spk, feats)
        self._resume_or_init(run)  # a refused resume raises here: config.yaml is written once accepted
        if self.is_main:
            write_text_atomic(self.out / "config.yaml", yaml.safe_dump(run.cfg, sort_keys=False))
        tcfg = cfg["train"]
        run.monitor = Monitor(
            self.out,
            main=self.is_main,
            log_every=int(tcfg["log_every"]),
            tensorboard=bool(tcfg["tensorboard"]),
            purge_step=run.step or None,
        )
        if self.is_main and run.epoch <= opts.num_epochs:  # a model.pth from an earlier, shorter run is stale now
            for name in ("model.pth", "loss.pth"):
                (self.out / name).unlink(missing_ok=True)
        if self.is_main and opts.valid_data:
            fe = cfg["frontend"]
            run.validator = Validator(
                opts.valid_data, opts.valid_feats or opts.valid_data, bool(fe["vad"]), bool(fe["mean_norm"])
            )
        run.net = run.objective
        if self.world_size > 1:
            run.net = nn.parallel.DistributedDataParallel(
                run.objective, device_ids=[device.index] if device.type == "cuda" else None
            )
        return run

    # ----------------------------------------------------------------- main loop
    def run(self) -> list[dict[str, Any]]:
        run = self._setup()
        with StopFlag() as stop:
            try:
                while run.epoch <= self.opts.num_epochs:
                    outcome = self._train_epoch(run, stop)
                    if outcome == "mid":  # stopped inside the epoch; the checkpoint is written
                        return run.history
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

    def _train_epoch(self, run: _Run, stop: StopFlag) -> str | None:
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
        run.epoch_start = time.time()
        run.losses = [] if run.start_batch == 0 else partial_losses(run.history, epoch)
        run.monitor.start_epoch([] if run.start_batch == 0 else partial_losses(run.history, epoch, "grad_norms"))
        bar = progress_bar(len(batches), run.start_batch, epoch, opts.progress and self.is_main)
        aug_counts: collections.Counter[str] = collections.Counter()  # raw path: crops per augmentation
        try:
            for index, (x, utts, *wave_speed) in enumerate(loader, start=run.start_batch):
                if len(wave_speed) > 1:
                    aug_counts.update(wave_speed[1])
                flags = self._step(run, x, utts, index, stop, wave_speed[0] if wave_speed else None)
                run.losses.append(float(flags[0]) / self.world_size)
                bar.update(1)
                run.monitor.step(
                    epoch=epoch,
                    step=run.step,
                    batch=index + 1,
                    num_batches=len(batches),
                    loss=run.losses[-1],
                    lr=run.step_lr,
                    grad_norm=run.grad_norm,
                    scalars=run.objective.loss.scalars(),
                )
                if flags[1] > 0 or flags[2] > 0:
                    self.stopped_by = "signal" if flags[1] > 0 else "max_steps"
                    self.stop_signal = (stop.signum or int(signal.SIGTERM)) if flags[1] > 0 else 0
                    if index + 1 == len(batches):
                        return "end"  # finish the epoch's bookkeeping, then stop
                    remember_partial(run.history, epoch, run.losses, run.monitor.norms)
                    self._save_checkpoint(run, epoch, index + 1)
                    log.info(
                        "stopped by %s at epoch %d batch %d (step %d); checkpoint %s",
                        self._why(),
                        epoch,
                        index + 1,
                        run.step,
                        self.out / CHECKPOINT,
                    )
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

    def _dataset(self, run: _Run, batches: list[list[str]]) -> Any:
        """The epoch's N x M crops (indexed by batch): a pure function of (files, seed, epoch, batch)."""
        return epoch_dataset(
            run.cfg["frontend"],
            self.opts.train_data,
            self.opts.train_feats,
            batches,
            seed=run.seed,
            epoch=run.epoch,
            crop=run.crop,
            wave_aug=run.wave_aug,
            feats=run.feats,
            num_utt=self.num_utt,
            utt2spk=self.utt2spk,
            fbank_on="workers" if run.wave_fbank is None else "device",
        )

    def _agree(self, run: _Run, values: list[float]) -> torch.Tensor:
        """The sum of ``values`` over all ranks (the values themselves in one process)."""
        flags = torch.tensor(values)
        if self.world_size > 1:
            flags = flags.to(run.device)
            torch.distributed.all_reduce(flags)
            flags = flags.cpu()
        return flags

    def _step(
        self,
        run: _Run,
        x: torch.Tensor,
        utts: list[str],
        index: int,
        stop: StopFlag,
        wave_speed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One optimiser step on batch ``index``.  Returns the flags all ranks agree on: summed
        loss, stop requested, max_steps reached.  Raises TrainingDiverged on a non-finite loss."""
        opts, epoch = self.opts, run.epoch
        torch.manual_seed(step_seed(run.seed, epoch, index))
        labels = self._labels(utts, epoch, index)
        if run.speed is not None:
            x, factor = run.speed(x, self.num_utt)
            labels = labels + factor * len(self.spk2idx)
        elif wave_speed is not None and run.wave_aug is not None and run.wave_aug.speed_factors:
            labels = labels + wave_speed * len(self.spk2idx)  # raw path: factor per speaker from the loader
        if run.channel is not None and run.wave_fbank is None:
            x = run.channel(x)
        labels, x = labels.to(run.device), x.to(run.device, non_blocking=True)
        if run.wave_fbank is not None:  # audio crops: their fbank here, then the feature-domain channel
            x = run.wave_fbank(x) if run.channel is None else run.channel(run.wave_fbank(x))
        assert run.net is not None
        run.objective.loss.schedule(run.step, len(run.first))  # e.g. the AAM margin warm-up
        loss = run.net(x, labels, run.num_spk, self.num_utt, run.amp_dtype if run.amp else None)
        bad = loss.detach().float().item()
        last = opts.max_steps is not None and run.step + 1 >= opts.max_steps
        flags = self._agree(run, [bad, float(stop.requested), float(last)])
        if not math.isfinite(float(flags[0])):
            if math.isfinite(bad):
                self._diverged(f"non-finite loss on another rank at epoch {epoch}, batch {index}")
            self._diverged(f"non-finite loss {bad} at {self._where(epoch, index, utts)}")
        if opts.trace_batches:
            with open(self.out / f"batch_trace.rank{self.rank}.txt", "a", encoding="utf-8") as tf:
                tf.write(f"{epoch} {index} {self._line(index)} {' '.join(utts)}\n")
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()
        run.scaler.unscale_(run.optimizer)
        clip = float(run.cfg["train"]["grad_clip"])
        norm = nn.utils.clip_grad_norm_(run.params, clip if clip > 0 else float("inf"))
        run.grad_norm = float(norm)  # before clipping: train.log, history.json, TensorBoard
        if not run.scaler.is_enabled() and not math.isfinite(float(norm)):  # (a scaler skips such steps)
            self._diverged(f"non-finite gradient norm {float(norm)} at {self._where(epoch, index, utts)}")
        run.step_lr = float(run.optimizer.param_groups[0]["lr"])
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.scheduler.step()
        run.step += 1
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

    def _end_epoch(self, run: _Run) -> None:
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
        forget_partial(run.history, epoch)
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
            run.monitor.end_epoch(row)
        run.history.append(row)
        run.epoch, run.start_batch = epoch + 1, 0
        self._save_checkpoint(run, run.epoch, 0)
        if self.world_size > 1:
            torch.distributed.barrier()

    def _stop_between_epochs(self, run: _Run, stop: StopFlag, requested: bool) -> bool:
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

    def _save_checkpoint(self, run: _Run, next_epoch: int, next_batch: int) -> None:
        """Rank 0 writes ``checkpoint.pth``: everything needed to go on at (next_epoch, next_batch)."""
        if not self.is_main:
            return
        state = {
            "model": run.objective.model.state_dict(),
            "loss": run.objective.loss.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(),
            "epoch": next_epoch,
            "batch": next_batch,
            "step": run.step,
            "history": run.history,
            "rng": rng_state(),
            "world_size": self.world_size,
            "sampler": {"seed": run.seed, "epoch": next_epoch, "position": next_batch},
            "config": run.cfg,  # what a resume compares its config with (spkflow.train.resume)
        }
        if run.amp:
            state["scaler"] = run.scaler.state_dict()
        save_checkpoint(self.out / CHECKPOINT, state)

    def _finish(self, history: list[dict[str, Any]], cfg: Mapping[str, Any]) -> None:
        chosen = write_final(self.out, history, cfg["train"])
        log.info("model.pth = %s of epoch(s) %s", "average" if len(chosen) > 1 else "weights", chosen)
