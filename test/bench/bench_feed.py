"""Benchmark: what the loaders feed, without a model, against the per-core sum of their parts.

    .venv/bin/python test/bench/bench_feed.py --json OUT [--workers N] [--data DIR] [--rirs DIR]
        [--utt-sec 6] [--audio-format flac|wav] [--extract-utts 256] [--extract-batch 16]
        [--num-spk 64 --num-utt 2 --crop 200] [--train-batches 12] [--ark-batches 600] [--part-items 48]
        [--runs 3] [--workdir DIR]

Paths (each through the entry point the recipes use, so that the figures follow the code):

* ``extract_fbank_workers``: stage 5's loader (:func:`spkflow.embed.loader.job_loader`, what
  :func:`~spkflow.embed.run.run_job` reads) of an ECAPA model dir, fbank + VAD in the workers;
  items: utterances of ``--utt-sec`` s;
* ``extract_fbank_device``: the same with ``--fbank-on device`` (workers decode and pad only);
* ``train_arks``: the VoxCeleb recipe's config (egs/voxceleb/spk1/conf/train_ecapa_c512_aam.yaml)
  with ``frontend.feats_type: ark``, :func:`spkflow.train.data.epoch_dataset` through
  :func:`spkflow.train.loader.make_loader`; items: crops;
* ``train_raw_aug``: that config as it is (raw audio, speed + reverberation + noise / music /
  babble, fbank in the workers);
* ``train_shards``: ``train_arks`` with ``train.shards: true`` (stage 2's shards of the same
  features, batch lists from :func:`spkflow.train.shard_plan.plan_shard_epoch`, a stream per worker):
  the first epoch of a data dir large enough for the timed batches, since a trainer's loader (one
  an epoch) reads every shard once an epoch, and one loader over several epochs of a small set
  would keep shards across their seams.

For each: ``items_per_s`` through the loader with ``workers`` = the CPUs this process may use, the
median of ``--runs`` fresh loaders (every run's in ``runs_items_per_s``; the
batches after each worker's first, so worker start-up is not counted; ``--train-batches`` of
each training path, ``--ark-batches`` of the arks', whose batches are cheap enough that a few
dozen would time mostly start-up; the consumer takes each batch
and drops it), and ``ideal_items_per_s``, the per-core sum of the path's parts x workers: each part
timed alone in this process at one thread (a worker's share, spkflow.core.threads; the CPU time of
that thread) on the same kind of items: ``decode`` (the audio file to samples), ``frontend`` (fbank + VAD + the model's
frontend of a decoded utterance), ``pad`` (extraction's inputs copied into a padded batch in
shared memory, per utterance: with the decode, the device path's whole work on a CPU; on CUDA
the batch is also pinned; into as many buffers in turn as the loader's pool has slots,
:func:`spkflow.core.shared_batches.slot_count`, so that a batch is written to memory out of
the caches, as in the loader), ``crop_read`` (a raw crop's samples as the loader reads them:
:meth:`spkflow.train.stores.AudioFiles.samples`, the header and one span of the file, the VAD),
``augment`` (speed + WaveAugment of a crop), ``fbank`` (of a crop), ``read`` (a crop's rows from
the arks into its place in a batch, through the store's reader as the trainer opens it: every crop
of the timed batches once, into batches in turn, as many as the loader's slots, so neither the
crops nor the batch are in the CPU's cache more than a loader's are), ``normalise`` (the
utterance means subtracted from a batch of crops, per crop: the recipe's ``mean_norm``, on those
batches in turn), ``shard_read`` (the shards read whole, per crop they serve); ``train_raw_aug`` also
reports ``whole_decode_cpu_ms_per_item``, what decoding the whole file costs (the loader's read
before it read spans), and ``cached_crop_read_cpu_ms_per_item``, ``crop_read`` with the files in
the decoded-audio cache (a training set that fits in it); neither is a part.  ``share`` =
items_per_s / ideal_items_per_s: what the pipeline (Python per item, copies, padding, collation,
the main process's unpickling, worker scheduling) leaves of the ideal.  ``loader_floor``: the
training loader's CPU per batch with nothing in its batches (each batch's slot handed back
unwritten): DataLoader's own share of a batch, which no dataset can take away.  ``reads``: what a
path's loader reads, ``audio`` (the ``--audio-format`` files) or ``features`` (arks, shards).

Threads as a user's machine has them: nothing is set in the environment (the workers pin their own
pools, spkflow.core.threads).  This process keeps its freed heap memory as a job's does
(spkflow.core.heap), so the parts and the batches' main process are timed as a job runs them.
The decoded-audio cache is off (bench_gpu.py's setting: VoxCeleb's files do not fit in it), so
every raw crop reads its span from its file.  Data: real speech cut
into clips (bench_gpu.py: the corpora through db.sh, or ``--data``'s wav.scp), utterances cycling
over them.  test/test_bench_feed.py runs it tiny so that it cannot rot.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gpu  # noqa: E402  (also puts the repository and test/ on sys.path; the audio cache off)

#: reported in the JSON: a figure with one of them set is not the "nothing set" figure
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
PATHS = ("extract_fbank_workers", "extract_fbank_device", "train_arks", "train_raw_aug", "train_shards")


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def one_thread() -> Any:
    """A context: this process at a worker's share (one thread in torch, OpenMP and BLAS)."""
    import contextlib

    import torch
    from threadpoolctl import threadpool_limits

    @contextlib.contextmanager
    def ctx() -> Any:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with threadpool_limits(1):
                yield
        finally:
            torch.set_num_threads(before)

    return ctx()


def per_item(fn: Callable[[Any], Any], items: Sequence[Any], repeat: int = 3, seconds: float = 0.25) -> float:
    """CPU seconds per item of ``fn`` over ``items`` at one thread, best of at least ``repeat``
    passes and of as many more as fit in ``seconds`` of CPU (at most 30): a pass of a cheap part
    lasts a few ms, and a noisy neighbour can double one (decoding 48 WAVs: 0.137 then 0.250 ms
    an utterance, best of two passes in two runs, 2026-11-29).  CPU time: what a core spends,
    whatever else the machine runs.  The calling thread's time, not the process's: a part runs
    on this thread alone (:func:`one_thread`), and the process's count also takes in any other
    thread of it that is busy meanwhile (after a loader ran, the process's time came out at
    twice the thread's for the first ~0.2 s of CPU work, 2-core VM, 2026-11-29)."""
    best, spent, passes = float("inf"), 0.0, 0
    with one_thread():
        fn(items[0])  # warm (imports, caches of the options)
        while passes < repeat or (spent < seconds and passes < 30):
            t = time.thread_time()
            for x in items:
                fn(x)
            took = time.thread_time() - t
            best, spent, passes = min(best, took / len(items)), spent + took, passes + 1
    return best


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu() -> float:
    """CPU seconds of this process and its live descendants (the DataLoader workers)."""
    from spkflow.core.procs import descendants

    total = time.process_time()
    for pid in descendants():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total


def through(loader: Iterable[Any], count: Callable[[Any], int], skip: int) -> dict[str, float]:
    """Items/s (wall) and CPU seconds per item (this process and its workers) of ``loader`` over
    the batches after the first ``skip`` (one per worker: their start-up is not counted).  The CPU
    is read at the first timed batch and at the last one (the workers are still there then, found
    by the loader's length), not at every batch: a reading costs the main process ~2 ms (a walk of
    /proc), a quarter of the workers' CPU for a batch of 128 crops from arks."""
    last = len(loader) if hasattr(loader, "__len__") else None  # type: ignore[arg-type]
    t0 = c0 = t1 = c1 = 0.0
    items = k = 0
    for k, batch in enumerate(loader, 1):
        if k >= skip:
            items += count(batch) if k > skip else 0
            if k == skip or last is None or k == last:
                t1, c1 = time.perf_counter(), tree_cpu()
            if k == skip:
                t0, c0 = t1, c1
    if k <= skip:
        raise SystemExit(f"{k} batches: the timing needs more than {skip} (one per worker); give more data")
    if last is not None and k != last:
        raise SystemExit(f"the loader gave {k} batches, its length says {last}")
    return {"rate": items / (t1 - t0), "cpu": (c1 - c0) / items, "items": items, "batches": k}


def median_run(
    loader: Callable[[], Iterable[Any]], count: Callable[[Any], int], skip: int, runs: int
) -> dict[str, float]:
    """:func:`through` over ``runs`` fresh loaders (new workers each, as a trainer makes one an
    epoch): the run of the median rate (the lower of the two middle ones), with every run's rate.
    One run of a few dozen batches lasts under a second, and its share came out anywhere from 0.57
    to 0.91 in runs a minute apart (shards, 2-core VM, 2026-11-29): one figure would say which run."""
    timed = sorted((through(loader(), count, skip) for _ in range(max(1, runs))), key=lambda t: t["rate"])
    middle = dict(timed[(len(timed) - 1) // 2])
    middle["rates"] = [t["rate"] for t in timed]  # type: ignore[assignment]
    return middle


def row(timed: dict[str, Any], parts: dict[str, float], workers: int, reads: str) -> dict[str, Any]:
    """A path's figures; ``reads``: what its loader reads, ``"audio"`` (``--audio-format`` files) or ``"features"``."""
    ideal = workers / sum(parts.values())
    return {
        "reads": reads,
        "items_per_s": round(timed["rate"], 2),
        "runs_items_per_s": [round(r, 2) for r in timed.get("rates", [timed["rate"]])],
        "ideal_items_per_s": round(ideal, 2),
        "workers": workers,
        "share": round(timed["rate"] / ideal, 3),
        "parts_cpu_ms_per_item": {k: round(1e3 * v, 6) for k, v in parts.items()},
        "cpu_ms_per_item": round(1e3 * timed["cpu"], 3),
        "cpu_share": round(sum(parts.values()) / timed["cpu"], 3),
        "items_timed": int(timed["items"]),
        "batches": int(timed["batches"]),
    }


# ------------------------------------------------------------------------------- extraction
def pad_part(inputs: Sequence[Any], batch: int, workers: int) -> float:
    """CPU seconds per input of padding ``inputs`` (samples, or the frontend's features) ``batch``
    at a time into buffers in shared memory, as stage 5's loader pads them: into as many buffers
    as its pool has slots, in turn, so that each batch is written to memory out of the cache as a
    loader's is."""
    from spkflow.core.shared_batches import shared_empty, slot_count
    from spkflow.embed.base import pad_into, padded_shape

    groups = [inputs[i : i + batch] for i in range(0, len(inputs), batch)]
    numel = max(math.prod(padded_shape(g)) for g in groups)
    buffers = [shared_empty((numel,)).fill_(0) for _ in range(slot_count(workers))]
    # counted across passes, not per group: a pass has a few groups (48 inputs / 16), and a buffer
    # fixed per group would stay in the cache from one pass to the next
    turn = itertools.count()

    def pad(group: Sequence[Any]) -> None:
        shape = padded_shape(group)
        buffer = buffers[next(turn) % len(buffers)]
        pad_into(group, buffer[: math.prod(shape)].view(shape).numpy())

    return per_item(pad, groups) * len(groups) / len(inputs)


def bench_extraction(data: Path, work: Path, a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from spkflow.data.audio import AudioReader
    from spkflow.embed import open_embedder
    from spkflow.embed.loader import job_loader

    model = bench_gpu.ecapa_model_dir(work / "model", 16)  # never run: its config sets the frontend
    utts = sorted((ln.split()[0] for ln in (data / "utt2spk").read_text().splitlines()), key=str.encode)
    sample = utts[: a.part_items]
    reader = AudioReader(data, sample_rate=16000)
    waves = {u: reader.read(u) for u in sample}
    decode = per_item(reader.read, sample)
    out = {}
    for fbank_on in ("workers", "device"):
        emb = open_embedder(model, "spkflow", "cpu", fbank_on=fbank_on)
        parts = {"decode": decode}
        if fbank_on == "workers":
            parts["frontend"] = per_item(lambda u, e=emb: e.prepare_wave(waves[u]), sample)
        inputs = [waves[u] if fbank_on == "device" else emb.prepare_wave(waves[u]) for u in sample]
        parts["pad"] = pad_part(inputs, a.extract_batch, a.workers)
        max_frames = a.extract_batch * (int(a.utt_sec * 100) + 10)

        def loader(e: Any = emb, mf: int = max_frames) -> Iterable[Any]:  # a fresh one (new workers) per run
            return job_loader(e, data, utts, batch_size=a.extract_batch, max_frames=mf, num_workers=a.workers)[0]

        # a batch padded in the workers is (items, parts), else a list of items
        timed = median_run(loader, lambda b: len(b[0]) if isinstance(b, tuple) else len(b), a.workers, a.runs)
        key = f"extract_fbank_{fbank_on}"
        out[key] = row(timed, parts, a.workers, "audio")
        print(f"  {key}: {out[key]}", flush=True)
    return out


# ------------------------------------------------------------------------------- training
def train_config(src: dict[str, Path], feats_type: str, shards: bool) -> dict[str, Any]:
    import yaml

    from spkflow.train.config import normalize_train_config

    raw = yaml.safe_load(bench_gpu.VOXCELEB_CONFIG.read_text())
    raw["augment"]["reverb"]["data_dir"] = str(src["rirs"])
    raw["augment"]["noise"]["data_dirs"] = {k: str(src[k]) for k in ("noise", "music", "speech")}
    if feats_type != "raw":  # the waveform augmentation is the raw path's
        del raw["augment"]
    raw["frontend"]["feats_type"] = feats_type
    raw["train"]["shards"] = shards
    raw["train"]["fbank_on"] = "workers"
    return normalize_train_config(raw, str(bench_gpu.VOXCELEB_CONFIG))


def make_shards(feats: Path, a: argparse.Namespace) -> Path:
    from spkflow.data.shard_jobs import merge, prepare, write_job

    shard_dir = feats / "shards"
    if not (shard_dir / "shards.list").is_file():
        prepare(feats, shard_dir, shard_utts=a.num_spk * a.num_utt, run=a.num_utt, seed=0)
        write_job(feats, shard_dir, 1, 1)
        merge(shard_dir, 1)
    return shard_dir


def loader_floor(batches: list[list[str]], shape: tuple[int, int, int], workers: int, runs: int) -> dict[str, Any]:
    """What the training loader costs with nothing in its batches: a dataset that hands each batch's
    slot back unwritten, with its ids, through :func:`spkflow.train.loader.make_loader` (DataLoader's
    queues, the slots, the main process's receiving): CPU ms per batch, its main process and workers."""
    from spkflow.train.loader import NxMBatches, make_loader

    class Nothing:
        def serve(self, batches: Any) -> Nothing:
            return self

    class Hollow(NxMBatches):
        def batch_numel(self) -> int:
            return math.prod(shape)

        def __getitem__(self, index: Any) -> tuple[Any, list[str]]:
            b, into = index if isinstance(index, tuple) else (index, None)
            return self.batch_tensor(shape, into), list(self.batches[b])

    hollow = Hollow(Nothing(), batches, 0, 1, shape[1])
    timed = median_run(lambda: make_loader(hollow, num_workers=workers), lambda _: 1, workers, runs)
    return {
        "cpu_ms_per_batch": round(1e3 * timed["cpu"], 4),
        "batches_per_s": round(timed["rate"], 1),
        "runs_batches_per_s": [round(r, 1) for r in timed["rates"]],
        "workers": workers,
        "batch": "x".join(map(str, shape)),
        "batches": int(timed["batches"]),
    }


def epoch_batches(plan: Callable[[int], Sequence[Sequence[str]]], need: int) -> list[list[str]]:
    out: list[list[str]] = []
    epoch = 1
    while len(out) < need:
        got = [list(b) for b in plan(epoch)]
        if not got:
            raise SystemExit(f"epoch {epoch} plans no batch: give more speakers or utterances")
        out += got
        epoch += 1
    return out[:need]


def bench_training(
    data: Path, clips: Sequence[Path], clips_dir: Path, work: Path, a: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    import numpy as np
    import torch

    from spkflow.augment.wave import WaveAugment, speed_perturb
    from spkflow.core.shared_batches import shared_empty, slot_count
    from spkflow.data.audio import AudioReader
    from spkflow.data.shards import load_shard
    from spkflow.data.tables import read_kv
    from spkflow.features.fbank import FbankOptions, compute_fbank
    from spkflow.train.batches import plan_epoch
    from spkflow.train.data import epoch_dataset
    from spkflow.train.loader import make_loader
    from spkflow.train.raw_loader import samples_for_frames
    from spkflow.train.shard_plan import plan_shard_epoch, read_utt2shard
    from spkflow.train.stores import open_store

    src = bench_gpu.aug_sources(work, clips_dir, a.rirs)
    feats = bench_gpu.ark_features(clips_dir, data, work)
    utt2spk = read_kv(data / "utt2spk")
    need = a.train_batches + a.workers
    crops = lambda batch: int(batch[0].shape[0])  # noqa: E731
    out: dict[str, dict[str, Any]] = {}
    # the parts, on the crops of the first batches; the arks' path times more batches than the
    # others (a batch of theirs is ~0.2 ms of a core: startup would weigh on a few dozen)
    ark_batches = epoch_batches(
        lambda e: plan_epoch(data / "spk2utt", a.num_spk, a.num_utt, seed=0, epoch=e).batches,
        max(need, a.ark_batches + a.workers),
    )
    sample = [u for b in ark_batches for u in b][: a.part_items]
    rng = np.random.default_rng(0)
    fb = FbankOptions()
    T = a.crop
    n = samples_for_frames(T, fb)

    def run(
        name: str, cfg: dict[str, Any], batches: list[list[str]], parts: dict[str, float],
        data_dir: Path = data, feats_dir: Path = feats,
    ) -> None:  # fmt: skip
        spk = read_kv(data_dir / "utt2spk")
        store = open_store(cfg, str(data_dir), str(feats_dir), known_utts=spk)  # as the trainer opens it
        wave_aug = WaveAugment(cfg["augment"], 16000) if cfg["frontend"]["feats_type"] == "raw" else None
        ds = epoch_dataset(
            cfg["frontend"], store, batches, seed=0, epoch=1, crop=(T, T), wave_aug=wave_aug,
            vad_scp=str(feats_dir / "vad.scp"), num_utt=a.num_utt, utt2spk=spk, fbank_on="workers",
        )  # fmt: skip
        timed = median_run(lambda: make_loader(ds, num_workers=a.workers), crops, a.workers, a.runs)
        out[name] = row(timed, parts, a.workers, "audio" if cfg["frontend"]["feats_type"] == "raw" else "features")
        print(f"  {name}: {out[name]}", flush=True)

    # arks: a crop's T consecutive rows
    cfg = train_config(src, "ark", False)
    # each crop of the timed batches once, into its place in a batch, with the store's reader (its
    # access) and its batch call (spans_into, what the loader calls; a gather per crop costs 0.7 ms
    # more a batch of 128 in Python): the crops a loader reads are not in the CPU's cache, nor is
    # the batch it fills
    ark = open_store(cfg, str(data), str(feats), known_utts=utt2spk).feats
    crops_per_batch = a.num_spk * a.num_utt
    # batches in turn, as many as the loader's pool has slots: a buffer comes round again only
    # after the others, out of the cache by then, as in the loader (one batch reused stays in a
    # 32 MB L3: 1.26 ms a batch of 128 x 200 x 80 read and normalised, against 1.9 in turn, 2026-11-29)
    slots = [shared_empty((crops_per_batch, T, fb.dim)).fill_(0) for _ in range(slot_count(a.workers))]
    timed = [
        (slots[k % len(slots)].numpy(), b, [int(rng.integers(0, max(1, ark.num_rows(u) - T + 1))) for u in b])
        for k, b in enumerate(ark_batches[a.workers :])
    ]

    def read_batch(x: tuple[np.ndarray, list[str], list[int]]) -> None:
        ark.spans_into(x[1], x[2], x[0])

    read = per_item(read_batch, timed) / crops_per_batch
    # the recipe's mean normalisation: the crops' means subtracted from a batch (torch, as the loader)
    shift = torch.from_numpy(np.random.default_rng(1).standard_normal((crops_per_batch, 1, fb.dim), dtype=np.float32))
    normalise = per_item(lambda k: slots[k % len(slots)].sub_(shift), range(2 * len(slots))) / crops_per_batch
    run("train_arks", cfg, ark_batches, {"read": read, "normalise": normalise})
    out["loader_floor"] = loader_floor(ark_batches, (crops_per_batch, T, fb.dim), a.workers, a.runs)
    print(f"  loader_floor: {out['loader_floor']}", flush=True)

    # raw audio with the recipe's augmentation
    cfg = train_config(src, "raw", False)
    aug = WaveAugment(cfg["augment"], 16000)
    audio = AudioReader(data, sample_rate=16000)
    factors = aug.speed_factors or [1.0]
    waves = {u: audio.read(u) for u in sample}

    # each item draws from its own stream, the same in every pass: the best pass is not the one
    # that happened to draw the fewest rooms (a reverberation costs 1 ms, a crop without 0.1)
    draws = {u: k for k, u in enumerate(sample)}

    def augment(u: str) -> None:
        r = np.random.default_rng([draws[u], 1])
        f = float(factors[int(r.integers(len(factors)))])
        x = waves[u][: int(np.ceil(n * f)) + 2 if f != 1.0 else n]
        if f != 1.0:
            x = speed_perturb(x, f)[:n]
        aug(x, r, speaker=utt2spk[u], counts=collections.Counter())

    crops_of = epoch_dataset(
        cfg["frontend"], open_store(cfg, str(data), str(feats), known_utts=utt2spk), ark_batches, seed=0, epoch=1,
        crop=(T, T), wave_aug=None, vad_scp=str(feats / "vad.scp"), num_utt=a.num_utt, utt2spk=utt2spk,
    )  # fmt: skip

    def crop_read(u: str) -> None:  # as the loader reads a crop: the store's samples, the VAD, one span
        crops_of.crop(u, draws[u], n)

    parts = {
        "crop_read": per_item(crop_read, sample),
        "augment": per_item(augment, sample),
        "fbank": per_item(lambda u: compute_fbank(waves[u][:n], 16000, fb), sample),
    }
    run("train_raw_aug", cfg, ark_batches[:need], parts)
    out["train_raw_aug"]["whole_decode_cpu_ms_per_item"] = round(1e3 * per_item(audio.read, sample), 6)
    # the same crop_read with every file in a decoded-audio cache (a training set that fits in it)
    from spkflow.augment.wave import DecodedAudioCache
    from spkflow.train import stores

    off, stores.AUDIO_CACHE = stores.AUDIO_CACHE, DecodedAudioCache(4096)
    try:
        for u in sample:
            stores.AUDIO_CACHE.read(crops_of.store.audio, u)
        out["train_raw_aug"]["cached_crop_read_cpu_ms_per_item"] = round(1e3 * per_item(crop_read, sample), 6)
    finally:
        stores.AUDIO_CACHE = off

    # shards of the same features, read whole, batch lists a loader can serve front to back: one epoch
    # of a data dir large enough for the timed batches, as a trainer's loader reads them (one loader
    # over several epochs of a small set keeps shards across the epochs' seams: 15 shards read for 4
    # epochs of 8, where training reads 32)
    utts = need * a.num_spk * a.num_utt
    for _ in range(4):  # the plan's windows of shards leave some utterances out: more until it is enough
        shard_data = bench_gpu.repeated_data_dir(work / "shard_data", clips, utts, 2 * a.num_spk, a.utt_sec)
        shard_feats = bench_gpu.ark_features(clips_dir, shard_data, work, "shard_feats")
        shard_dir = make_shards(shard_feats, a)
        u2s = read_utt2shard(shard_dir / "utt2shard")
        plan = plan_shard_epoch(shard_data / "spk2utt", u2s, a.num_spk, a.num_utt, seed=0, epoch=1, pool=2,
                                streams=a.workers).batches  # fmt: skip
        if len(plan) >= need:
            break
        tried, utts = utts, math.ceil(1.15 * utts * need / max(len(plan), 1))
    else:
        raise SystemExit(f"an epoch of {tried} utterances in shards plans {len(plan)} batches, fewer than {need}")
    cfg = train_config(src, "ark", True)
    shard_batches = [list(b) for b in plan[:need]]
    listed = [ln.split() for ln in (shard_dir / "shards.list").read_text().splitlines()]
    with one_thread():
        t = time.thread_time()
        for name, _, size in listed:
            load_shard(shard_dir / name, int(size))
        whole = time.thread_time() - t
    # the windows are dealt to the streams (a worker each): every shard is read once per epoch in all
    crops_per_epoch = sum(map(len, plan))
    run(
        "train_shards",
        cfg,
        shard_batches,
        {"read": read, "normalise": normalise, "shard_read": whole / crops_per_epoch},
        shard_data,
        shard_feats,
    )
    out["train_shards"]["epoch_batches"] = len(plan)  # the timed batches are the first of this one epoch
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, required=True, help="write the figures here")
    p.add_argument("--workers", type=int, default=cpus(), help="DataLoader workers (default: the CPUs)")
    p.add_argument("--data", type=Path, default=None, help="a data dir of real speech (default: the corpora)")
    p.add_argument("--rirs", type=Path, default=None, help="impulse responses (default: made with make_rirs)")
    p.add_argument("--utt-sec", type=float, default=6.0, help="utterance length (s)")
    p.add_argument("--clips", type=int, default=48, help="distinct clips the utterances cycle over")
    p.add_argument("--audio-format", choices=("flac", "wav"), default="flac", help="the clips' format (16-bit)")
    p.add_argument("--extract-utts", type=int, default=256)
    p.add_argument("--extract-batch", type=int, default=16)
    p.add_argument("--num-spk", type=int, default=64, help="N of the training batches")
    p.add_argument("--num-utt", type=int, default=2, help="M of the training batches")
    p.add_argument("--crop", type=int, default=200, help="training crop (frames)")
    p.add_argument("--train-batches", type=int, default=12, help="batches timed per training path")
    p.add_argument("--ark-batches", type=int, default=600, help="batches timed on the arks (the cheapest)")
    p.add_argument("--part-items", type=int, default=48, help="items each part is timed on")
    p.add_argument("--runs", type=int, default=3, help="loaders timed per path (a fresh one each): the median run")
    p.add_argument("--paths", default="extract,train", help="extract,train (both by default)")
    p.add_argument("--workdir", type=Path, default=None, help="keep the data here (default: a temporary dir)")
    a = p.parse_args(argv)
    if a.workers < 1 or a.runs < 1:
        p.error("--workers and --runs must be >= 1")
    from spkflow.core.heap import keep_freed_memory

    keep_freed_memory()  # the parts are timed here, the batches taken here: a process set as a job's
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench_feed."))
    work.mkdir(parents=True, exist_ok=True)
    try:
        clips = bench_gpu.make_clips(
            bench_gpu.source_files(a.data),
            work / f"clips_{a.audio_format}",
            a.utt_sec,
            limit=a.clips,
            fmt=a.audio_format,
        )
        clips_dir = bench_gpu.write_data_dir(
            work / "clips_data", {c.stem: str(c) for c in clips}, {c.stem: c.stem for c in clips}, a.utt_sec
        )
        result: dict[str, Any] = {
            "machine": bench_gpu.machine_info("cpu"),
            "command": "python test/bench/bench_feed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "thread_env": {k: os.environ.get(k) for k in THREAD_ENV},  # None: as a user's machine has them
            "utt_sec": a.utt_sec,
            "audio_format": a.audio_format,
            "batch": f"{a.num_spk}x{a.num_utt}x{a.crop} frames",
        }
        parts = a.paths.split(",")
        if "extract" in parts:
            data = bench_gpu.repeated_data_dir(work / "extract_data", clips, a.extract_utts, 8, a.utt_sec)
            result.update(bench_extraction(data, work, a))
        if "train" in parts:
            data = bench_gpu.repeated_data_dir(
                work / "train_data", clips, 8 * a.num_spk * a.num_utt, 2 * a.num_spk, a.utt_sec
            )
            result.update(bench_training(data, clips, clips_dir, work, a))
        a.json.write_text(json.dumps(result, indent=1) + "\n")
        return result
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
