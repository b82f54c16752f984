"""Stage 4's setup: from the options and the config to the live state the trainer's loop drives.

:func:`setup` does, in this order, what happens before the first step: pick the device and join
the process group (DDP), check every epoch's batch list and read M and N from the first one,
complete the config (stage 2's fbank / VAD options, the batch shape), build model, loss,
optimiser and schedule from the seed, then resume from ``checkpoint.pth`` or initialise (the
input statistics of a new model, or ``train.init_from``), write ``config.yaml`` once the run has
accepted its config, and open the monitor and the validator.  What it guarantees:

* the model's initial weights depend on the seed alone (``torch.manual_seed`` right before
  :func:`~spkflow.nnet.models.build_model`), so the same config gives the same start on every
  rank and in every run;
* a missing batch list fails before any training (ESPnet's and WeSpeaker's trainers find it
  at that epoch, hours later), naming the file and the epoch;
* a refused resume (:mod:`spkflow.train.resume`) raises before anything is written;
* a ``model.pth`` left by an earlier, shorter run is removed once training is to go on.

The step loop, validation and checkpoints are :mod:`spkflow.train.trainer`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from spkflow.augment.fbank import FbankChannelPerturb, FbankSpeedPerturb
from spkflow.augment.wave import WaveAugment
from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError
from spkflow.data.tables import read_kv
from spkflow.nnet.checkpoint import load_checkpoint, load_init, restore
from spkflow.nnet.losses import build_loss
from spkflow.nnet.models import SpeakerEmbedder, build_model
from spkflow.train.config import TRAIN_DEFAULTS
from spkflow.train.data import complete_config, crop_fbank, infer_num_utt, input_stats, rank_batches, train_features
from spkflow.train.monitor import Monitor
from spkflow.train.optim import build_optimizer, build_scheduler, lr_scale
from spkflow.train.resume import accept_resume, apply_schedule
from spkflow.train.sizing import log_run_scale
from spkflow.train.state import set_rng_state
from spkflow.train.stores import open_store
from spkflow.train.validation import Validator

__all__ = ["CHECKPOINT", "Objective", "Ranks", "Run", "TrainOptions", "setup"]

log = logging.getLogger("spkflow.train.trainer")  # one logger for stage 4's lines in train.log

CHECKPOINT = "checkpoint.pth"


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


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place in the run (``torchrun``'s environment; one process: rank 0 of 1)."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Ranks:
        env = os.environ
        return cls(int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0")))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class Objective(nn.Module):
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
class Run:
    """The live state of one training run: what the step loop reads and a checkpoint saves."""

    cfg: dict[str, Any]  # the complete config (as written to config.yaml)
    device: torch.device
    objective: Objective
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    amp: bool
    seed: int
    speed: Any  # spkflow.augment.fbank.FbankSpeedPerturb or None
    channel: Any  # spkflow.augment.fbank.FbankChannelPerturb or None
    store: Any  # where the training crops are read (spkflow.train.stores.open_store)
    first: list[list[str]]  # this rank's batches of epoch 1
    num_spk: int  # N
    num_utt: int  # M
    utt2spk: dict[str, str]  # of the training set
    spk2idx: dict[str, int]  # training speaker -> class index (sorted speaker ids)
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


@dataclasses.dataclass
class _Batches:
    """What the batch lists and utt2spk say before training: labels, M, N, epoch 1's batches."""

    utt2spk: dict[str, str]
    spk2idx: dict[str, int]
    num_utt: int
    num_spk: int
    first: list[list[str]]


def _device(want: str, ranks: Ranks) -> torch.device:
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: CUDA is not available")
        dev = torch.device("cuda", ranks.local_rank if ranks.world_size > 1 else torch.cuda.current_device())
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def _init_distributed(device: torch.device, ranks: Ranks) -> None:
    if ranks.world_size > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend)
        log.info("DDP: rank %d of %d (%s)", ranks.rank, ranks.world_size, backend)


def _read_batches(opts: TrainOptions, ranks: Ranks) -> _Batches:
    """utt2spk, speaker indices, M; checks every epoch's batch list exists; this rank's batches
    of epoch 1 and N."""
    utt2spk = read_kv(os.path.join(opts.train_data, "utt2spk"))
    spk2idx = {s: i for i, s in enumerate(sorted(set(utt2spk.values())))}
    for e in range(1, opts.num_epochs + 1):  # fail now, not after hours of training
        path = os.path.join(opts.batches_dir, f"epoch{e}.txt")
        if not os.path.isfile(path):
            raise InputError(
                path,
                None,
                f"batch list of epoch {e} not found (stage 3 must plan at least {opts.num_epochs} epochs)",
            )
    first = rank_batches(opts.batches_dir, 1, opts.num_epochs, ranks.rank, ranks.world_size)
    batch_len = len(first[0])
    num_utt = int(opts.num_utt) if opts.num_utt else infer_num_utt(first[0], utt2spk)
    if batch_len % num_utt:
        raise InputError(
            os.path.join(opts.batches_dir, "epoch1.txt"),
            1,
            f"{batch_len} utterances per batch is not a multiple of M={num_utt}",
        )
    return _Batches(utt2spk, spk2idx, num_utt, batch_len // num_utt, first)


def _build(opts: TrainOptions, cfg: dict[str, Any], device: torch.device, b: _Batches, store: Any, ranks: Ranks) -> Run:
    """Model, loss, optimiser and schedule, initialised from the seed (before any resume)."""
    tcfg = cfg["train"]
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
    num_classes = len(b.spk2idx) * (len(factors) if factors else 1)
    loss_fn = build_loss(cfg["loss"], model.embed_dim, num_classes=num_classes, source=opts.config_source)
    objective = Objective(model, loss_fn).to(device)
    params = [p for p in objective.parameters() if p.requires_grad]
    optimizer = build_optimizer(cfg["optim"], params)
    steps_per_epoch = len(b.first)
    global_batch = ranks.world_size * len(b.first[0])  # the lr follows it (optim.lr_ref_batch)
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
        b.num_spk,
        b.num_utt,
        steps_per_epoch,
        f" per rank ({ranks.world_size} ranks)" if ranks.world_size > 1 else "",
        opts.num_epochs,
        device,
        torch.get_num_threads(),
        (f", AMP {tcfg['amp_dtype']}" if amp else "") + (", crops' fbank on the device" if wave_fbank else ""),
    )
    sizes = (sum(p.numel() for p in model.parameters()), len(b.utt2spk), len(b.spk2idx))
    log_run_scale(log, cfg, global_batch, ranks.world_size, steps_per_epoch, total, sizes)
    crop = (int(tcfg["crop_min_frames"]), int(tcfg["crop_max_frames"]))
    if speed is not None:  # read longer crops; after the warp every speaker has the configured length
        crop = (speed.read_frames(crop[0]), speed.read_frames(crop[1]))
    return Run(
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
        store=store,
        first=b.first,
        num_spk=b.num_spk,
        num_utt=b.num_utt,
        utt2spk=b.utt2spk,
        spk2idx=b.spk2idx,
        crop=crop,
        amp_dtype=amp_dtype,
        wave_aug=wave_aug,
        wave_fbank=wave_fbank,
    )


def _resume_or_init(opts: TrainOptions, run: Run, ckpt_path: Path) -> None:
    """Load ``checkpoint.pth`` (with ``resume``) or set the input statistics of a new model."""
    if opts.resume and ckpt_path.is_file():
        ck = load_checkpoint(ckpt_path)
        changes = accept_resume(  # ResumeRefused before anything is written
            ck,
            run.cfg,
            checkpoint=ckpt_path,
            source=opts.config_source,
            allow_schedule=opts.resume_new_schedule,
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
        init = run.cfg["train"]["init_from"]
        log.info("initialised from %s", load_init(init, run.objective.model, run.objective.loss))
        run.objective.to(run.device)
    else:
        if run.objective.model.input_norm == "global":
            fe, n = run.cfg["frontend"], int(run.cfg["train"]["input_stats_utts"])
            mean, std = input_stats(opts.train_feats, fe, n)  # the same on every rank
            if run.cfg["train"]["input_stats_augmented"]:  # the config requires channel_perturb with it
                shift, var = run.channel.curve_moments()  # the statistics of what the model is fed
                wider = np.sqrt(np.square(std) + var)
                ratio = wider / std
                log.info("input statistics with the channel curves: std x %.2f-%.2f", ratio.min(), ratio.max())
                mean, std = mean + shift, wider
            run.objective.model.set_input_stats(torch.from_numpy(mean).float(), torch.from_numpy(std).float())
        run.objective.to(run.device)


def setup(opts: TrainOptions, cfg: dict[str, Any], ranks: Ranks) -> Run:
    """Everything before the first step (see the module docstring); ``cfg`` is the normalised
    training config.  Returns the run, resumed or new, ready for the loop."""
    out = Path(opts.out_dir)
    device = _device(opts.device, ranks)
    _init_distributed(device, ranks)
    out.mkdir(parents=True, exist_ok=True)
    b = _read_batches(opts, ranks)
    dim_from, feat_dim = train_features(cfg, opts.train_feats, opts.fbank_conf, b.first[0][0])
    data = {
        "train_data": opts.train_data,
        "num_spk": b.num_spk,
        "num_utt": b.num_utt,
        "num_epochs": opts.num_epochs,
        "num_train_speakers": len(b.spk2idx),
        "world_size": ranks.world_size,
    }
    cfg = complete_config(
        cfg,
        feat_dim=feat_dim,
        train_feats=opts.train_feats,
        fbank_conf=opts.fbank_conf,
        vad_conf=opts.vad_conf,
        data=data,
        dim_source=dim_from or opts.fbank_conf or "the default fbank options",
    )
    store = open_store(cfg, opts.train_data, opts.train_feats, known_utts=b.utt2spk)  # a missing shard: said now
    run = _build(opts, cfg, device, b, store, ranks)
    _resume_or_init(opts, run, out / CHECKPOINT)  # a refused resume raises here: config.yaml is written once accepted
    if ranks.is_main:
        write_text_atomic(out / "config.yaml", yaml.safe_dump(run.cfg, sort_keys=False))
    tcfg = cfg["train"]
    run.monitor = Monitor(
        out,
        main=ranks.is_main,
        log_every=int(tcfg["log_every"]),
        tensorboard=bool(tcfg["tensorboard"]),
        purge_step=run.step or None,
    )
    if ranks.is_main and run.epoch <= opts.num_epochs:  # a model.pth from an earlier, shorter run is stale now
        for name in ("model.pth", "loss.pth"):
            (out / name).unlink(missing_ok=True)
    if ranks.is_main and opts.valid_data:
        fe = cfg["frontend"]
        run.validator = Validator(
            opts.valid_data, opts.valid_feats or opts.valid_data, bool(fe["vad"]), bool(fe["mean_norm"])
        )
    run.net = run.objective
    if ranks.world_size > 1:
        run.net = nn.parallel.DistributedDataParallel(
            run.objective, device_ids=[device.index] if device.type == "cuda" else None
        )
    return run
