"""Stage 4 on the GPU (``pytest -m cuda``; test/bench/gpu_check.sh runs these first): an AMP training
step of the VoxCeleb ECAPA-512 AAM config on real speech, finite and close in loss to float32; the
trainer with AMP on its own data; a DDP step over NCCL on one GPU, equal to the plain step.

Skipped without CUDA; under ``GPU_CHECK_DEVICE=cpu`` they run on the CPU (gloo; bfloat16 autocast,
float16 is CUDA-only; a narrower ECAPA)."""

from __future__ import annotations

import copy
from datetime import timedelta

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

from helpers.corpora import speech_files
from helpers.paths import ROOT
from spkflow.features.fbank import FbankOptions, compute_fbank
from spkflow.nnet.losses import build_loss
from spkflow.nnet.models import build_model

pytestmark = pytest.mark.cuda

VOXCELEB = ROOT / "egs" / "voxceleb" / "spk1" / "conf" / "train_ecapa_c512_aam.yaml"
#: |AMP loss - float32 loss| / float32 loss on the same batch and weights, at most (a first bound:
#: the check prints the measured value, so that it can be tightened from GPU figures)
AMP_LOSS_RTOL = {"float16": 0.01, "bfloat16": 0.02}


def voxceleb_objective(accel: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """ECAPA-512 + AAM-softmax (margin 0.2, scale 32) of the VoxCeleb recipe, 100 classes."""
    cfg = yaml.safe_load(VOXCELEB.read_text())
    model_cfg = dict(cfg["model"], input_dim=80, channels=512 if accel == "cuda" else 64)
    loss_cfg = {k: v for k, v in cfg["loss"].items() if k != "margin_warmup"}  # the full margin from step 1
    torch.manual_seed(0)
    return build_model(model_cfg).to(accel).train(), build_loss(loss_cfg, 192, num_classes=100).to(accel)


def speech_crops(corpus, n: int, frames: int = 200) -> torch.Tensor:
    """``n`` crops of ``frames`` fbank frames, half overlapping, mean-normalised, from LibriSpeech, then
    speechocean762 where LibriSpeech runs out (the GPU bundle's 20 LibriSpeech files give 118)."""
    crops = []
    for name in ("LIBRISPEECH", "SPEECHOCEAN762"):
        for path in speech_files(corpus(name), name):
            w, sr = sf.read(path, dtype="float32")
            f = compute_fbank(w, sr, FbankOptions())
            for s in range(0, len(f) - frames, frames // 2):
                crops.append(f[s : s + frames] - f[s : s + frames].mean(0))
            if len(crops) >= n:
                return torch.from_numpy(np.stack(crops[:n]))
    assert len(crops) >= n, f"{len(crops)} crops of {frames} frames, {n} wanted"
    return torch.from_numpy(np.stack(crops[:n]))


@pytest.mark.corpus
@pytest.mark.parametrize("amp_dtype", ["float16", "bfloat16"])
def test_amp_step_is_finite_and_close_to_float32(accel, corpus, amp_dtype):
    if amp_dtype == "float16" and accel != "cuda":
        pytest.skip("float16 autocast is CUDA-only")
    n_spk, n_utt = (64, 2) if accel == "cuda" else (4, 2)  # the recipe's 64 x 2 batch
    x = speech_crops(corpus, n_spk * n_utt).to(accel)
    labels = torch.randperm(100)[:n_spk].to(accel)
    lengths = torch.full((len(x),), x.shape[1], device=accel)
    model, loss_fn = voxceleb_objective(accel)
    amp_model, amp_loss = copy.deepcopy(model), copy.deepcopy(loss_fn)

    def loss_of(m: torch.nn.Module, lf: torch.nn.Module, dtype: torch.dtype | None) -> torch.Tensor:
        torch.manual_seed(1)  # the same SpecAugment masks
        with torch.autocast(accel, dtype=dtype or torch.float32, enabled=dtype is not None):
            emb = m(x, lengths)
        return lf(emb.float().view(n_spk, n_utt, -1), labels)

    ref = loss_of(model, loss_fn, None)
    got = loss_of(amp_model, amp_loss, getattr(torch, amp_dtype))
    rel = abs(got.item() - ref.item()) / abs(ref.item())
    print(f"{accel} AMP {amp_dtype}: loss {got.item():.5f} vs float32 {ref.item():.5f} (relative {rel:.2e})")
    assert torch.isfinite(got) and rel <= AMP_LOSS_RTOL[amp_dtype]
    # the step itself, as the trainer takes it (a GradScaler for float16)
    params = list(amp_model.parameters()) + list(amp_loss.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(accel, enabled=amp_dtype == "float16")
    scaler.scale(got).backward()
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(params, 3.0)
    scaler.step(opt)
    scaler.update()
    assert torch.isfinite(norm) and all(torch.isfinite(p).all() for p in params)
    assert torch.isfinite(loss_of(amp_model, amp_loss, getattr(torch, amp_dtype)))


@pytest.mark.slow
def test_trainer_with_amp_on_the_device(accel, tmp_path):
    """The trainer itself (AMP float16 with its GradScaler on CUDA; float32 on the CPU): finite
    losses, a checkpoint, model.pth."""
    import json

    from helpers.train import make_train_setup
    from spkflow.train.trainer import Trainer, TrainOptions

    s = make_train_setup(tmp_path, epochs=1)
    cfg = dict(s["config"], train={**s["config"]["train"], "amp": True, "amp_dtype": "float16"})
    opts = TrainOptions(
        config=cfg,
        train_data=str(s["data"]),
        train_feats=str(s["feats"]),
        batches_dir=str(s["batches"]),
        out_dir=str(tmp_path / "exp"),
        num_epochs=1,
        fbank_conf=str(s["conf"] / "fbank.conf"),
        vad_conf=str(s["conf"] / "vad.conf"),
        device=accel,
        progress=False,
    )
    history = Trainer(opts).run()
    assert history and all(np.isfinite(h["train_loss"]) for h in history)
    assert (tmp_path / "exp" / "model.pth").is_file()
    assert json.loads((tmp_path / "exp" / "history.json").read_text())["epochs"] == [1]


def test_ddp_step_on_one_device_equals_the_plain_step(accel, tmp_path):
    """DistributedDataParallel over NCCL (gloo on the CPU), one process: the all-reduced gradients
    and the step equal those without DDP.  The rendezvous is a file, not a port: a port found free
    and then bound can be taken in between by another job's store (a CI run hung here 400 s)."""
    import torch.distributed as dist

    backend = "nccl" if accel == "cuda" else "gloo"
    store = f"file://{tmp_path / 'rendezvous'}"
    dist.init_process_group(backend, init_method=store, rank=0, world_size=1, timeout=timedelta(seconds=120))
    try:
        torch.manual_seed(0)
        model = build_model({"name": "ecapa_tdnn", "input_dim": 80, "channels": 64, "scale": 4, "embed_dim": 32})
        model = model.to(accel).train()
        plain = copy.deepcopy(model)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if accel == "cuda" else None)
        x = torch.randn(8, 120, 80, device=accel)
        lengths = torch.full((8,), 120, device=accel)
        for net in (ddp, plain):
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            torch.manual_seed(1)
            net(x, lengths).square().mean().backward()
            opt.step()
        for (name, a), b in zip(model.named_parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        flag = torch.tensor([2.5], device=accel)
        dist.all_reduce(flag)  # what the trainer's ranks agree on each step
        assert float(flag) == 2.5
    finally:
        dist.destroy_process_group()


def test_the_loaders_page_locked_slots_feed_the_device_the_batches_made_in_process(accel, tmp_path):
    """The trainer's loader on the device: two workers, each batch copied with ``non_blocking``
    behind a wait queued on the device and never waited for, so the caller runs ahead of the
    device and the slots (six, page-locked on CUDA) come round while copies from them are queued;
    every batch arrives on the device equal to the batch made in this process."""
    from helpers.train import make_train_setup
    from spkflow.train.batches import read_batch_list
    from spkflow.train.loader import NxMCropDataset, make_loader

    s = make_train_setup(tmp_path, epochs=1)
    batches = read_batch_list(s["batches"] / "epoch1.txt") * 12
    d = NxMCropDataset(s["feats"] / "feats.scp", batches, seed=1, epoch=1, crop=(20, 40), mean_norm="none")
    loader = make_loader(d, num_workers=2, prefetch_factor=2, pin_memory=accel == "cuda")
    on_device = []
    for x, _ in loader:
        if accel == "cuda":
            assert loader.page_locks is not None and loader.page_locks.locked  # the copy reads the slot
            torch.cuda._sleep(2_000_000)  # the device falls behind: the copy below waits in its queue
        on_device.append(x.to(accel, non_blocking=True))
    assert len(on_device) == len(batches) >= 24
    for b, y in enumerate(on_device):
        assert torch.equal(y.cpu(), d[b][0]), f"batch {b} changed on its way to the device"
