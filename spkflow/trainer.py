"""Stage 4: train a speaker embedder on N x M batch lists, one process or DDP, resumable.

What it guarantees
------------------
* **Input**: the epoch batch lists of stage 3 (``<exp>/batches/epoch<E>.txt``, one N x M
  batch per line, speaker-major) and the features of stage 2, read through
  :class:`spkflow.loader.NxMCropDataset` (crop length per batch from
  :func:`spkflow.batches.crop_frames`, crop offsets from a generator seeded by (seed,
  epoch, batch)).  The model's SpecAugment masks and anything else random are drawn from
  the global torch generator, which is re-seeded from (seed, epoch, batch) before every
  step.  So a step is a pure function of (files, config, seed, epoch, batch index, the
  weights before it).
* **Resume**: ``checkpoint.pth`` holds model, loss parameters (GE2E's w and b, AAM's class
  weights), optimizer, scheduler, the position (epoch, next batch), the global step, the
  history and RNG states; it contains only tensors and plain containers and loads with
  ``torch.load(..., weights_only=True)``.  It is written atomically (temporary file,
  fsync, rename) at the end of every epoch, and mid-epoch when training is stopped by
  ``max_steps`` or by SIGINT/SIGTERM (at the next step boundary).  Resuming continues the
  exact batch sequence: ``test/test_trainer.py`` stops mid-epoch, resumes and compares the
  parameters with an uninterrupted run.
* **DDP**: under ``torchrun`` (``WORLD_SIZE > 1``) rank r of W trains on lines r, r+W,
  r+2W, ... of each epoch's batch list, cut to floor(B/W) lines so that all ranks take the
  same number of steps (the split of :func:`spkflow.batches.plan_epoch`, guarantee e).
  Gradients are averaged by ``DistributedDataParallel`` (gloo on CPU, NCCL on GPU); rank 0
  validates and writes files.  A non-finite loss or a stop request on any rank stops all
  ranks at the same step (one small all-reduce per step).
* **Non-finite loss** (or, without AMP, a non-finite gradient norm): training stops with
  :class:`TrainingDiverged`, naming the epoch, the batch (0-based index and line of the batch
  list) and its first utterance ids; nothing is written, so the last good checkpoint stays.
* **Signals**: SIGINT/SIGTERM finish the current step, write a mid-epoch checkpoint and make
  ``spkflow.bin.train`` exit with 128 + signal number, so a recipe does not go on to stage 5.
* **Validation** each epoch (rank 0): EER of cosine scores on ``valid_trials`` with
  embeddings of whole utterances prepared exactly as stage 5 prepares them
  (:func:`spkflow.features.apply_frontend`), batched with padding (the models are padding
  invariant).
* **Model selection** (``train.select``): ``model.pth`` is a plain state dict of the model
  alone: the average of the last ``average_last`` epoch snapshots (``average``, default:
  no test-set peeking), the epoch with the lowest validation EER (``best``), or the last.
  Per-epoch snapshots ``epoch<E>.pth`` are kept.
* **Outputs** in ``out_dir``: ``config.yaml`` (the complete config: the ``frontend``
  section holds the fbank and VAD options of stage 2, so stage 5 rebuilds the training
  input), ``checkpoint.pth``, ``epoch<E>.pth``, ``model.pth``, ``history.json`` (per
  epoch: train loss, validation EER, lr, w/b, seconds) and ``curves.png``.

Augmentation: ``train.speed_perturb`` (e.g. ``[0.9, 1.0, 1.1]``) warps each speaker's crops
by one factor in the feature domain (:mod:`spkflow.augment`; the loader reads ``ceil(T * max
factor)`` frames so every speaker ends with the configured crop length T); for AAM-softmax a
perturbed speaker is its own class (``label + factor_index * S``).  ``model.specaug`` masks
frequency bands and time spans after input normalisation (inside the model, training only).

Gradient clipping: global L2 norm at ``train.grad_clip`` (3, as in the GE2E paper's
training); the paper's extra 0.5 gradient scale on the projection and on (w, b) is not
applied.  AMP (float16 autocast + GradScaler) is used on CUDA when ``train.amp``; the loss
itself is computed in float32.

Compared with the anchors (ESPnet's ``espnet2.train.trainer``, WeSpeaker's ``train.py``):
both resume only at epoch boundaries and re-draw the data order on resume; here an
interrupted epoch continues at the batch it stopped at with the same crops, and the
checkpoint is safe to load with ``weights_only=True``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from spkflow.atomic import write_text_atomic
from spkflow.checkpoint import load_checkpoint, restore, save_checkpoint
from spkflow.config import normalize_train_config
from spkflow.errors import InputError
from spkflow.models import SpeakerEmbedder, build_model

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

    config: Mapping[str, Any]  # the training config (see spkflow.config)
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
    max_steps: int | None = None  # stop (with a checkpoint) after this global step
    device: str = "auto"  # auto | cpu | cuda
    progress: bool = True
    trace_batches: bool = False  # append "epoch batch line utt..." per step to batch_trace.rank<R>.txt


def step_seed(seed: int, epoch: int, batch: int) -> int:
    """The torch seed of one step: a pure function of (seed, epoch, batch index)."""
    ss = np.random.SeedSequence([int(seed), int(epoch), int(batch), 0x74726E])  # "trn"
    return int(ss.generate_state(1, dtype=np.uint64)[0] & ((1 << 63) - 1))


# --------------------------------------------------------------------------- checkpoints


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


def _rng_state() -> dict[str, Any]:
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: Mapping[str, Any]) -> None:
    if "torch" in st:
        torch.set_rng_state(st["torch"])
    if "python" in st:
        random.setstate((3, tuple(int(x) for x in st["python"]), None))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(st["cuda"]))


# --------------------------------------------------------------------------- schedule


def _lr_lambda(cfg: Mapping[str, Any], total_steps: int, steps_per_epoch: int) -> Callable[[int], float]:
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


def _build_optimizer(cfg: Mapping[str, Any], params: list[nn.Parameter]) -> torch.optim.Optimizer:
    name, lr, wd = cfg["name"], float(cfg["lr"]), float(cfg["weight_decay"])
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    return torch.optim.SGD(params, lr=lr, weight_decay=wd, momentum=float(cfg["momentum"]))


# --------------------------------------------------------------------------- validation


def _read_trials(path: str) -> tuple[list[tuple[str, str]], np.ndarray]:
    """``utt1 utt2 target|nontarget`` lines -> pairs and 0/1 labels (InputError names the line)."""
    pairs: list[tuple[str, str]] = []
    labels: list[int] = []
    kinds = {"target": 1, "nontarget": 0}
    try:
        f = open(path, encoding="utf-8")
    except OSError as err:
        raise InputError(path, None, f"cannot read the validation trials: {err.strerror}") from None
    with f:
        for n, line in enumerate(f, start=1):
            fields = line.split()
            if len(fields) != 3 or fields[2] not in kinds:
                raise InputError(path, n, f"expected 'utt1 utt2 target|nontarget', got {line.rstrip()!r}")
            pairs.append((fields[0], fields[1]))
            labels.append(kinds[fields[2]])
    if not pairs or not 0 < sum(labels) < len(labels):
        raise InputError(path, None, "validation trials need target and non-target trials")
    return pairs, np.array(labels)


@torch.no_grad()
def embed_utterances(
    model: SpeakerEmbedder,
    feats: Mapping[str, np.ndarray],
    device: torch.device,
    batch_size: int = 32,
    max_frames: int = 3000,
) -> dict[str, np.ndarray]:
    """Embeddings of whole (frontend-applied) utterances, batched by length with padding."""
    was_training = model.training
    model.eval()
    keys = sorted(feats, key=lambda k: len(feats[k]))
    out: dict[str, np.ndarray] = {}
    for i in range(0, len(keys), batch_size):
        chunk = keys[i : i + batch_size]
        xs = [feats[k][:max_frames] for k in chunk]
        lengths = torch.tensor([len(x) for x in xs])
        pad = torch.zeros(len(xs), int(lengths.max()), xs[0].shape[1])
        for j, x in enumerate(xs):
            pad[j, : len(x)] = torch.from_numpy(x)
        emb = model(pad.to(device), lengths.to(device)).float().cpu().numpy()
        out.update(zip(chunk, emb))
    model.train(was_training)
    return out


class Validator:
    """Validation EER on a trials list with features of stage 2 (loaded once)."""

    def __init__(self, data_dir: str, feats_dir: str, use_vad: bool, mean_norm: bool) -> None:
        from spkflow.features import apply_frontend
        from spkflow.loader import KaldiArkReader

        trials_path = os.path.join(data_dir, "trials")
        self.pairs, self.labels = _read_trials(trials_path)
        utts = sorted({u for p in self.pairs for u in p})
        reader = KaldiArkReader(os.path.join(feats_dir, "feats.scp"))
        vad_path = os.path.join(feats_dir, "vad.scp")
        vad = KaldiArkReader(vad_path) if use_vad and os.path.isfile(vad_path) else None
        if use_vad and vad is None:
            raise InputError(vad_path, None, "frontend.vad is true but there is no vad.scp for validation")
        missing = {u for u in utts if u not in reader}
        if missing:  # e.g. left out by stage 2 with skip_bad: validation goes on without them
            keep = [i for i, (a, b) in enumerate(self.pairs) if a not in missing and b not in missing]
            log.warning(
                "validation: %d utterances of %s have no features in %s (e.g. %s): %d of %d trials left out",
                len(missing),
                trials_path,
                reader.scp,
                sorted(missing)[0],
                len(self.pairs) - len(keep),
                len(self.pairs),
            )
            self.pairs, self.labels = [self.pairs[i] for i in keep], self.labels[keep]
            if not 0 < int(self.labels.sum()) < len(self.labels):
                raise InputError(
                    trials_path, None, f"no target and non-target trials left with features in {reader.scp}"
                )
            utts = [u for u in utts if u not in missing]
        self.feats: dict[str, np.ndarray] = {}
        for u in utts:
            f = reader.read(u)
            v = vad.read(u) if vad is not None else None
            self.feats[u] = apply_frontend(f, v, use_vad=use_vad, mean_norm=mean_norm)
        reader.close()
        if vad is not None:
            vad.close()
        log.info(
            "validation: %d trials (%d target) over %d utterances of %s",
            len(self.pairs),
            int(self.labels.sum()),
            len(utts),
            data_dir,
        )

    def eer(self, model: SpeakerEmbedder, device: torch.device, batch_size: int, max_frames: int) -> float:
        from spkflow.metrics import compute_eer

        emb = embed_utterances(model, self.feats, device, batch_size, max_frames)
        norm = {k: v / max(np.linalg.norm(v), 1e-12) for k, v in emb.items()}
        scores = np.array([float(norm[a] @ norm[b]) for a, b in self.pairs])
        return float(compute_eer(scores, self.labels)[0])


# --------------------------------------------------------------------------- trainer


class _Objective(nn.Module):
    """Model + loss in one module, so that DDP averages the gradients of both."""

    def __init__(self, model: SpeakerEmbedder, loss: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(
        self, feats: torch.Tensor, labels: torch.Tensor, num_spk: int, num_utt: int, autocast: bool
    ) -> torch.Tensor:
        lengths = torch.full((feats.shape[0],), feats.shape[1], dtype=torch.long, device=feats.device)
        with torch.autocast(device_type=feats.device.type, dtype=torch.float16, enabled=autocast):
            emb = self.model(feats, lengths)
        return self.loss(emb.float().view(num_spk, num_utt, -1), labels)


class _StopFlag:
    """SIGINT/SIGTERM set a flag; training stops at the next step boundary with a checkpoint."""

    def __init__(self) -> None:
        self.requested = False
        self.signum = 0
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        log.warning("signal %d: stopping after this step (a checkpoint will be written)", signum)
        self.requested = True
        self.signum = signum

    def __enter__(self) -> _StopFlag:
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


class Trainer:
    """Runs stage 4; see the module docstring.  ``Trainer(opts).run()`` returns the history."""

    def __init__(self, opts: TrainOptions) -> None:
        self.opts = opts
        self.cfg = normalize_train_config(opts.config)
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
        from spkflow.batches import read_batch_list

        path = os.path.join(self.opts.batches_dir, f"epoch{epoch}.txt")
        if not os.path.isfile(path):
            raise InputError(
                path,
                None,
                f"batch list of epoch {epoch} not found (stage 3 plans "
                f"--num_epochs epochs; plan at least {self.opts.num_epochs})",
            )
        batches = read_batch_list(path)
        per_rank = len(batches) // self.world_size
        if per_rank == 0:
            raise InputError(path, None, f"{len(batches)} batches cannot be shared by {self.world_size} ranks")
        return batches[self.rank : per_rank * self.world_size : self.world_size]

    def _labels(self, utts: Sequence[str], epoch: int, index: int) -> torch.Tensor:
        from spkflow.losses import batch_labels

        try:
            return batch_labels(utts, self.utt2spk, self.spk2idx, self.num_utt)
        except ValueError as err:
            line = index * self.world_size + self.rank + 1
            raise InputError(os.path.join(self.opts.batches_dir, f"epoch{epoch}.txt"), line, str(err)) from None

    def _input_stats(self, model: SpeakerEmbedder) -> None:
        """Global per-dimension mean/std of the training input (what crops see), from
        ``input_stats_utts`` utterances evenly spaced in feats.scp (identical on every rank)."""
        from spkflow.features import apply_frontend
        from spkflow.loader import KaldiArkReader

        fe = self.cfg["frontend"]
        reader = KaldiArkReader(os.path.join(self.opts.train_feats, "feats.scp"))
        vad_path = os.path.join(self.opts.train_feats, "vad.scp")
        vad = KaldiArkReader(vad_path) if fe["vad"] else None
        n = int(self.cfg["train"]["input_stats_utts"])
        total = None
        count = 0
        keys = reader.keys()
        for u in keys[:: max(1, len(keys) // n)][:n]:  # spread over the list (and so over speakers)
            x = apply_frontend(
                reader.read(u),
                vad.read(u) if vad is not None else None,
                use_vad=bool(fe["vad"]),
                mean_norm=bool(fe["mean_norm"]),
            ).astype(np.float64)
            s = np.stack([x.sum(0), np.square(x).sum(0)])
            total = s if total is None else total + s
            count += len(x)
        assert total is not None
        mean = total[0] / count
        std = np.sqrt(np.maximum(total[1] / count - mean**2, 1e-10))
        model.set_input_stats(torch.from_numpy(mean).float(), torch.from_numpy(std).float())
        log.info("input statistics from %d utterances (%d frames)", min(n, len(reader)), count)

    def _complete_config(self, feat_dim: int, num_spk: int) -> dict[str, Any]:
        cfg = json.loads(json.dumps(self.cfg))  # deep copy of plain data
        fe = cfg["frontend"]
        from spkflow.features import FbankOptions, VadOptions

        if self.opts.fbank_conf:
            fe["fbank"] = FbankOptions.from_kaldi_conf(self.opts.fbank_conf).to_dict()
        elif fe.get("fbank") is None:
            fe["fbank"] = FbankOptions(num_mel_bins=feat_dim).to_dict()
        if self.opts.vad_conf:
            fe["vad_conf"] = dataclasses.asdict(VadOptions.from_kaldi_conf(self.opts.vad_conf))
        elif fe.get("vad_conf") is None:
            fe["vad_conf"] = dataclasses.asdict(VadOptions())
        fb_dim = FbankOptions.from_dict(fe["fbank"]).dim
        if fb_dim != feat_dim:
            raise InputError(
                os.path.join(self.opts.train_feats, "feats.scp"),
                None,
                f"features have {feat_dim} dimensions but the fbank options give {fb_dim}",
            )
        cfg["model"].setdefault("input_dim", feat_dim)
        if int(cfg["model"]["input_dim"]) != feat_dim:
            raise InputError(
                os.path.join(self.opts.train_feats, "feats.scp"),
                None,
                f"features have {feat_dim} dimensions but model.input_dim is {cfg['model']['input_dim']}",
            )
        cfg["data"] = {
            "train_data": self.opts.train_data,
            "num_spk": num_spk,
            "num_utt": self.num_utt,
            "num_epochs": self.opts.num_epochs,
            "num_train_speakers": len(self.spk2idx),
            "world_size": self.world_size,
        }
        return cfg

    # ----------------------------------------------------------------- main loop
    def run(self) -> list[dict[str, Any]]:
        from spkflow.datadir import read_kv
        from spkflow.loader import KaldiArkReader, NxMCropDataset, make_loader
        from spkflow.losses import build_loss

        opts, tcfg = self.opts, self.cfg["train"]
        device = self._device()
        self._init_distributed(device)
        self.out.mkdir(parents=True, exist_ok=True)

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
        self.num_utt = int(opts.num_utt) if opts.num_utt else _infer_num_utt(first[0], self.utt2spk)
        if batch_len % self.num_utt:
            raise InputError(
                os.path.join(opts.batches_dir, "epoch1.txt"),
                1,
                f"{batch_len} utterances per batch is not a multiple of M={self.num_utt}",
            )
        num_spk = batch_len // self.num_utt
        feats = KaldiArkReader(os.path.join(opts.train_feats, "feats.scp"))
        feat_dim = feats.read_rows(first[0][0], 0, 1).shape[1]
        cfg = self._complete_config(feat_dim, num_spk)
        if self.is_main:
            write_text_atomic(self.out / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))

        seed = int(tcfg["seed"])
        torch.manual_seed(seed)
        model = build_model(cfg["model"])
        speed = None
        if tcfg["speed_perturb"]:
            from spkflow.augment import FbankSpeedPerturb

            speed = FbankSpeedPerturb(tcfg["speed_perturb"], cfg["frontend"]["fbank"])
        # with speed perturbation a classification loss sees speaker x factor as its classes
        num_classes = len(self.spk2idx) * (len(speed.factors) if speed is not None else 1)
        loss_fn = build_loss(cfg["loss"], model.embed_dim, num_classes=num_classes)
        objective = _Objective(model, loss_fn).to(device)
        params = [p for p in objective.parameters() if p.requires_grad]
        optimizer = _build_optimizer(cfg["optim"], params)
        steps_per_epoch = len(first)
        total_steps = steps_per_epoch * opts.num_epochs
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, _lr_lambda(cfg["scheduler"], total_steps, steps_per_epoch)
        )
        amp = bool(tcfg["amp"]) and device.type == "cuda"
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
            ", AMP" if amp else "",
        )
        scaler = torch.amp.GradScaler("cuda", enabled=amp)

        epoch, start_batch, step = 1, 0, 0
        history: list[dict[str, Any]] = []
        ckpt_path = self.out / CHECKPOINT
        if opts.resume and ckpt_path.is_file():
            ck = load_checkpoint(ckpt_path)
            parts = {"model": objective.model, "loss": objective.loss, "optimizer": optimizer, "scheduler": scheduler}
            restore(ckpt_path, ck, parts, required=("epoch", "batch", "step"))
            if "scaler" in ck and amp:
                scaler.load_state_dict(ck["scaler"])
            epoch, start_batch, step = int(ck["epoch"]), int(ck["batch"]), int(ck["step"])
            history = list(ck.get("history", []))
            _set_rng_state(ck.get("rng", {}))
            log.info("resumed from %s: epoch %d, batch %d, step %d", ckpt_path, epoch, start_batch, step)
        else:
            if objective.model.input_norm == "global":
                self._input_stats(objective.model)
            objective.to(device)

        if self.is_main and epoch <= opts.num_epochs:  # a model.pth from an earlier, shorter run is stale now
            (self.out / "model.pth").unlink(missing_ok=True)
        validator = None
        if self.is_main and opts.valid_data:
            validator = Validator(
                opts.valid_data,
                opts.valid_feats or opts.valid_data,
                bool(cfg["frontend"]["vad"]),
                bool(cfg["frontend"]["mean_norm"]),
            )

        net: nn.Module = objective
        if self.world_size > 1:
            net = nn.parallel.DistributedDataParallel(
                objective, device_ids=[device.index] if device.type == "cuda" else None
            )

        def checkpoint(next_epoch: int, next_batch: int) -> None:
            if not self.is_main:
                return
            state = {
                "model": objective.model.state_dict(),
                "loss": objective.loss.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "epoch": next_epoch,
                "batch": next_batch,
                "step": step,
                "history": history,
                "rng": _rng_state(),
                "world_size": self.world_size,
                "sampler": {"seed": seed, "epoch": next_epoch, "position": next_batch},
            }
            if amp:
                state["scaler"] = scaler.state_dict()
            save_checkpoint(ckpt_path, state)

        fe = cfg["frontend"]
        crop_range = (int(tcfg["crop_min_frames"]), int(tcfg["crop_max_frames"]))
        if speed is not None:  # read longer crops; after the warp every speaker has the configured length
            crop_range = (speed.read_frames(crop_range[0]), speed.read_frames(crop_range[1]))
        stopped = False
        with _StopFlag() as stop:
            while epoch <= opts.num_epochs and not stopped:
                batches = first if epoch == 1 else self._epoch_batches(epoch)
                if len(batches) != steps_per_epoch:
                    log.warning(
                        "epoch %d has %d batches per rank (epoch 1: %d); the schedule assumes %d",
                        epoch,
                        len(batches),
                        steps_per_epoch,
                        steps_per_epoch,
                    )
                dataset = NxMCropDataset(
                    os.path.join(opts.train_feats, "feats.scp"),
                    batches,
                    seed=seed,
                    epoch=epoch,
                    crop=crop_range,
                    use_vad=bool(fe["vad"]),
                    mean_norm="utterance" if fe["mean_norm"] else "none",
                    feats=feats,
                )
                loader = make_loader(dataset, start_batch=start_batch, num_workers=int(tcfg["num_workers"]))
                net.train()
                t0 = time.time()
                losses: list[float] = [] if start_batch == 0 else list(_partial_losses(history, epoch))
                bar = _progress(len(batches), start_batch, epoch, opts.progress and self.is_main)
                index = start_batch
                for index, (x, utts) in enumerate(loader, start=start_batch):
                    torch.manual_seed(step_seed(seed, epoch, index))
                    labels = self._labels(utts, epoch, index)
                    if speed is not None:
                        x, factor = speed(x, self.num_utt)
                        labels = labels + factor * len(self.spk2idx)
                    labels = labels.to(device)
                    x = x.to(device, non_blocking=True)
                    loss = net(x, labels, num_spk, self.num_utt, amp)
                    flags = torch.tensor(
                        [
                            loss.detach().float().item(),
                            float(stop.requested),
                            float(opts.max_steps is not None and step + 1 >= opts.max_steps),
                        ]
                    )
                    if self.world_size > 1:
                        flags = flags.to(device)
                        torch.distributed.all_reduce(flags)
                        flags = flags.cpu()
                    if not math.isfinite(float(flags[0])):
                        bad = loss.detach().float().item()
                        where = (
                            f"epoch {epoch}, batch {index} (line {index * self.world_size + self.rank + 1} of "
                            f"{opts.batches_dir}/epoch{epoch}.txt, rank {self.rank}), utterances "
                            f"{' '.join(utts[:3])} ..."
                        )
                        msg = (
                            f"non-finite loss {bad} at {where}"
                            if not math.isfinite(bad)
                            else f"non-finite loss on another rank at epoch {epoch}, batch {index}"
                        )
                        log.error("%s; the last good checkpoint %s is kept", msg, ckpt_path)
                        raise TrainingDiverged(msg)
                    if opts.trace_batches:
                        with open(self.out / f"batch_trace.rank{self.rank}.txt", "a", encoding="utf-8") as tf:
                            tf.write(f"{epoch} {index} {index * self.world_size + self.rank + 1} {' '.join(utts)}\n")
                    optimizer.zero_grad(set_to_none=True)
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                    clip = float(tcfg["grad_clip"])
                    norm = nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
                    if not amp and not math.isfinite(float(norm)):  # (with AMP the scaler skips such steps)
                        msg = (
                            f"non-finite gradient norm {float(norm)} at epoch {epoch}, batch {index} (line "
                            f"{index * self.world_size + self.rank + 1} of {opts.batches_dir}/epoch{epoch}.txt), "
                            f"utterances {' '.join(utts[:3])} ..."
                        )
                        log.error("%s; the last good checkpoint %s is kept", msg, ckpt_path)
                        raise TrainingDiverged(msg)
                    scaler.step(optimizer)
                    scaler.update()
                    scheduler.step()
                    step += 1
                    value = float(flags[0]) / self.world_size
                    losses.append(value)
                    bar.update(1)
                    if self.is_main and step % int(tcfg["log_every"]) == 0:
                        extra = " ".join(f"{k}={v:.3f}" for k, v in objective.loss.scalars().items())
                        log.info(
                            "epoch %d step %d batch %d/%d loss %.4f lr %.3g %s",
                            epoch,
                            step,
                            index + 1,
                            len(batches),
                            value,
                            scheduler.get_last_lr()[0],
                            extra,
                        )
                    if flags[1] > 0 or flags[2] > 0:
                        if index + 1 < len(batches):
                            _remember_partial(history, epoch, losses)
                            checkpoint(epoch, index + 1)
                        else:
                            stopped = True  # finish the epoch bookkeeping below, then stop
                            self._stopped(flags, stop)
                            break
                        bar.close()
                        self._stopped(flags, stop)
                        why = "a signal" if flags[1] > 0 else f"max_steps={opts.max_steps}"
                        log.info(
                            "stopped by %s at epoch %d batch %d (step %d); checkpoint %s",
                            why,
                            epoch,
                            index + 1,
                            step,
                            ckpt_path,
                        )
                        return history
                bar.close()
                # end of epoch
                row: dict[str, Any] = {
                    "epoch": epoch,
                    "train_loss": float(np.mean(losses)) if losses else float("nan"),
                    "lr": float(scheduler.get_last_lr()[0]),
                    "seconds": round(time.time() - t0, 1),
                    "steps": step,
                }
                row.update({k: float(v) for k, v in objective.loss.scalars().items() if math.isfinite(v)})
                _forget_partial(history, epoch)
                if self.is_main:
                    save_checkpoint(self.out / f"epoch{epoch}.pth", objective.model.state_dict())
                    if validator is not None:
                        tv = time.time()
                        row["valid_eer"] = validator.eer(
                            objective.model, device, int(tcfg["valid_batch_size"]), int(tcfg["valid_max_frames"])
                        )
                        row["valid_seconds"] = round(time.time() - tv, 1)
                    log.info("epoch %d done: %s", epoch, json.dumps(row))
                history.append(row)
                epoch, start_batch = epoch + 1, 0
                checkpoint(epoch, 0)
                if self.world_size > 1:
                    torch.distributed.barrier()
                if not stopped and epoch <= opts.num_epochs:  # a signal during validation: stop here
                    late = torch.tensor([float(stop.requested)])
                    if self.world_size > 1:
                        late = late.to(device)
                        torch.distributed.all_reduce(late)
                        late = late.cpu()
                    if late[0] > 0:
                        stopped = True
                        self.stopped_by, self.stop_signal = "signal", stop.signum or int(signal.SIGTERM)
                if stopped and epoch <= opts.num_epochs:
                    why = "a signal" if self.stopped_by == "signal" else f"max_steps={opts.max_steps}"
                    log.info(
                        "stopped by %s at the end of epoch %d (step %d); checkpoint %s", why, epoch - 1, step, ckpt_path
                    )
                    return history

        self.stopped_by, self.stop_signal = None, 0  # every epoch was trained
        if self.is_main:
            self._finish(history, cfg)
        if self.world_size > 1:
            torch.distributed.barrier()
        return history

    def _stopped(self, flags: torch.Tensor, stop: _StopFlag) -> None:
        self.stopped_by = "signal" if flags[1] > 0 else "max_steps"
        self.stop_signal = (stop.signum or int(signal.SIGTERM)) if flags[1] > 0 else 0

    def _finish(self, history: list[dict[str, Any]], cfg: Mapping[str, Any]) -> None:
        tcfg = cfg["train"]
        epochs = [int(r["epoch"]) for r in history if "epoch" in r and "partial" not in r]
        select = tcfg["select"]
        if select == "best" and any("valid_eer" in r for r in history):
            best = min((r for r in history if "valid_eer" in r), key=lambda r: r["valid_eer"])
            chosen = [int(best["epoch"])]
        elif select == "average":
            chosen = epochs[-max(1, int(tcfg["average_last"])) :]
        else:
            if select == "best":
                log.warning("train.select=best without validation: using the last epoch")
            chosen = epochs[-1:]
        states = [load_checkpoint(self.out / f"epoch{e}.pth") for e in chosen]
        final = average_state_dicts(states)
        save_checkpoint(self.out / "model.pth", final)
        summary = {"select": select, "epochs": chosen, "history": history}
        write_text_atomic(self.out / "history.json", json.dumps(summary, indent=2) + "\n")
        log.info("model.pth = %s of epoch(s) %s", "average" if len(chosen) > 1 else "weights", chosen)
        try:
            from spkflow.plots import plot_training_curves

            rows = [
                {k: v for k, v in r.items() if k in ("epoch", "train_loss", "valid_eer") or (k == "lr" and v > 0)}
                for r in history
            ]
            plot_training_curves(rows, self.out / "curves.png", title=f"training: {self.out.name}")
        except Exception as err:  # a plot must not fail a finished training
            log.warning("could not draw curves.png: %s", err)


def _infer_num_utt(batch: Sequence[str], utt2spk: Mapping[str, str]) -> int:
    """M from a speaker-major batch: the length of the first run of one speaker."""
    spk = utt2spk.get(batch[0])
    m = 0
    while m < len(batch) and utt2spk.get(batch[m]) == spk:
        m += 1
    return max(m, 1)


def _remember_partial(history: list[dict[str, Any]], epoch: int, losses: list[float]) -> None:
    _forget_partial(history, epoch)
    history.append({"epoch": epoch, "partial": True, "losses": [float(v) for v in losses]})


def _partial_losses(history: list[dict[str, Any]], epoch: int) -> list[float]:
    for r in history:
        if r.get("partial") and r.get("epoch") == epoch:
            return list(r["losses"])
    return []


def _forget_partial(history: list[dict[str, Any]], epoch: int) -> None:
    history[:] = [r for r in history if not (r.get("partial") and r.get("epoch") == epoch)]


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, initial: int, epoch: int, enabled: bool) -> Any:
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
