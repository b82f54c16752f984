"""Benchmark: embedding extraction and training throughput on a GPU (or, small, on the CPU), and
whether the input pipeline or the model is the limit.

    .venv/bin/python test/bench/bench_gpu.py [--device cuda|cpu] [--batch-sizes 1,8,32,64,128,256]
        [--num-utts 2000] [--min-sec 2 --max-sec 12] [--num-workers 8] [--model-dir DIR]
        [--data DIR] [--channels 512] [--dtypes float32,bfloat16,float16] [--amp true|false]
        [--amp-dtype float16|bfloat16] [--train-steps 50] [--json out.json]

Data: utterances of 2-12 s (--min-sec/--max-sec) of real speech, speechocean762 train + test
from the recipe's db.sh (the corpus is referenced, never copied), or any data dir (--data).
Models: ECAPA-TDNN with --channels (512: the 6.2 M-parameter model of the papers) and *random
weights*, plus the stage-4 model dir --model-dir when given (e.g. the demo recipe's model).

Extraction, per model, per --dtypes entry (stage 5's --dtype: autocast; float16 on CUDA only) and
per batch size B (batches of at most B utterances, length-sorted, as stage 5 plans them):
* end to end: ``spkflow.embed.run.run_job`` (stage 5's job: DataLoader workers decode the audio and
  compute fbank + VAD, the model embeds, the job writes its ark), utterances/s;
* model alone: the same batches with their inputs computed beforehand, utterances/s;
* on CUDA, GPU utilisation (mean and max %, nvidia-smi every 0.2 s) during each phase;
* the limit: "model" when end to end reaches >= 90 % of the model alone, else "loader";
* for a reduced dtype, the lowest cosine of its embeddings against float32's (parity).
Training (ECAPA, GE2E on N x M batches of --crop frames, Adam, AMP on CUDA with --amp true in
--amp-dtype, float16 with a GradScaler, bfloat16 without):
* with the loader: stage 4's NxMCropDataset + make_loader over stage-2 features of the same
  utterances (computed first by scripts/feats/make_fbank.sh), steps/s;
* model alone: one batch kept on the device, the same number of steps, steps/s.
The ratio loader / model says which is the limit (>= 0.9: the model; below: the loader).

Prints one table per part and, with --json, writes every figure. On the CPU use small sizes
(test/embed/test_bench_gpu.py runs it in seconds so that it cannot rot).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

FRAMES_PER_SEC = 100  # 10 ms fbank frames


# ------------------------------------------------------------------------------- GPU sampling
class GpuSampler:
    """GPU utilisation of ``device_index`` sampled every ``interval`` s while active (nvidia-smi;
    pynvml when installed). ``summary()`` -> (mean %, max %) or (None, None) off CUDA."""

    def __init__(self, device_index: int | None, interval: float = 0.2) -> None:
        self.index = device_index
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        if device_index is not None:
            try:
                import pynvml  # optional

                pynvml.nvmlInit()
                self._nvml = pynvml.nvmlDeviceGetHandleByIndex(device_index)
                self._pynvml = pynvml
            except Exception:  # noqa: BLE001  (absent or unusable: fall back to nvidia-smi)
                self._nvml = None

    def _read(self) -> float | None:
        if self._nvml is not None:
            return float(self._pynvml.nvmlDeviceGetUtilizationRates(self._nvml).gpu)
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", str(self.index)],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
            return float(out.split()[0])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            v = self._read()
            if v is not None:
                self.samples.append(v)
            self._stop.wait(self.interval)

    @contextmanager
    def active(self) -> Iterator[GpuSampler]:
        self.samples = []
        if self.index is None:
            yield self
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()

    def summary(self) -> tuple[float | None, float | None]:
        if not self.samples:
            return None, None
        return round(sum(self.samples) / len(self.samples), 1), max(self.samples)


def fmt_util(u: tuple[float | None, float | None]) -> str:
    return "-" if u[0] is None else f"{u[0]:.0f}/{u[1]:.0f}"


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------- data, models
def speech_data_dir(out: Path, data: Path | None, num_utts: int, min_sec: float, max_sec: float) -> Path:
    """A data dir of ``num_utts`` utterances of min_sec..max_sec seconds, whole speakers first."""
    from spkflow.data.audio import known_durations
    from spkflow.data.tables import read_kv

    if data is None:
        from bench_embed import build_data_dir  # speechocean762 through db.sh

        data = build_data_dir(out / "all", None)
    wav = read_kv(data / "wav.scp")
    u2s = read_kv(data / "utt2spk")
    dur = known_durations(data, list(wav))
    fit = sorted((u for u, d in dur.items() if d is not None and min_sec <= d <= max_sec), key=lambda u: u.encode())
    if not fit:
        sys.exit(f"no utterance of {min_sec}-{max_sec} s in {data}")
    # whole speakers, in a fixed order spread over the speaker list, so that training finds M
    # utterances per speaker
    by_spk: dict[str, list[str]] = {}
    for u in fit:
        by_spk.setdefault(u2s[u], []).append(u)
    spks = sorted(by_spk)
    order = spks[::7] + [s for s in spks if s not in set(spks[::7])]
    keep: list[str] = []
    for s in order:
        keep += by_spk[s][: num_utts - len(keep)]
        if len(keep) >= num_utts:
            break
    keep.sort(key=lambda u: u.encode())
    d = out / "data"
    d.mkdir(parents=True, exist_ok=True)
    (d / "wav.scp").write_text("".join(f"{u} {wav[u]}\n" for u in keep))
    (d / "utt2spk").write_text("".join(f"{u} {u2s[u]}\n" for u in keep))
    (d / "utt2dur").write_text("".join(f"{u} {dur[u]:.3f}\n" for u in keep))
    s2u: dict[str, list[str]] = {}
    for u in keep:
        s2u.setdefault(u2s[u], []).append(u)
    (d / "spk2utt").write_text("".join(f"{s} {' '.join(v)}\n" for s, v in sorted(s2u.items())))
    return d


def ecapa_model_dir(out: Path, channels: int) -> Path:
    """A stage-4 model dir of ECAPA-TDNN with random weights (80-bin fbank + energy VAD)."""
    import torch
    import yaml

    from spkflow.features.fbank import FbankOptions, VadOptions
    from spkflow.nnet.models import build_model

    model_cfg = {"name": "ecapa_tdnn", "input_dim": 80, "channels": channels, "scale": 8, "embed_dim": 192}
    cfg = {
        "frontend": {
            "vad": True,
            "mean_norm": False,
            "fbank": FbankOptions().to_dict(),
            "vad_conf": dataclasses.asdict(VadOptions()),
        },
        "model": model_cfg,
    }
    torch.manual_seed(0)
    model = build_model(model_cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), out / "model.pth")
    return out


def _embed_api() -> tuple[Any, Any, Any]:
    """(load_embedder, plan_batches, run_job): stage 5's pieces."""
    from spkflow.embed import load_embedder
    from spkflow.embed.base import plan_batches
    from spkflow.embed.run import run_job

    return load_embedder, plan_batches, run_job


# ------------------------------------------------------------------------------- extraction
def bench_extraction(
    name: str,
    model_dir: Path,
    data: Path,
    work: Path,
    device: str,
    batch_sizes: Sequence[int],
    num_workers: int,
    sampler: GpuSampler,
    dtype: str = "float32",
    reference: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``reference``: float32 embeddings per utterance (filled when dtype is float32, compared
    against otherwise)."""
    import numpy as np
    import torch

    from spkflow.data.audio import known_durations
    from spkflow.data.tables import read_kv

    load_embedder, plan_batches, run_job = _embed_api()
    embedder = load_embedder("spkflow", model_dir, device, dtype=dtype)
    utts = sorted(read_kv(data / "utt2spk"), key=lambda u: u.encode())
    durations = known_durations(data, utts)
    longest = max(int(d * FRAMES_PER_SEC) + 10 for d in durations.values() if d is not None)
    prepare = embedder.preparer(data)
    t = time.perf_counter()
    inputs = {u: prepare(u) for u in utts}  # for the model-alone figure
    prep_s = time.perf_counter() - t
    embedder.embed([inputs[utts[0]]])  # warm-up (CUDA context, kernels)
    rows = []
    for b in batch_sizes:
        max_frames = b * longest  # the batch size, not the frame budget, is what limits a batch
        job = work / f"job_{Path(name.split()[0]).name}_{dtype}_b{b}"
        shutil.rmtree(job, ignore_errors=True)
        with sampler.active():
            t = time.perf_counter()
            run_job(
                embedder,
                data,
                utts,
                job,
                1,
                batch_size=b,
                max_frames=max_frames,
                num_workers=num_workers,
                progress=False,
            )
            e2e = time.perf_counter() - t
        util_e2e = sampler.summary()
        batches = plan_batches(utts, durations, b, max_frames)
        with sampler.active():
            t = time.perf_counter()
            vecs = {}
            for batch in batches:
                vecs.update(zip(batch, embedder.embed([inputs[u] for u in batch]), strict=True))
            model_s = time.perf_counter() - t
        util_model = sampler.summary()
        min_cos = None
        if reference is not None and dtype == "float32":
            reference.update(vecs)
        elif reference:
            cos = [
                float(vecs[u] @ reference[u] / (np.linalg.norm(vecs[u]) * np.linalg.norm(reference[u]))) for u in utts
            ]
            min_cos = round(min(cos), 6)
        e2e_rate, model_rate = len(utts) / e2e, len(utts) / model_s
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() and device != "cpu" else None
        rows.append(
            {
                "model": name,
                "dtype": dtype,
                "batch_size": b,
                "utts": len(utts),
                "batches": len(batches),
                "e2e_utt_per_s": round(e2e_rate, 2),
                "model_utt_per_s": round(model_rate, 2),
                "limit": "model" if e2e_rate >= 0.9 * model_rate else "loader",
                "min_cosine_vs_float32": min_cos,
                "gpu_util_e2e": util_e2e,
                "gpu_util_model": util_model,
                "prepare_utt_per_s_one_process": round(len(utts) / prep_s, 2),
                "peak_gpu_mem_gib": None if peak is None else round(peak, 2),
            }
        )
        shutil.rmtree(job, ignore_errors=True)
    return rows


# ------------------------------------------------------------------------------- training
def bench_training(
    data: Path,
    work: Path,
    device_name: str,
    channels: int,
    num_spk: int,
    num_utt: int,
    crop: int,
    steps: int,
    warmup: int,
    num_workers: int,
    amp: bool,
    sampler: GpuSampler,
    amp_dtype: str = "float16",
) -> dict[str, Any]:
    import torch

    from spkflow.core.errors import InputError
    from spkflow.data.tables import read_kv
    from spkflow.nnet.losses import batch_labels, build_loss
    from spkflow.nnet.models import build_model
    from spkflow.train.batches import plan_epoch
    from spkflow.train.loader import NxMCropDataset, make_loader

    feats = work / "fbank"
    if not (feats / "feats.scp").is_file():
        num = len((data / "utt2spk").read_text().splitlines())
        nj = max(1, min(os.cpu_count() or 1, 8, num // 100))  # a job per 100 utterances at most
        r = subprocess.run(
            ["bash", str(ROOT / "scripts/feats/make_fbank.sh"), "--nj", str(nj), str(data), str(feats)],
            capture_output=True,
            text=True,
            env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{ROOT / 'utils'}:{os.environ['PATH']}"),
        )
        if r.returncode != 0:
            sys.exit(f"make_fbank.sh failed:\n{r.stderr[-3000:]}")
    device = torch.device(device_name)
    amp = amp and device.type == "cuda"
    try:
        batches = [list(b) for b in plan_epoch(feats / "spk2utt", num_spk, num_utt, seed=0, epoch=1).batches]
    except InputError as err:
        sys.exit(f"training part: {err} (use more --num-utts or a smaller --num-spk / --num-utt)")
    need = steps + warmup
    if len(batches) < need:  # repeat the epoch's plan (another epoch's crops) to have enough
        batches = (batches * (need // max(1, len(batches)) + 1))[:need]
    utt2spk = read_kv(feats / "utt2spk")
    spk2idx = {s: i for i, s in enumerate(sorted(set(utt2spk.values())))}
    torch.manual_seed(0)
    model = build_model({"name": "ecapa_tdnn", "input_dim": 80, "channels": channels, "scale": 8, "embed_dim": 192})
    loss_fn = build_loss({"name": "ge2e"}, model.embed_dim)
    model.to(device).train()
    loss_fn.to(device)
    opt = torch.optim.Adam(list(model.parameters()) + list(loss_fn.parameters()), lr=1e-3)
    autocast_dtype = getattr(torch, amp_dtype)
    scaler = torch.amp.GradScaler("cuda", enabled=amp and autocast_dtype == torch.float16)

    def step(x: torch.Tensor, labels: torch.Tensor) -> None:
        lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.long, device=device)
        with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=amp):
            emb = model(x, lengths)
        loss = loss_fn(emb.float().view(num_spk, num_utt, -1), labels)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    dataset = NxMCropDataset(feats / "feats.scp", batches[:need], seed=0, epoch=1, crop=crop, use_vad=True)
    loader = make_loader(dataset, num_workers=num_workers, pin_memory=device.type == "cuda")
    it = iter(loader)
    first = None
    for _ in range(warmup):
        x, utts = next(it)
        first = first or (x.clone(), utts)
        step(x.to(device, non_blocking=True), batch_labels(utts, utt2spk, spk2idx, num_utt).to(device))
    sync(device)
    with sampler.active():
        t = time.perf_counter()
        for x, utts in it:
            step(x.to(device, non_blocking=True), batch_labels(utts, utt2spk, spk2idx, num_utt).to(device))
        sync(device)
        with_loader = time.perf_counter() - t
    util_loader = sampler.summary()
    if first is None:  # no warm-up: the first batch of the plan
        first = dataset[0]
    x0 = first[0].to(device)
    y0 = batch_labels(first[1], utt2spk, spk2idx, num_utt).to(device)
    with sampler.active():
        t = time.perf_counter()
        for _ in range(steps):
            step(x0, y0)
        sync(device)
        alone = time.perf_counter() - t
    util_model = sampler.summary()
    r_loader, r_model = steps / with_loader, steps / alone
    return {
        "batch": f"{num_spk}x{num_utt}x{crop} frames",
        "channels": channels,
        "amp": amp,
        "amp_dtype": amp_dtype if amp else None,
        "steps": steps,
        "num_workers": num_workers,
        "loader_steps_per_s": round(r_loader, 3),
        "model_steps_per_s": round(r_model, 3),
        "loader_over_model": round(r_loader / r_model, 3),
        "limit": "model" if r_loader >= 0.9 * r_model else "loader",
        "gpu_util_loader": util_loader,
        "gpu_util_model": util_model,
    }


# ------------------------------------------------------------------------------- main
def str2bool(v: str) -> bool:
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"want true or false, got {v!r}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    p.add_argument("--batch-sizes", default="1,8,32,64,128,256")
    p.add_argument("--num-utts", type=int, default=2000)
    p.add_argument("--min-sec", type=float, default=2.0)
    p.add_argument("--max-sec", type=float, default=12.0)
    p.add_argument("--data", type=Path, default=None, help="a data dir instead of speechocean762 (db.sh)")
    p.add_argument("--model-dir", type=Path, default=None, help="also bench this stage-4 model dir (e.g. the demo)")
    p.add_argument("--channels", type=int, default=512, help="ECAPA channels (512: ECAPA-512)")
    p.add_argument("--num-workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 1)))
    p.add_argument("--dtypes", default="float32", help="extraction dtypes, comma-separated (float16: cuda only)")
    p.add_argument("--amp", type=str2bool, default=True, help="autocast in training on CUDA")
    p.add_argument("--amp-dtype", choices=("float16", "bfloat16"), default="float16", help="training AMP dtype")
    p.add_argument("--train-steps", type=int, default=50, help="timed training steps (0: no training part)")
    p.add_argument("--train-warmup", type=int, default=5)
    p.add_argument("--num-spk", type=int, default=32)
    p.add_argument("--num-utt", type=int, default=4)
    p.add_argument("--crop", type=int, default=200, help="training crop, frames")
    p.add_argument("--threads", type=int, default=0, help="torch threads of this process (0: torch's default)")
    p.add_argument("--skip-extract", action="store_true")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench_gpu"))
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    a = p.parse_args(argv)
    import torch

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but CUDA is not available (use --device cpu with small sizes)")
    sampler = GpuSampler((dev.index or 0) if dev.type == "cuda" else None)
    a.workdir.mkdir(parents=True, exist_ok=True)
    data = speech_data_dir(a.workdir, a.data, a.num_utts, a.min_sec, a.max_sec)
    secs = [float(ln.split()[1]) for ln in (data / "utt2dur").read_text().splitlines()]
    machine = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "utts": len(secs),
        "audio_s": round(sum(secs), 1),
        "utt_s_range": [round(min(secs), 2), round(max(secs), 2)],
    }
    print(
        f"# {machine['device']}, {machine['cpus']} CPUs, torch {machine['torch']} "
        f"({machine['torch_threads']} threads); "
        f"{len(secs)} utterances, {machine['audio_s']} s of speech, {min(secs):.1f}-{max(secs):.1f} s"
    )
    result: dict[str, Any] = {"machine": machine, "args": {k: str(v) for k, v in vars(a).items()}}
    if not a.skip_extract:
        models = [
            (f"ecapa{a.channels} (random weights)", ecapa_model_dir(a.workdir / f"ecapa{a.channels}", a.channels))
        ]
        if a.model_dir:
            models.append((str(a.model_dir), a.model_dir))
        rows: list[dict[str, Any]] = []
        sizes = [int(b) for b in a.batch_sizes.split(",")]
        dtypes = a.dtypes.split(",")
        bad = [d for d in dtypes if d not in ("float32", "bfloat16", "float16")]
        if bad or (dev.type != "cuda" and "float16" in dtypes):
            sys.exit(f"--dtypes: float32, bfloat16, float16 (cuda only); got {a.dtypes!r}")
        # float32 first: the reduced dtypes are compared against its embeddings
        dtypes = sorted(set(dtypes), key=lambda d: d != "float32")
        for name, d in models:
            ref: dict[str, Any] = {}
            for dt in dtypes:
                rows += bench_extraction(name, d, data, a.workdir, a.device, sizes, a.num_workers, sampler, dt, ref)
        print(f"\n## extraction ({a.num_workers} DataLoader workers; GPU util mean/max %)")
        print(
            "| model | dtype | batch | end-to-end utt/s | model-alone utt/s | limit | GPU util e2e | GPU util model "
            "| min cos vs fp32 |"
        )
        print("|---|---|---:|---:|---:|---|---:|---:|---:|")
        for r in rows:
            cos = "-" if r["min_cosine_vs_float32"] is None else f"{r['min_cosine_vs_float32']:.5f}"
            print(
                f"| {r['model']} | {r['dtype']} | {r['batch_size']} | {r['e2e_utt_per_s']:.1f} | "
                f"{r['model_utt_per_s']:.1f} | {r['limit']} | "
                f"{fmt_util(r['gpu_util_e2e'])} | {fmt_util(r['gpu_util_model'])} | {cos} |"
            )
        result["extraction"] = rows
    if a.train_steps > 0:
        tr = bench_training(
            data,
            a.workdir,
            a.device,
            a.channels,
            a.num_spk,
            a.num_utt,
            a.crop,
            a.train_steps,
            a.train_warmup,
            a.num_workers,
            a.amp,
            sampler,
            a.amp_dtype,
        )
        print(
            f"\n## training (ECAPA-{tr['channels']}, GE2E, {tr['batch']}, AMP {tr['amp_dtype'] or 'off'}, "
            f"{tr['num_workers']} workers)"
        )
        print("| with loader steps/s | model alone steps/s | ratio | limit | GPU util loader | GPU util model |")
        print("|---:|---:|---:|---|---:|---:|")
        print(
            f"| {tr['loader_steps_per_s']:.2f} | {tr['model_steps_per_s']:.2f} | {tr['loader_over_model']:.2f} | "
            f"{tr['limit']} | {fmt_util(tr['gpu_util_loader'])} | {fmt_util(tr['gpu_util_model'])} |"
        )
        result["training"] = tr
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
