"""Benchmark: N x M training loader throughput (batches/s) from kaldiio arks, against the naive
path that reads audio and computes fbank per utterance per batch (WeSpeaker, voxceleb_trainer).

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_loader.py [--utts 200000] [--workers 2]
        [--batches 200] [--compression-method 0|3|1] [--access pread|mmap] [--work DIR] [--keep]
        [--no-reuse-buffers]

Features (generated; values are irrelevant to the speed): ``--utts`` utterances (default
200,000; 2,000 speakers x 100) of 200-400 frames (2-4 s) x 80 bins, float32 Kaldi matrices
(``--compression-method 3``: Kaldi two-byte, what ``make_fbank.sh --compress true`` writes;
``1``: Kaldi's 1-byte per-column code), in 16 arks as 16 extraction jobs would write them, with
``vad.scp`` (70% voiced) and ``cmvn_utt_voiced.scp``, under ``--work`` (default: a temporary
directory on local disk, removed afterwards unless ``--keep``).  18 GiB uncompressed (9 GiB
two-byte, 4.6 GiB one-byte): whether it fits in the page cache decides between a disk-bound
and a CPU-bound loader, so the free memory is printed.

Batches: N=64 speakers x M=10 utterances, T=160 frames, from one epoch planned by
:func:`spkflow.train.batches.plan_epoch`.  Rows:

* ``spkflow loader``: :class:`spkflow.train.loader.NxMCropDataset` (voiced frames, utterance mean
  normalisation) through :func:`spkflow.train.loader.make_loader` with ``--workers`` workers;
* ``naive``: a DataLoader (same workers) whose dataset, for each utterance of a batch, reads
  a speechocean762 FLAC file (soundfile, whole file, as voxceleb_trainer's loadWAV), cuts a
  random 1.615 s segment, computes torchaudio's Kaldi fbank on the segment only (cheaper than
  WeSpeaker, which computes it on the whole utterance), subtracts the mean and stacks.
  Audio files are cycled over the corpus's 2,000 files (all in the page cache: the naive path
  gets the advantage).

Raw path (``--raw RECIPE_DIR``, after stage 2 and ``local/prepare_aug.sh`` of the speechocean762
demo): on the demo's real data and batch shape (``--num-spk 32 --num-utt 4``, crops of 150-250
frames, ``--batches`` batches from stage-3-style plans), rows for the ark path
(:class:`spkflow.train.loader.NxMCropDataset`), the raw path without augmentation and with the ``augment``
section of ``--aug-config`` (default ``conf/tuning/train_aug.yaml``), each with ``--workers`` workers,
and the disk that stored augmented copies would take instead (Kaldi style: ``--copies`` extra
feature sets)::

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_loader.py --raw egs/speechocean762/spk1

Prints batches/s, crops/s and the ratio; the first 5 batches (worker start) are not timed.
On a shared machine wall-clock rates depend on the others' load, so it also prints the CPU
time per batch (workers and main process, over the last ``--cpu-batches`` batches of the
epoch) and what that gives on 2 free cores when reads do not wait for the disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi  # imported here so forked workers do not pay for it

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))  # the test helpers
from helpers.paths import db_var  # noqa: E402
from spkflow.train.batches import plan_epoch  # noqa: E402
from spkflow.train.loader import NxMCropDataset, make_loader  # noqa: E402

N, M, T, F = 64, 10, 160, 80


def write_features(work: Path, num_utts: int, method: int, arks: int = 16) -> dict[str, list[str]]:
    """Generated feature set in Kaldi binary arks; returns spk2utt."""
    import kaldiio.matio

    rng = np.random.default_rng(0)
    pool = (rng.standard_normal((4096, F)) * 3 - 5).astype(np.float32)
    per_spk = 100
    spk2utt: dict[str, list[str]] = {}
    feats_scp, vad_scp, cmvn_scp = [], [], []
    per_ark = -(-num_utts // arks)
    t0 = time.perf_counter()
    for a in range(arks):
        lo, hi = a * per_ark, min(num_utts, (a + 1) * per_ark)
        with (
            open(work / f"raw_fbank.{a + 1}.ark", "wb") as ff,
            open(work / f"vad.{a + 1}.ark", "wb") as fv,
            open(work / f"cmvn.{a + 1}.ark", "wb") as fc,
        ):
            for i in range(lo, hi):
                spk = f"spk{i // per_spk:05d}"
                utt = f"{spk}-{i % per_spk:03d}"
                spk2utt.setdefault(spk, []).append(utt)
                n = int(rng.integers(200, 401))
                s = int(rng.integers(0, 4096 - n))
                mat = pool[s : s + n]
                key = (utt + " ").encode()
                ff.write(key)
                feats_scp.append(f"{utt} {ff.name}:{ff.tell()}\n")
                if method:
                    kaldiio.matio.write_array(ff, mat, compression_method=method)
                else:
                    ff.write(b"\0BFM \x04" + struct.pack("<i", n) + b"\x04" + struct.pack("<i", F))
                    ff.write(mat.tobytes())
                vad = (rng.random(n) < 0.7).astype(np.float32)
                fv.write(key)
                vad_scp.append(f"{utt} {fv.name}:{fv.tell()}\n")
                fv.write(b"\0BFV \x04" + struct.pack("<i", n) + vad.tobytes())
                stats = np.zeros((2, F + 1))
                stats[0, :F] = mat[vad > 0.5].sum(0)
                stats[0, F] = (vad > 0.5).sum()
                fc.write(key)
                cmvn_scp.append(f"{utt} {fc.name}:{fc.tell()}\n")
                fc.write(b"\0BDM \x04" + struct.pack("<i", 2) + b"\x04" + struct.pack("<i", F + 1) + stats.tobytes())
        print(f"  ark {a + 1}/{arks} written ({time.perf_counter() - t0:.0f} s)", flush=True)
    (work / "feats.scp").write_text("".join(feats_scp))
    (work / "vad.scp").write_text("".join(vad_scp))
    (work / "cmvn_utt_voiced.scp").write_text("".join(cmvn_scp))
    return spk2utt


class NaiveDataset:
    """Per batch: read audio, crop, Kaldi fbank, mean normalisation, for every utterance."""

    def __init__(self, batches: list[list[str]], audio: list[str], seed: int = 0) -> None:
        self.batches, self.audio, self.seed = batches, audio, seed

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, b: int):
        rng = np.random.default_rng([self.seed, b])
        samples = (T - 1) * 160 + 400
        out = torch.empty((len(self.batches[b]), T, F))
        for i, _ in enumerate(self.batches[b]):
            path = self.audio[(b * len(self.batches[b]) + i) % len(self.audio)]
            w, _sr = sf.read(path, dtype="float32")
            if len(w) < samples:
                w = np.tile(w, -(-samples // len(w)))
            s = int(rng.integers(0, len(w) - samples + 1))
            x = torch.from_numpy(w[s : s + samples].copy())[None] * 32768.0
            f = kaldi.fbank(x, num_mel_bins=F, dither=0.0, energy_floor=0.0)
            out[i] = f - f.mean(0)
        return out, self.batches[b]


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its finished children (the workers)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cpu_per_batch(dataset, workers: int, k: int, reuse_buffers: bool = True) -> float:
    """CPU seconds per batch over the last ``k`` batches, workers included (they are started,
    run to the end and joined, so every batch made is counted)."""
    import gc

    c0 = cpu_seconds()
    n = 0
    for _ in make_loader(
        dataset, start_batch=len(dataset) - k, num_workers=workers, prefetch_factor=2, reuse_buffers=reuse_buffers
    ):
        n += 1
    gc.collect()
    return (cpu_seconds() - c0) / n


def timed(loader, batches: int) -> tuple[float, int]:
    it = iter(loader)
    for _ in range(5):
        next(it)
    t, k = time.perf_counter(), 0
    for _ in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            break
        assert x.shape[0] == N * M and x.shape[2] == F
        k += 1
    return time.perf_counter() - t, k


def bench_raw(a: argparse.Namespace) -> int:
    """The ``--raw`` rows (see the module docstring)."""
    import yaml

    from spkflow.augment.wave import WaveAugment
    from spkflow.features.fbank import FbankOptions
    from spkflow.train.batches import crop_frames
    from spkflow.train.config import normalize_train_config
    from spkflow.train.raw_loader import NxMWaveDataset

    recipe = Path(a.raw).resolve()
    feats = recipe / "dump" / "fbank" / "train"
    if not (feats / "feats.scp").is_file():
        print(f"{feats}/feats.scp not found: run stages 1-2 of the demo first")
        return 1
    cfg_path = recipe / a.aug_config
    cfg = normalize_train_config(yaml.safe_load(cfg_path.read_text()), str(cfg_path))
    fb = FbankOptions.from_kaldi_conf(recipe / "conf" / "fbank.conf")
    n_spk, n_utt = a.num_spk, a.num_utt
    batches: list[list[str]] = []
    epoch = 1
    while len(batches) < a.batches + 5:
        batches += plan_epoch(feats / "spk2utt", n_spk, n_utt, seed=0, epoch=epoch).batches
        epoch += 1
    batches = batches[: a.batches + 5]
    lo, hi = cfg["train"]["crop_min_frames"], cfg["train"]["crop_max_frames"]
    mean_t = np.mean([crop_frames(0, 1, b, lo, hi) for b in range(len(batches))])
    print(
        f"demo data {feats}: {len(batches)} batches of {n_spk}x{n_utt}, crops {lo}-{hi} frames (mean {mean_t:.0f}); "
        f"workers={a.workers}; cores={os.cpu_count()}; load average {os.getloadavg()[0]:.2f}"
    )
    os.chdir(recipe)  # the config's data dirs are relative to the recipe
    rows = {
        "ark (stage-2 features)": NxMCropDataset(
            feats / "feats.scp", batches, seed=0, epoch=1, crop=(lo, hi), mean_norm="none"
        ),
        "raw, no augmentation": NxMWaveDataset(
            feats, batches, fbank=fb, seed=0, epoch=1, crop=(lo, hi), vad_scp=feats / "vad.scp", num_utt=n_utt
        ),
        f"raw + augment of {a.aug_config}": NxMWaveDataset(
            feats,
            batches,
            fbank=fb,
            seed=0,
            epoch=1,
            crop=(lo, hi),
            vad_scp=feats / "vad.scp",
            augment=WaveAugment(cfg["augment"], int(fb.sample_frequency)),
            num_utt=n_utt,
        ),
    }
    for name, ds in rows.items():
        it = iter(make_loader(ds, num_workers=a.workers, prefetch_factor=2))
        for _ in range(5):
            next(it)
        t0, k = time.perf_counter(), 0
        for _ in it:
            k += 1
        sec = time.perf_counter() - t0
        cpu = cpu_per_batch(ds, a.workers, min(a.cpu_batches, len(ds)))
        print(
            f"{name}: {k / sec:.2f} batches/s ({k * n_spk * n_utt / sec:.0f} crops/s) measured; "
            f"CPU per batch {cpu * 1000:.0f} ms (workers + main) = {2 / cpu:.2f} batches/s on 2 free cores"
        )
    ark_bytes = sum(p.stat().st_size for p in (feats / "data").glob("raw_fbank_*.ark"))
    print(
        f"disk: stage-2 feature arks {ark_bytes / 2**20:.0f} MiB; stored augmented copies (Kaldi style, "
        f"{a.copies} per utterance) would add {a.copies * ark_bytes / 2**20:.0f} MiB and fix the "
        f"augmentation of each copy for all epochs; on the fly adds 0 MiB"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utts", type=int, default=200_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--naive-batches", type=int, default=6)
    ap.add_argument("--cpu-batches", type=int, default=40, help="batches for the CPU-time measurement")
    ap.add_argument(
        "--compression-method",
        type=int,
        default=0,
        help="0: float32 (default); 3: Kaldi two-byte (make_fbank --compress true); 1: Kaldi 1-byte CM",
    )
    ap.add_argument("--access", default="pread", choices=["pread", "mmap"])
    ap.add_argument("--work", default="")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-vad", action="store_true")
    ap.add_argument(
        "--no-reuse-buffers",
        action="store_true",
        help="a fresh shared-memory tensor per batch (the loader before buffer recycling)",
    )
    ap.add_argument("--raw", default="", metavar="RECIPE_DIR", help="bench the raw path on a demo recipe dir instead")
    ap.add_argument("--aug-config", default="conf/tuning/train_aug.yaml", help="--raw: config with the augment section")
    ap.add_argument("--num-spk", type=int, default=32, help="--raw: N")
    ap.add_argument("--num-utt", type=int, default=4, help="--raw: M")
    ap.add_argument("--copies", type=int, default=4, help="--raw: augmented copies for the disk estimate")
    a = ap.parse_args()
    if a.raw:
        return bench_raw(a)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="bench_loader.", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if (work / "feats.scp").is_file() and sum(1 for _ in open(work / "feats.scp")) == a.utts:
            print(f"reusing the feature set in {work}")
            spk2utt: dict[str, list[str]] = {}
            for line in open(work / "feats.scp"):
                u = line.split(maxsplit=1)[0]
                spk2utt.setdefault(u.split("-")[0], []).append(u)
        else:
            print(f"writing {a.utts} utterances to {work} (compression method {a.compression_method})")
            spk2utt = write_features(work, a.utts, a.compression_method)
        size = sum(p.stat().st_size for p in work.glob("*.ark")) / 2**30
        plan = plan_epoch(spk2utt, N, M, seed=0, epoch=1)
        batches = plan.batches
        mem = dict(line.split(":") for line in open("/proc/meminfo"))
        avail = int(mem["MemAvailable"].split()[0]) / 2**20
        print(
            f"feature set: {a.utts} utterances, {size:.1f} GiB of arks; {len(batches)} batches of {N}x{M}, "
            f"T={T}, F={F}; workers={a.workers}; access={a.access}; cores={os.cpu_count()}; "
            f"memory available {avail:.1f} GiB; load average {os.getloadavg()[0]:.2f}"
        )
        ds = NxMCropDataset(
            work / "feats.scp",
            batches,
            seed=0,
            epoch=1,
            crop=T,
            use_vad=not a.no_vad,
            mean_norm="utterance",
            access=a.access,
        )
        sec, k = timed(
            make_loader(ds, num_workers=a.workers, prefetch_factor=4, reuse_buffers=not a.no_reuse_buffers), a.batches
        )
        ours = k / sec
        print(f"spkflow loader: {k} batches in {sec:.2f} s = {ours:.1f} batches/s ({ours * N * M:.0f} crops/s)")
        cpu = cpu_per_batch(ds, a.workers, a.cpu_batches, reuse_buffers=not a.no_reuse_buffers)
        print(
            f"  CPU per batch {cpu * 1000:.0f} ms (workers + main): {2 / cpu:.1f} batches/s on 2 free cores "
            "if the disk keeps up"
        )

        corpus = Path(db_var("SPEECHOCEAN762"))
        audio = sorted(str(p) for p in (corpus / "WAVE").rglob("*.flac"))
        if not audio:
            print(f"no speechocean762 audio under {corpus}: naive row skipped")
            return 0
        naive = NaiveDataset(batches, audio)
        nsec, nk = timed(make_loader(naive, num_workers=a.workers, prefetch_factor=2), a.naive_batches)
        nb = nk / nsec
        print(f"naive (audio + fbank per utterance per batch): {nk} batches in {nsec:.2f} s = {nb:.2f} batches/s")
        ncpu = cpu_per_batch(naive, a.workers, 4)
        print(f"  CPU per batch {ncpu * 1000:.0f} ms: {2 / ncpu:.2f} batches/s on 2 free cores")
        print(
            f"ratio: {ours / nb:.1f}x measured, {ncpu / cpu:.1f}x in CPU per batch; "
            f"load average after {os.getloadavg()[0]:.2f}"
        )
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
