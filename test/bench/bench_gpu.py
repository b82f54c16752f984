"""Benchmark: on a GPU (or, small, on the CPU), the torch frontend's parity on the device, embedding
extraction and training throughput, and which part is the limit.  test/bench/gpu_check.sh runs it
after the CUDA-marked tests, with one H100 box's sizes, or small with GPU_CHECK_DEVICE=cpu.

    .venv/bin/python test/bench/bench_gpu.py [--device cuda|cpu] [--utt-sec 6] [--num-utts 16000]
        [--batch-sizes 64,256] [--dtypes float32,bfloat16,float16] [--fbank-on workers,device]
        [--extract-format flac|wav]
        [--num-workers N] [--channels 512] [--model-dir DIR] [--data DIR] [--rirs DIR]
        [--train-paths ark,raw,raw-device,trainer] [--train-steps 20] [--num-spk 64 --num-utt 2 --crop 200]
        [--json out.json] [--markdown out.md] [--tests-junit junit.xml] [--workdir /tmp/bench_gpu]

Data: real speech cut into --utt-sec clips (the SPEECH selection of speechocean762 and LibriSpeech
through db.sh, or --data's wav.scp; the corpus itself or test/bench/gpu_bundle.sh's copy), written
as FLAC, then a data dir of --num-utts utterances cycling over the clips ("repeated": decoding and
everything after it run per utterance).  Extraction reads the same clips written as
``--extract-format`` (FLAC by default; gpu_check.sh gives WAV, VoxCeleb 1's format, which stage 5
reads for the Vox1 test sets); training reads the FLAC ones (VoxCeleb 2 converted once, as
egs/voxceleb/spk1/README.md advises).  Models: ECAPA-TDNN with --channels (512: the 6.2 M-parameter
model of the papers) and *random weights*, plus --model-dir when given.

Parts (each timed; the JSON is rewritten after each, so a part cut short keeps the others):
1. fbank parity: :func:`spkflow.features.torch_fbank.fbank_batch` on the device against the numpy
   :func:`spkflow.features.fbank.compute_fbank` on the real speech of every rate the recipes use
   (``fbank_max_abs_diff``), and the device frontend's own rate on batches of clips.
2. extraction, per dtype x batch size x where the fbank runs (``--fbank-on``: numpy in the DataLoader
   workers, or on the device):
   * end to end: stage 5's job :func:`spkflow.embed.run.run_job` (workers decode [and fbank + VAD],
     the job pads, copies pinned batches, runs the model, writes its ark), utterances/s over the
     job's wall time (``e2e_utt_per_s``: what a user gets); the rate from the first batch's return
     on is kept beside it (``e2e_steady_utt_per_s``) but overstates a short run, whose batches the
     workers prefetched (workers x 4) while the first one was made;
   * model alone: the same padded batches of features already on the device, utterances/s;
   * GPU utilisation (mean/max %, NVML or nvidia-smi every 0.2 s) during each;
   * the limit: "model" when end to end reaches >= 90 % of the model alone, else "loader";
   * reduced dtypes: the lowest cosine of the clips' embeddings against float32.
3. training of the VoxCeleb recipe's ECAPA-512 AAM config (egs/voxceleb/spk1/conf/
   train_ecapa_c512_aam.yaml: SGD, AMP float16 on CUDA, 64 x 2 crops of 200 frames), steps/s fed by
   the loader against the model alone (one batch kept on the device): ``ark`` (stage-2 features,
   NxMCropDataset), ``raw`` (audio crops with the config's augmentation, fbank in the workers) and
   ``raw-device`` (the same, fbank on the device), each fed to this benchmark's own step; and
   ``trainer``: stage 4's trainer itself on the raw path as the config has it (trainer_steps.py),
   the same steps after the same warm-up.  Augmentation sources: speed 0.9/1.0/1.1,
   simulated RIRs (--rirs, else made here with spkflow.bin.make_rirs), coloured noise
   (spkflow.bin.make_noise), music-like tones (MUSAN is not here; mixing costs the same) and babble
   of 4-7 real speech clips.  The decoded-audio cache is off (SPKFLOW_AUDIO_CACHE_MB=0): VoxCeleb2's
   million files do not fit in it, so every crop decodes its file and its babble.

Prints a Markdown table per part and the limits; --json / --markdown write them (gpu_check.json and
gpu_check.md, with --tests-junit's counts).  test/test_bench_gpu.py runs it small on the CPU
so that it cannot rot.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))
# before spkflow.augment.wave is imported (here and in the loader workers): no decoded-audio cache
os.environ.setdefault("SPKFLOW_AUDIO_CACHE_MB", "0")

FRAMES_PER_SEC = 100  # 10 ms fbank frames
VOXCELEB_CONFIG = ROOT / "egs" / "voxceleb" / "spk1" / "conf" / "train_ecapa_c512_aam.yaml"
#: the loader paths fed to the benchmark's own step, and the trainer itself (trainer_steps.py)
TRAIN_PATHS = ("ark", "raw", "raw-device", "trainer")


# ------------------------------------------------------------------------------- GPU sampling
class GpuSampler:
    """GPU utilisation of ``device_index`` sampled every ``interval`` s while active (NVML when
    importable, else nvidia-smi). ``summary()`` -> (mean %, max %) or (None, None) off CUDA."""

    def __init__(self, device_index: int | None, interval: float = 0.2) -> None:
        self.index = device_index
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        if device_index is not None:
            try:
                import pynvml  # nvidia-ml-py, when installed

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


def fmt_util(u: Sequence[float | None]) -> str:
    return "-" if u[0] is None else f"{u[0]:.0f}/{u[1]:.0f}"


def sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def machine_info(device: str) -> dict[str, Any]:
    import torch

    dev = torch.device(device)
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "date": datetime.date.today().isoformat(),
    }
    try:
        info["cpu_model"] = next(
            ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")
        )
    except (OSError, StopIteration):
        info["cpu_model"] = None
    if dev.type == "cuda":
        try:
            q = "--query-gpu=driver_version,memory.total"
            out = subprocess.run(["nvidia-smi", q, "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
            info["driver"], info["gpu_memory"] = (s.strip() for s in out.stdout.splitlines()[0].split(","))
        except (OSError, IndexError, ValueError, subprocess.SubprocessError):
            info["driver"] = info["gpu_memory"] = None
    return info


# ------------------------------------------------------------------------------- data, models
def source_files(data: Path | None) -> list[Path]:
    """Real speech: --data's wav.scp paths, else the SPEECH selection of speechocean762 and LibriSpeech."""
    if data is not None:
        return [Path(ln.split(maxsplit=1)[1].strip()) for ln in (data / "wav.scp").read_text().splitlines() if ln]
    from helpers.corpora import speech_files
    from helpers.paths import db_var

    files: list[Path] = []
    for name in ("LIBRISPEECH", "SPEECHOCEAN762"):
        root = Path(db_var(name))
        if not root.is_dir():
            sys.exit(f"no real speech: {name} not found at {root} (set it, see db.sh, or run test/bench/gpu_bundle.sh)")
        files += speech_files(root, name)
    return files


def make_clips(
    files: Sequence[Path], out: Path, seconds: float, rate: int = 16000, limit: int = 48, fmt: str = "flac"
) -> list[Path]:
    """Consecutive ``seconds`` windows of the files' speech (resampled to ``rate``, each file's
    tail carried into the next) as 16-bit clips (``fmt``: flac or wav), at most ``limit``."""
    import numpy as np
    import soundfile as sf

    from spkflow.data.resample import resample

    out.mkdir(parents=True, exist_ok=True)
    n = int(round(seconds * rate))
    clips: list[Path] = []
    buf = np.zeros(0, dtype=np.float32)
    for f in files:
        w, sr = sf.read(f, dtype="float32", always_2d=True)
        buf = np.concatenate([buf, resample(w[:, 0], sr, rate)])
        while len(buf) >= n and len(clips) < limit:
            path = out / f"clip{len(clips):03d}.{fmt}"
            sf.write(path, buf[:n], rate, subtype="PCM_16")
            clips.append(path)
            buf = buf[n:]
    if not clips:
        sys.exit(f"less than {seconds} s of speech in {len(files)} files")
    return clips


def recode_clips(clips: Sequence[Path], out: Path, fmt: str) -> list[Path]:
    """``clips`` written again as 16-bit ``fmt`` files in ``out`` (the same samples)."""
    import soundfile as sf

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for c in clips:
        x, rate = sf.read(c, dtype="int16")
        sf.write(out / f"{c.stem}.{fmt}", x, rate, subtype="PCM_16")
        written.append(out / f"{c.stem}.{fmt}")
    return written


def write_data_dir(d: Path, wav: dict[str, str], spk: dict[str, str], seconds: float | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    keys = sorted(wav, key=str.encode)
    (d / "wav.scp").write_text("".join(f"{u} {wav[u]}\n" for u in keys))
    (d / "utt2spk").write_text("".join(f"{u} {spk[u]}\n" for u in keys))
    if seconds is not None:
        (d / "utt2dur").write_text("".join(f"{u} {seconds:.3f}\n" for u in keys))
    s2u: dict[str, list[str]] = {}
    for u in keys:
        s2u.setdefault(spk[u], []).append(u)
    (d / "spk2utt").write_text("".join(f"{s} {' '.join(s2u[s])}\n" for s in sorted(s2u, key=str.encode)))
    return d


def repeated_data_dir(d: Path, clips: Sequence[Path], num_utts: int, num_spk: int, seconds: float) -> Path:
    """``num_utts`` utterances cycling over ``clips``, ``num_spk`` speakers in turn."""
    wav = {f"s{i % num_spk:04d}-u{i:06d}": str(clips[i % len(clips)]) for i in range(num_utts)}
    return write_data_dir(d, wav, {u: u.split("-")[0] for u in wav}, seconds)


def ecapa_model_dir(out: Path, channels: int) -> Path:
    """A stage-4 model dir of ECAPA-TDNN with random weights (80-bin fbank + energy VAD)."""
    import dataclasses

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
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(build_model(model_cfg).state_dict(), out / "model.pth")
    return out


# ------------------------------------------------------------------------------- 1. fbank parity
def bench_parity(device: str, clips: Sequence[Path], batch: int, reps: int) -> dict[str, Any]:
    """Max |torch fbank on the device - numpy fbank| per set of real speech; the device frontend's rate."""
    import numpy as np
    import soundfile as sf
    import torch

    from helpers.corpora import real_speech_sets
    from helpers.paths import db_var
    from spkflow.data.resample import resample
    from spkflow.features.fbank import FbankOptions, VadOptions, compute_fbank
    from spkflow.features.torch_fbank import BatchFrontend, fbank_batch

    opts = FbankOptions()
    sets: dict[str, Any] = {}
    for name, audio in real_speech_sets(lambda n: Path(db_var(n))).items():
        if not audio:
            continue
        waves = [resample(w, sr, 16000) for w, sr in audio]
        lengths = torch.tensor([len(w) for w in waves])
        x = torch.zeros(len(waves), int(lengths.max()))
        for i, w in enumerate(waves):
            x[i, : len(w)] = torch.from_numpy(w)
        refs = [compute_fbank(w, sr, opts) for w, sr in audio]
        diffs = []
        for precision in (torch.float64, torch.float32):  # float32: what it would cost (module doc)
            feats = fbank_batch(x.to(device), lengths.to(device), opts, precision=precision)[0].cpu().numpy()
            diffs.append(max(float(np.abs(feats[i, : len(r)] - r).max()) for i, r in enumerate(refs)))
        sets[name] = {"utts": len(audio), "max_abs_diff": diffs[0], "max_abs_diff_if_float32": diffs[1]}
    # the frontend (fbank + VAD) on the device, batches of clips
    waves = [sf.read(c, dtype="float32")[0] for c in clips]
    x = torch.from_numpy(np.stack([waves[i % len(waves)] for i in range(batch)])).to(device)
    n = torch.full((batch,), x.shape[1], device=device)
    frontend = BatchFrontend(opts, VadOptions(), use_vad=True)
    frontend(x, n)
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        frontend(x, n)
    sync(device)
    rate = reps * batch / (time.perf_counter() - t)
    return {
        "fbank_max_abs_diff": max((s["max_abs_diff"] for s in sets.values()), default=None),
        "sets": sets,
        "frontend_utt_per_s": round(rate, 1),
        "frontend_batch": batch,
    }


# ------------------------------------------------------------------------------- 2. extraction
class TimedEmbedder:
    """Stage 5's embedder with the time and utterance count after the first batch's return, so the
    end-to-end rate leaves out the DataLoader workers' start-up.  On CUDA it also records a timing
    event on the device's stream before and after each batch's work (the copy there, the frontend,
    the model, the copy back), read after the job by :meth:`device_account`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.first: float | None = None
        self.utts_after_first = 0
        self.spans: list[tuple[Any, Any]] = []  # (start, end) CUDA events of each batch, in order

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def launch_padded(self, feats: Any, lengths: Any) -> Any:
        cuda = str(self._inner.device).startswith("cuda")
        start = _timing_event() if cuda else None
        pending = self._inner.launch_padded(feats, lengths)
        if cuda:
            self.spans.append((start, _timing_event()))
        return _TimedPending(self, pending)

    def device_account(self) -> tuple[float | None, float | None]:
        """(median milliseconds of a batch's work on the device's stream, the share of the time from
        the first batch's start to the last one's end that the stream spent inside a batch); Nones
        off CUDA.  Device clocks only: the share is 1 when the stream never waited for the host
        between batches.  A batch's span also holds any wait for its own kernels' launches."""
        if not self.spans:
            return None, None
        self.spans[-1][1].synchronize()
        ms = [a.elapsed_time(b) for a, b in self.spans]
        whole = self.spans[0][0].elapsed_time(self.spans[-1][1])
        return round(float(statistics.median(ms)), 2), round(min(1.0, sum(ms) / whole), 3) if whole > 0 else None


def _timing_event() -> Any:
    """A CUDA event with timing, recorded now on the current stream."""
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class _TimedPending:
    """A batch's :class:`~spkflow.embed.base.PendingEmbeddings`, counted when its result is back."""

    def __init__(self, timed: TimedEmbedder, pending: Any) -> None:
        self.timed, self.pending = timed, pending

    def result(self) -> Any:
        out = self.pending.result()
        if self.timed.first is None:
            self.timed.first = time.perf_counter()
        else:
            self.timed.utts_after_first += len(out)
        return out


def bench_extraction(
    name: str,
    model_dir: Path,
    data: Path,
    clips: Sequence[Path],
    work: Path,
    a: argparse.Namespace,
    sampler: GpuSampler,
) -> list[dict[str, Any]]:
    import numpy as np
    import torch

    from spkflow.embed import open_embedder
    from spkflow.embed.base import pad
    from spkflow.embed.run import run_job
    from spkflow.features.fbank import apply_frontend, compute_fbank, compute_vad

    utts = sorted((ln.split()[0] for ln in (data / "utt2spk").read_text().splitlines()), key=str.encode)
    longest = int(a.utt_sec * FRAMES_PER_SEC) + 10
    rows: list[dict[str, Any]] = []
    reference: dict[int, np.ndarray] = {}
    inputs: list[np.ndarray] | None = None
    alone: dict[tuple[str, int], tuple[float, Any]] = {}  # (dtype, batch) -> model-alone rate, GPU util
    for dtype in a.dtypes:
        for fbank_on in a.fbank_on:
            emb = open_embedder(model_dir, "spkflow", a.device, dtype=dtype, fbank_on=fbank_on)
            if inputs is None:  # the model's input of each clip, as the workers compute it
                import soundfile as sf

                inputs = []
                for c in clips:
                    f = compute_fbank(sf.read(c, dtype="float32")[0], 16000, emb.fbank)
                    v = compute_vad(f, emb.vad) if emb.use_vad else None
                    inputs.append(apply_frontend(f, v, use_vad=emb.use_vad, mean_norm=emb.mean_norm))
            vecs = emb.embed(inputs)  # also the warm-up
            if dtype == "float32":
                reference.update(enumerate(vecs))
            min_cos = None
            if dtype != "float32" and reference:
                unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
                ref = np.stack([reference[i] for i in range(len(vecs))])
                min_cos = round(float((unit * (ref / np.linalg.norm(ref, axis=1, keepdims=True))).sum(1).min()), 6)
            for b in a.batch_sizes:
                job = work / f"job_{dtype}_{fbank_on}_b{b}"
                shutil.rmtree(job, ignore_errors=True)
                timed = TimedEmbedder(emb)
                if a.device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                with sampler.active():
                    t = time.perf_counter()
                    summary = run_job(
                        timed, data, utts, job, 1, batch_size=b, max_frames=b * longest,
                        num_workers=a.num_workers, progress=False,
                    )  # fmt: skip
                    end = time.perf_counter()
                util_e2e = sampler.summary()
                steady = timed.utts_after_first / (end - timed.first) if timed.first and end > timed.first else 0.0
                wall = len(utts) / (end - t)
                shutil.rmtree(job, ignore_errors=True)
                if (dtype, b) not in alone:  # model alone: the same batch shape, features on the device
                    feats, lengths = pad([inputs[i % len(inputs)] for i in range(b)])
                    x, n = torch.from_numpy(feats).to(a.device), torch.from_numpy(lengths).to(a.device)
                    reps = max(3, math.ceil(len(utts) / b))
                    emb.embed_padded(x, n)
                    with sampler.active():
                        sync(a.device)
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            emb.embed_padded(x, n)
                        sync(a.device)
                        alone[dtype, b] = (reps * b / (time.perf_counter() - t0), sampler.summary())
                model_rate, util_model = alone[dtype, b]
                device_ms, busy = timed.device_account()
                peak = torch.cuda.max_memory_allocated() / 2**30 if a.device.startswith("cuda") else None
                rows.append(
                    {
                        "model": name,
                        "dtype": dtype,
                        "batch_size": b,
                        "fbank_on": fbank_on,
                        "audio_format": a.extract_format,
                        "utts": len(utts),
                        "e2e_utt_per_s": round(wall, 1),
                        "e2e_steady_utt_per_s": round(steady, 1),
                        "e2e_wall_s": round(end - t, 2),
                        "model_utt_per_s": round(model_rate, 1),
                        "e2e_over_model": round(wall / model_rate, 3),
                        "realtime_factor": round(wall * a.utt_sec, 0),
                        "e2e_data_wait_share": summary.waits.get("data_wait_share"),
                        # the job's batch slots page-locked for the copies (slots, bytes, seconds)
                        "page_locked": summary.page_locked or None,
                        # the device's stream: a batch's work (median ms) against the model alone's, and
                        # the share of the loop it was inside a batch (CUDA events; None off CUDA)
                        "device_ms_per_batch": device_ms,
                        "model_ms_per_batch": round(1000 * b / model_rate, 2),
                        "device_busy_share": busy,
                        "limit": extraction_limit(wall / model_rate, summary.waits.get("data_wait_share"), busy),
                        "gpu_util_e2e": util_e2e,
                        "gpu_util_model": util_model,
                        "min_cosine_vs_float32": min_cos,
                        "peak_gpu_mem_gib": None if peak is None else round(peak, 2),
                    }
                )
                locked = summary.page_locked
                print(f"  extraction {name} {dtype} B={b} fbank in {fbank_on}: {rows[-1]['e2e_utt_per_s']} utt/s "
                      f"end to end, {rows[-1]['model_utt_per_s']} model alone"
                      + (f"; {locked['slots']:.0f} slots ({locked['bytes'] / 1e9:.2f} GB) page-locked in "
                         f"{locked['seconds']:.2f} s" if locked else ""), flush=True)  # fmt: skip
    return rows


# ------------------------------------------------------------------------------- 3. training
def tones_dir(out: Path, num: int = 6, seconds: float = 10.0, rate: int = 16000) -> Path:
    """Music-like tones (random chords of harmonic notes with a decaying envelope): the cost of
    MUSAN music (a file to decode and mix), which is not here."""
    import numpy as np

    from spkflow.augment.sources import write_source_dir

    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    items = []
    for k in range(num):
        x = np.zeros_like(t)
        for start in np.arange(0.0, seconds, 0.5):
            on = (t >= start) & (t < start + 0.5)
            env = np.exp(-4.0 * (t[on] - start))
            for f0 in 110.0 * 2 ** (rng.integers(0, 36, size=3) / 12.0):
                x[on] += env * sum(np.sin(2 * np.pi * f0 * h * t[on]) / h for h in (1, 2, 3))
        items.append((f"tones{k:03d}", (0.3 * x / np.abs(x).max()).astype(np.float32)))
    return write_source_dir(out, items, rate)


def aug_sources(work: Path, clips_dir: Path, rirs: Path | None) -> dict[str, Path]:
    """Data dirs of the augmentation sources (see the module doc)."""
    from spkflow.augment.sources import noise_items, write_source_dir

    if rirs is None:
        rirs = work / "rirs"
        if not (rirs / "wav.scp").is_file():
            subprocess.run(
                [sys.executable, "-m", "spkflow.bin.make_rirs", "--num", "8", "--out", str(rirs)], check=True
            )
    files = sorted((rirs / "audio").glob("*.flac")) or sorted(rirs.glob("*.flac"))
    rir_dir = write_data_dir(work / "rirs_list", {p.stem: str(p) for p in files}, {p.stem: p.stem for p in files})
    noise = work / "noise"
    if not (noise / "wav.scp").is_file():
        write_source_dir(noise, noise_items(6, 10.0, 0), 16000)
    music = work / "music"
    if not (music / "wav.scp").is_file():
        tones_dir(music)
    return {"rirs": rir_dir, "noise": noise, "music": music, "speech": clips_dir}


def ark_features(clips_dir: Path, data: Path, work: Path, name: str = "train_feats") -> Path:
    """Stage-2 features of the clips (the real job code), listed for every utterance of ``data``
    (an utterance's entries are its clip's) in ``work / name``."""
    from spkflow.data.tables import read_kv
    from spkflow.features.fbank import FbankOptions, VadOptions
    from spkflow.features.jobs import extract_job, merge_jobs

    feats = work / "clip_feats"
    if not (feats / "feats.scp").is_file():
        (work / "clip_list").write_text("".join(ln.split()[0] + "\n" for ln in (clips_dir / "utt2spk").open()))
        extract_job(clips_dir, work / "clip_list", work / "clip_arks", "clips", 1, FbankOptions(), VadOptions(),
                    progress=False)  # fmt: skip
        merge_jobs(clips_dir, feats, work / "clip_arks", "clips", 1)
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    clip_of = {u: Path(p).stem for u, p in read_kv(data / "wav.scp").items()}
    for scp in ("feats.scp", "vad.scp", "cmvn_utt.scp", "cmvn_utt_voiced.scp"):
        table = read_kv(feats / scp)
        (out / scp).write_text("".join(f"{u} {table[clip_of[u]]}\n" for u in sorted(clip_of, key=str.encode)))
    for name in ("utt2spk", "spk2utt"):
        shutil.copy(data / name, out / name)
    return out


def bench_training(
    data: Path, clips_dir: Path, work: Path, a: argparse.Namespace, sampler: GpuSampler
) -> dict[str, Any]:
    import torch
    import yaml

    from spkflow.augment.wave import WaveAugment
    from spkflow.core.batch_wait import BatchWait
    from spkflow.data.tables import read_kv
    from spkflow.nnet.losses import batch_labels, build_loss
    from spkflow.nnet.models import build_model
    from spkflow.train.batches import plan_epoch
    from spkflow.train.config import normalize_train_config
    from spkflow.train.loader import NxMCropDataset, make_loader
    from spkflow.train.optim import build_optimizer
    from spkflow.train.raw_loader import CropFbank, NxMWaveDataset

    device = torch.device(a.device)
    raw_cfg = yaml.safe_load(VOXCELEB_CONFIG.read_text())
    src = aug_sources(work, clips_dir, a.rirs)
    raw_cfg["augment"]["reverb"]["data_dir"] = str(src["rirs"])
    raw_cfg["augment"]["noise"]["data_dirs"] = {k: str(src[k]) for k in ("noise", "music", "speech")}
    cfg = normalize_train_config(raw_cfg, str(VOXCELEB_CONFIG))
    tcfg, fe = cfg["train"], cfg["frontend"]
    factors = cfg["augment"]["speed"]["factors"] or [1.0]
    utt2spk = read_kv(data / "utt2spk")
    spk2idx = {s: i for i, s in enumerate(sorted(set(utt2spk.values())))}
    # the loader prefetches workers x 4 batches (spkflow.train.loader.make_loader) while the first ones
    # are made: warm up past them, or the timed steps read batches made before the clock started
    warmup = max(a.train_warmup, 4 * a.num_workers + 1)
    need = a.train_steps + warmup
    batches: list[list[str]] = []
    epoch = 1
    while len(batches) < need:
        batches += [list(b) for b in plan_epoch(data / "spk2utt", a.num_spk, a.num_utt, seed=0, epoch=epoch).batches]
        epoch += 1
    batches = batches[:need]
    torch.manual_seed(0)
    model = build_model(dict(cfg["model"], input_dim=80, channels=a.channels)).to(device).train()
    loss_cfg = {k: v for k, v in cfg["loss"].items() if k != "margin_warmup"}
    loss_fn = build_loss(loss_cfg, model.embed_dim, num_classes=len(spk2idx) * len(factors)).to(device)
    params = list(model.parameters()) + list(loss_fn.parameters())
    opt = build_optimizer(cfg["optim"], params)
    amp = bool(tcfg["amp"]) and device.type == "cuda"
    amp_dtype = getattr(torch, tcfg["amp_dtype"])
    scaler = torch.amp.GradScaler("cuda", enabled=amp and amp_dtype == torch.float16)
    crop_fbank = CropFbank(cfg["frontend"]["fbank"] or {}, "crop" if fe["mean_norm"] else "none")

    def step(x: torch.Tensor, labels: torch.Tensor) -> None:
        lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.long, device=device)
        with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp):
            emb = model(x, lengths)
        loss = loss_fn(emb.float().view(a.num_spk, a.num_utt, -1), labels)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, float(tcfg["grad_clip"]))
        scaler.step(opt)
        scaler.update()

    def dataset(path: str) -> Any:
        crop = (a.crop, a.crop)
        if path == "ark":
            feats = ark_features(clips_dir, data, work)
            return NxMCropDataset(feats / "feats.scp", batches, crop=crop, use_vad=False, mean_norm="utterance")
        aug = WaveAugment(cfg["augment"], 16000)
        return NxMWaveDataset(
            data, batches, crop=crop, use_vad=False, mean_norm="crop" if fe["mean_norm"] else "none", augment=aug,
            num_utt=a.num_utt, utt2spk=utt2spk, fbank_on="device" if path == "raw-device" else "workers",
        )  # fmt: skip

    def to_input(x: torch.Tensor, path: str) -> torch.Tensor:
        x = x.to(device, non_blocking=True)
        return crop_fbank(x) if path == "raw-device" else x

    rows, first = [], None
    for path in a.train_paths:
        if path == "trainer":
            continue  # after the loaders (below)
        ds = dataset(path)
        it = iter(make_loader(ds, num_workers=a.num_workers, pin_memory=device.type == "cuda"))
        for _ in range(warmup):
            x, utts, *speed = next(it)
            y = batch_labels(utts, utt2spk, spk2idx, a.num_utt) + (speed[0] * len(spk2idx) if speed else 0)
            x = to_input(x, path)
            first = first if first is not None else (x.detach().clone(), y.to(device))
            step(x, y.to(device))
        sync(device)
        waits = BatchWait()  # the step loop's waits for batches, as the trainer times them
        with sampler.active():
            t = time.perf_counter()
            for x, utts, *speed in waits.over(it):
                y = batch_labels(utts, utt2spk, spk2idx, a.num_utt) + (speed[0] * len(spk2idx) if speed else 0)
                step(to_input(x, path), y.to(device))
            sync(device)
            rate = a.train_steps / (time.perf_counter() - t)
        rows.append(
            {
                "path": path,
                "loader_steps_per_s": round(rate, 3),
                "data_wait_share": waits.stats().get("data_wait_share"),
                "gpu_util": sampler.summary(),
            }
        )
        print(f"  training {path}: {rows[-1]['loader_steps_per_s']} steps/s", flush=True)
    if "trainer" in a.train_paths:
        from trainer_steps import time_trainer

        own = copy.deepcopy(raw_cfg)
        own["model"]["channels"] = a.channels
        own["train"]["num_workers"] = a.num_workers
        got = time_trainer(own, data, batches, work, a.device, warmup, a.train_steps, sync, sampler.active)
        rows.append({"path": "trainer", "loader_steps_per_s": got["steps_per_s"],
                     "data_wait_share": got["data_wait_share"], "gpu_util": sampler.summary()})  # fmt: skip
        print(f"  training trainer: {got['steps_per_s']} steps/s", flush=True)
        if first is None:  # the model alone needs a batch on the device
            x, utts, *speed = next(iter(make_loader(dataset("raw-device"), num_workers=0)))
            first = (to_input(x, "raw-device"), batch_labels(utts, utt2spk, spk2idx, a.num_utt).to(device))
    x0, y0 = first
    with sampler.active():
        t = time.perf_counter()
        for _ in range(a.train_steps):
            step(x0, y0)
        sync(device)
        model_rate = a.train_steps / (time.perf_counter() - t)
    util_model = sampler.summary()
    for r in rows:
        r["over_model"] = round(r["loader_steps_per_s"] / model_rate, 3)
        r["limit"] = training_limit(r["over_model"], r["data_wait_share"])
    return {
        "config": str(VOXCELEB_CONFIG.relative_to(ROOT)),
        "channels": a.channels,
        "batch": f"{a.num_spk}x{a.num_utt}x{a.crop} frames",
        "amp": amp,
        "amp_dtype": tcfg["amp_dtype"] if amp else None,
        "steps": a.train_steps,
        "warmup_steps": warmup,
        "num_workers": a.num_workers,
        "fbank_device": device.type == "cuda",  # where the trainer row's fbank runs (train.fbank_on: auto)
        "model_steps_per_s": round(model_rate, 3),
        "gpu_util_model": util_model,
        "paths": rows,
    }


# ------------------------------------------------------------------------------- report
def junit_counts(path: Path | None) -> dict[str, Any] | None:
    """passed / failed / skipped (and the failed tests' names) of a pytest --junitxml file."""
    if path is None or not path.is_file():
        return None
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in cases if c.find("failure") is not None]
    failed += [f"{c.get('classname')}::{c.get('name')}" for c in cases if c.find("error") is not None]
    skipped = sum(c.find("skipped") is not None for c in cases)
    return {"passed": len(cases) - len(failed) - skipped, "failed": len(failed), "skipped": skipped, "failures": failed}


def feed_rows(reports: Sequence[Path]) -> list[dict[str, Any]]:
    """The paths of test/bench/bench_feed.py's JSON ``reports`` (the loaders alone, no model), a row
    each, with the audio format the report read; a report that is missing (its run failed) gives none."""
    rows = []
    for path in reports:
        if not path.is_file():
            continue
        r = json.loads(path.read_text())
        for name, row in r.items():
            if isinstance(row, dict) and "items_per_s" in row:
                audio = r["audio_format"] if row.get("reads") == "audio" else None  # features: no audio format
                rows.append({"path": name, "audio_format": audio, **row})
    return rows


#: what each extraction ``limit`` means, said in ``limits`` (``{waited}``: the job's share of waiting)
EXTRACTION_LIMITS = {
    "model": "model (GPU)",
    "loader": "loader (CPU workers: decode, fbank, padding{waited})",
    "job loop": (
        "job's own loop, not the loader{waited}: its main thread launches the copy to the device, the device "
        "frontend and the model, and writes each batch while the device computes the next{device}"
    ),
    "device work": (
        "work of each batch on the GPU{device}, beyond the model alone: the copy there, the frontend and the "
        "copy back, and any wait for the main thread's launches inside a batch{waited}"
    ),
}


def fmt_share(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def waited(limit: str, share: float | None, who: str = "job") -> str:
    """The share of waiting for batches of the ``who`` (the job, the step loop), as the sentence of
    its ``limit`` says it (nothing when unknown)."""
    if share is None:
        return ""
    if limit in ("job loop", "step loop"):
        return f" (it waited for batches {fmt_share(share)} of the time)"
    return f"; the {who} waited for batches {fmt_share(share)} of its loop"


def loop_limit(over_model: float, wait_share: float | None, loop: str) -> str:
    """``model`` when the loop reaches 90 % of the model alone; else ``loader`` when it waited for
    batches more than :data:`spkflow.core.batch_wait.LOADER_BOUND` of its time (or did not say),
    else ``loop``: batches were there and the loop's main thread was the slower side."""
    from spkflow.core.batch_wait import LOADER_BOUND

    if over_model >= 0.9:
        return "model"
    return "loader" if wait_share is None or wait_share > LOADER_BOUND else loop


def extraction_limit(over_model: float, wait_share: float | None, busy: float | None = None) -> str:
    """:func:`loop_limit` of stage 5's ``job loop``, except ``device work`` under 90 % of the
    model alone when the device's stream was inside a batch 90 % of the loop or more (``busy``,
    CUDA only: the batches' own work on the GPU is then the limit, not the host)."""
    if over_model < 0.9 and busy is not None and busy >= 0.9:
        return "device work"
    return loop_limit(over_model, wait_share, "job loop")


def device_said(row: dict[str, Any]) -> str:
    """What the device's stream did in ``row``'s job, as the limit's sentence says it (nothing off CUDA)."""
    if row.get("device_busy_share") is None:
        return ""
    return (
        f" ({row['device_ms_per_batch']:.1f} ms a batch on the device against {row['model_ms_per_batch']:.1f} "
        f"for the model alone; the device busy {fmt_share(row['device_busy_share'])} of the loop)"
    )


def training_limit(over_model: float, wait_share: float | None) -> str:
    """:func:`loop_limit` of the trainer's ``step loop``."""
    return loop_limit(over_model, wait_share, "step loop")


#: what each training ``limit`` means, said in ``limits`` (``{waited}``: the loop's share of waiting)
TRAINING_LIMITS = {
    "model": "model{waited}",
    "loader": "loader (CPU workers: reading, augmentation, fbank{waited})",
    "step loop": (
        "step loop, not the loader{waited}: its main thread takes each batch from its slot, copies it "
        "to the device and launches the step"
    ),
}


def limits(result: dict[str, Any]) -> list[str]:
    """One sentence per part: which part is the limit."""
    out = []
    rows = result.get("extraction") or []
    if rows:
        best = max(rows, key=lambda r: r["e2e_utt_per_s"])
        out.append(
            f"extraction: best end to end {best['e2e_utt_per_s']:.0f} utt/s ({best['dtype']}, batch "
            f"{best['batch_size']}, fbank in the {best['fbank_on']}, {best['audio_format'].upper()}) = "
            f"{100 * best['e2e_over_model']:.0f}% of the "
            f"model alone ({best['model_utt_per_s']:.0f} utt/s): the limit is the "
            + EXTRACTION_LIMITS[best["limit"]].format(
                waited=waited(best["limit"], best.get("e2e_data_wait_share")), device=device_said(best)
            )
        )
    tr = result.get("train")
    if tr:
        same = {r["path"]: r for r in tr["paths"]}.get("raw-device" if tr.get("fbank_device") else "raw")
        for r in tr["paths"]:
            said = (
                f"training {r['path']}: {r['loader_steps_per_s']:.2f} steps/s fed by the loader = "
                f"{100 * r['over_model']:.0f}% of the model alone ({tr['model_steps_per_s']:.2f}): the limit is the "
                + TRAINING_LIMITS[r["limit"]].format(
                    waited=waited(r["limit"], r.get("data_wait_share"), who="step loop")
                )
            )
            if r["path"] == "trainer" and same is not None:
                said += (
                    f"; the benchmark's own step on the same loader path ({same['path']}) "
                    f"{100 * same['over_model']:.0f}%: the difference is the trainer's own work in a step (labels, "
                    "re-seeding, the loss and gradient norm read back for its checks, the monitor)"
                )
            out.append(said)
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# GPU check: {m['device']}, {m['cpus']} CPUs ({m.get('cpu_model')}), driver {m.get('driver', '-')}, "
        f"torch {m['torch']} (CUDA {m['cuda']}), {m['date']}",
        "",
    ]
    tests = result.get("tests")
    if tests:
        lines += [f"tests (pytest -m cuda): {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} "
                  "skipped" + (": " + ", ".join(tests["failures"]) if tests["failures"] else ""), ""]  # fmt: skip
    par = result.get("parity")
    if par:
        lines += [
            "| fbank on the device vs numpy | utterances | max abs diff (log mel) | the same in float32 |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {k} | {v['utts']} | {v['max_abs_diff']:.2e} | {v['max_abs_diff_if_float32']:.2e} |"
            for k, v in par["sets"].items()
        ]
        lines += ["", f"frontend (fbank + VAD) on the device: {par['frontend_utt_per_s']:.0f} utt/s "
                  f"(batches of {par['frontend_batch']} clips)", ""]  # fmt: skip
    rows = result.get("extraction")
    if rows:
        lines += [
            "| model | dtype | batch | fbank | audio | e2e utt/s | model utt/s | e2e/model | waited | device busy | "
            "limit | GPU util e2e | GPU util model | min cos vs fp32 |",
            "|---|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
        ]
        for r in rows:
            cos = "-" if r["min_cosine_vs_float32"] is None else f"{r['min_cosine_vs_float32']:.5f}"
            lines.append(
                f"| {r['model']} | {r['dtype']} | {r['batch_size']} | {r['fbank_on']} | {r['audio_format']} | "
                f"{r['e2e_utt_per_s']:.0f} | "
                f"{r['model_utt_per_s']:.0f} | {r['e2e_over_model']:.2f} | {fmt_share(r.get('e2e_data_wait_share'))} | "
                f"{fmt_share(r.get('device_busy_share'))} | {r['limit']} | "
                f"{fmt_util(r['gpu_util_e2e'])} | {fmt_util(r['gpu_util_model'])} | {cos} |"
            )
        lines.append("")
    tr = result.get("train")
    if tr:
        lines += [
            f"training {tr['config']} (ECAPA-{tr['channels']}, {tr['batch']}, AMP {tr['amp_dtype'] or 'off'}, "
            f"{tr['num_workers']} workers): model alone {tr['model_steps_per_s']:.2f} steps/s",
            "",
            "| path | steps/s fed by the loader | over the model alone | waited | limit | GPU util |",
            "|---|---:|---:|---:|---|---:|",
        ]
        lines += [
            f"| {r['path']} | {r['loader_steps_per_s']:.2f} | {r['over_model']:.2f} | "
            f"{fmt_share(r.get('data_wait_share'))} | {r['limit']} | "
            f"{fmt_util(r['gpu_util'])} |"
            for r in tr["paths"]
        ]
        lines.append("")
    feed = result.get("feed")
    if feed:
        lines += [
            f"the loaders alone (test/bench/bench_feed.py, no model, {feed[0]['workers']} workers = the CPUs; share: "
            "of the per-core sum of their parts x workers)",
            "",
            "| path | audio | items/s | ideal items/s | share | CPU ms per item |",
            "|---|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['path']} | {r['audio_format'] or '-'} | {r['items_per_s']:.0f} | {r['ideal_items_per_s']:.0f} | "
            f"{r['share']:.2f} | {r['cpu_ms_per_item']:.3f} |"
            for r in feed
        ]
        lines.append("")
    lines += [f"- {s}" for s in result.get("limits", [])]
    return "\n".join(lines) + "\n"


def write_outputs(result: dict[str, Any], a: argparse.Namespace) -> None:
    result["limits"] = limits(result)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    if a.markdown:
        a.markdown.write_text(markdown(result))


# ------------------------------------------------------------------------------- main
def csv(kind: type) -> Any:
    return lambda s: [kind(v) for v in s.split(",") if v]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    p.add_argument("--parts", type=csv(str), default=["parity", "extraction", "train"])
    p.add_argument("--utt-sec", type=float, default=6.0, help="utterance length (s)")
    p.add_argument("--num-utts", type=int, default=16000, help="utterances per end-to-end extraction run")
    p.add_argument("--num-clips", type=int, default=48, help="distinct clips the utterances cycle over")
    p.add_argument("--data-spk", type=int, default=200, help="speakers of the repeated data dir (training)")
    p.add_argument("--batch-sizes", type=csv(int), default=[64, 256])
    p.add_argument("--dtypes", type=csv(str), default=["float32", "bfloat16", "float16"])
    p.add_argument("--fbank-on", type=csv(str), default=["workers", "device"], help="where stage 5's fbank runs")
    p.add_argument("--extract-format", choices=("flac", "wav"), default="flac", help="the extraction clips' format")
    p.add_argument("--num-workers", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="DataLoader workers")
    p.add_argument("--channels", type=int, default=512, help="ECAPA channels (512: ECAPA-512)")
    p.add_argument("--model-dir", type=Path, default=None, help="also bench this stage-4 model dir (e.g. the demo)")
    p.add_argument("--data", type=Path, default=None, help="a data dir of real speech instead of the corpora")
    p.add_argument("--rirs", type=Path, default=None, help="simulated RIRs (gpu_bundle.sh's), else made here")
    p.add_argument("--train-paths", type=csv(str), default=list(TRAIN_PATHS))
    p.add_argument("--train-steps", type=int, default=20, help="timed training steps per path")
    p.add_argument("--train-warmup", type=int, default=3)
    p.add_argument("--num-spk", type=int, default=64, help="N of the N x M training batch")
    p.add_argument("--num-utt", type=int, default=2, help="M of the N x M training batch")
    p.add_argument("--crop", type=int, default=200, help="training crop, frames")
    p.add_argument("--frontend-batch", type=int, default=256, help="clips per batch of the device frontend rate")
    p.add_argument("--threads", type=int, default=0, help="torch threads of this process (0: torch's default)")
    p.add_argument("--tests-junit", type=Path, default=None, help="pytest --junitxml of the CUDA-marked tests")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench_gpu"))
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    a = p.parse_args(argv)
    import torch

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but CUDA is not available (use --device cpu with small sizes)")
    bad = [d for d in a.dtypes if d not in ("float32", "bfloat16", "float16")]
    if bad or (dev.type != "cuda" and "float16" in a.dtypes and "extraction" in a.parts):
        sys.exit(f"--dtypes: float32, bfloat16, float16 (cuda only); got {','.join(a.dtypes)}")
    a.dtypes = sorted(set(a.dtypes), key=lambda d: d != "float32")  # float32 first: the parity reference
    if not set(a.train_paths) <= set(TRAIN_PATHS) or not set(a.fbank_on) <= {"workers", "device"}:
        sys.exit(f"--train-paths: {','.join(TRAIN_PATHS)}; --fbank-on: workers,device")
    sampler = GpuSampler((dev.index or 0) if dev.type == "cuda" else None)
    a.workdir.mkdir(parents=True, exist_ok=True)
    clips = make_clips(source_files(a.data), a.workdir / "clips", a.utt_sec, limit=a.num_clips)
    clips_dir = write_data_dir(
        a.workdir / "clips_dir", {c.stem: str(c) for c in clips}, {c.stem: c.stem for c in clips}
    )
    speakers = min(a.data_spk, a.num_utts // a.num_utt)  # M utterances per speaker at least
    if "train" in a.parts and a.train_steps > 0 and speakers < a.num_spk:
        sys.exit(f"--num-utts {a.num_utts} gives {speakers} speakers of {a.num_utt} utterances: fewer than --num-spk")
    data = repeated_data_dir(a.workdir / "data", clips, a.num_utts, speakers, a.utt_sec)
    extract_data = data
    if a.extract_format != "flac":  # the same clips, in the format stage 5 is to read
        extract_clips = recode_clips(clips, a.workdir / f"clips_{a.extract_format}", a.extract_format)
        extract_data = repeated_data_dir(
            a.workdir / f"data_{a.extract_format}", extract_clips, a.num_utts, speakers, a.utt_sec
        )
    result: dict[str, Any] = {"machine": machine_info(a.device), "args": {k: str(v) for k, v in vars(a).items()}}
    result["device"] = result["machine"]["device"]
    result["tests"] = junit_counts(a.tests_junit)
    m = result["machine"]
    print(f"# {m['device']}, {m['cpus']} CPUs, torch {m['torch']}; {a.num_utts} utterances of {a.utt_sec} s "
          f"cycling over {len(clips)} clips of real speech", flush=True)  # fmt: skip
    timings: dict[str, float] = {}
    result["seconds"] = timings
    if "parity" in a.parts:
        t = time.perf_counter()
        result["parity"] = bench_parity(a.device, clips, a.frontend_batch, 5)
        result["fbank_max_abs_diff"] = result["parity"]["fbank_max_abs_diff"]
        timings["parity"] = round(time.perf_counter() - t, 1)
        write_outputs(result, a)
    if "extraction" in a.parts:
        t = time.perf_counter()
        models = [(f"ecapa{a.channels}", ecapa_model_dir(a.workdir / f"ecapa{a.channels}", a.channels))]
        if a.model_dir:
            models.append((str(a.model_dir), a.model_dir))
        result["extraction"] = []
        for name, d in models:
            result["extraction"] += bench_extraction(name, d, extract_data, clips, a.workdir, a, sampler)
            write_outputs(result, a)
        timings["extraction"] = round(time.perf_counter() - t, 1)
    if "train" in a.parts and a.train_steps > 0:
        t = time.perf_counter()
        result["train"] = bench_training(data, clips_dir, a.workdir, a, sampler)
        timings["train"] = round(time.perf_counter() - t, 1)
    write_outputs(result, a)
    print(markdown(result), flush=True)
    return result


if __name__ == "__main__":
    main()
