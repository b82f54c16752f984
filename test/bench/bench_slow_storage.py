"""Benchmark: N x M batches from slow storage: shards read front to back against random access.

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_slow_storage.py --json OUT.json \\
        [--latency-ms 5] [--bandwidth-mb-s 150] [--workers 2] [--compress cm2|float|cm1] \\
        [--frames voiced|all] [--work DIR]

The storage: a FUSE mount (mfusepy over libfuse3, bench only; needs /dev/fuse, root and the
``fuse3`` system package) of a local folder that adds ``--latency-ms`` to every read request (a
round trip: requests in flight at the same time wait together, as on a network file system)
and passes the bytes through one link of ``--bandwidth-mb-s`` (transfers one after the other).
The mount's read-ahead is 4 MiB and its largest request 1 MiB, like an NFS mount with rsize
1 MiB; the server runs at nice -10, so that the load of a shared machine slows the loaders, not
the simulated device.  Before each timed run the page cache of every file is dropped (posix_fadvise DONTNEED on
the mount and on the folder under it), so every run reads from the simulated device.

The data: speechocean762's training set (1,500 utterances, 125 speakers, found through db.sh),
stage 2's fbank + VAD computed here with ``scripts/feats/make_fbank.sh`` (``--compress``: float,
Kaldi two-byte ``cm2`` as ``--fbank_compress true`` writes, or one-byte ``cm1``) and shards
written with ``scripts/feats/make_shards.sh`` (``--shard-utts``; ``--frames voiced``, the
default, as ``spk.sh`` writes them for a config with the VAD, or ``all``), all on the mount.

Rows, each with the same batch shape and crops (``--num-spk`` 64 x ``--num-utt`` 2 batches of
``--crop`` 200 frames = 2 s crops of voiced frames, as the demo's frontend, ``--workers`` 2
DataLoader workers), timed over whole epochs from a cold cache (``--epochs``):

* ``random_access``: today's loader (:class:`spkflow.train.loader.NxMCropDataset`, pread per
  crop) on the random-access plan (stage 3 without shards);
* ``shards``: the same dataset over :class:`spkflow.train.stores.FeatureShards` on the shard
  plan (windows of ``--pool`` shards, one stream per worker; every member checked against its
  crc32 as the shard is read);
* ``naive``: WeSpeaker's style of loop (``--naive-batches`` batches): for every utterance of a
  batch, read its FLAC file from the mount, cut a random 2 s segment, compute Kaldi fbank on it;
* ``page_cache_shards``: the shard loader on the same files read from the page cache (the local
  folder, read once before), i.e. what the loader itself costs.

JSON: batches/s of each row, ``ratio_shards_to_random_access`` (goal: >= 10), what the members'
crc32 checks cost (``crc32_*``: seconds per epoch, MB/s, share of a shard epoch on the mount and
from the page cache; ``ratio_checked_to_unchecked_shards``: the shard row against the same run
with the checks switched off in the benchmark, ``shards_unchecked``), peak RSS of the shard
run's processes, the shards held at once, requests and bytes each row read from the mount,
coverage of both plans on this data and, planning only, on a VoxCeleb2-dev-sized spk2utt
(5,994 speakers, 1,092,009 utterances; ``--no-vox-coverage`` skips it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spkflow.data.shards import ShardSet  # noqa: E402
from spkflow.data.tables import read_kv  # noqa: E402
from spkflow.train.batches import plan_epoch  # noqa: E402
from spkflow.train.loader import NxMCropDataset, make_loader  # noqa: E402
from spkflow.train.shard_plan import plan_shard_epoch, read_utt2shard  # noqa: E402
from spkflow.train.stores import FeatureShards  # noqa: E402

PY = sys.executable


# --------------------------------------------------------------------------- the slow mount


def serve(store: str, mnt: str, latency: float, bandwidth: float, requests, nbytes) -> None:
    """A read-only pass-through FUSE file system of ``store`` at ``mnt`` (foreground)."""
    import errno

    import mfusepy as fuse

    with contextlib.suppress(OSError):  # the device is not a CPU job: keep the machine's load off it
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    link = threading.Lock()

    class Slow(fuse.Operations):
        use_ns = True

        def _p(self, path: str) -> str:
            return os.path.join(store, path.lstrip("/"))

        def getattr(self, path, fh=None):
            try:
                st = os.lstat(self._p(path))
            except FileNotFoundError:
                raise fuse.FuseOSError(errno.ENOENT) from None
            keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid")
            return {k: getattr(st, k) for k in keys} | {
                "st_atime": st.st_atime_ns,
                "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns,
            }

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._p(path))]

        def open(self, path, flags):
            return os.open(self._p(path), os.O_RDONLY)

        def release(self, path, fh):
            os.close(fh)
            return 0

        def read(self, path, size, offset, fh):
            time.sleep(latency)  # the round trip: requests in flight wait together
            data = os.pread(fh, size, offset)
            with link:  # one link: transfers one after the other
                time.sleep(len(data) / bandwidth)
                requests.value += 1
                nbytes.value += len(data)
            return data

        def init_with_config(self, conn, cfg):
            if conn is not None:
                conn.max_readahead = 4 << 20
                conn.max_read = 1 << 20

    fuse.FUSE(Slow(), mnt, foreground=True, ro=True, max_read=1 << 20)


@contextlib.contextmanager
def slow_mount(store: Path, mnt: Path, latency: float, bandwidth: float) -> Iterator[tuple]:
    ctx = mp.get_context("spawn")
    requests, nbytes = ctx.Value("q", 0), ctx.Value("q", 0)
    subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)  # a stale one
    mnt.mkdir(parents=True, exist_ok=True)
    proc = ctx.Process(target=serve, args=(str(store), str(mnt), latency, bandwidth, requests, nbytes), daemon=True)
    proc.start()
    SERVER_PID.add(proc.pid)
    try:
        for _ in range(1200):  # the spawned server imports this module (torch) first
            if os.path.ismount(mnt) or not proc.is_alive():
                break
            time.sleep(0.05)
        if not os.path.ismount(mnt):
            raise RuntimeError(f"the FUSE mount at {mnt} did not come up (is fuse3 installed? /dev/fuse?)")
        dev = next(line.split()[2] for line in open("/proc/self/mountinfo") if line.split()[4] == str(mnt))
        ra = Path(f"/sys/class/bdi/{dev}/read_ahead_kb")
        with contextlib.suppress(OSError):
            ra.write_text("4096")  # an NFS mount's read-ahead (rsize 1 MiB, several in flight)
        yield requests, nbytes
    finally:
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def drop_cache(*roots: Path) -> None:
    """posix_fadvise(DONTNEED) on every file under ``roots``: the next read goes to the device."""
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for f in files:
                with contextlib.suppress(OSError):
                    fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
                    try:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)


# --------------------------------------------------------------------------- data


def run(cmd: list[str], **kw) -> None:
    env = {**os.environ, "SPKFLOW_PYTHON": PY, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, **kw)


def prepare(store: Path, compress: str, shard_utts: int, voiced: bool) -> Path:
    """Data dir with the audio in ``store``, fbank and shards; returns the features dir."""
    feats = store / "fbank" / "train"
    if not (feats / "feats.scp").is_file():
        make_features(store, feats, compress)
        (store / "compress").write_text(compress)
    made = (store / "compress").read_text().strip() if (store / "compress").is_file() else "?"
    if made != compress:
        raise SystemExit(f"{store} holds {made} features, not {compress}: pass another --work")
    shards = ["--shard-utts", str(shard_utts), "--voiced", str(voiced).lower()]  # a rerun keeps what is there
    run(["bash", f"{ROOT}/scripts/feats/make_shards.sh", "--nj", "2", *shards, str(feats), str(feats / "shards")])
    return feats


def make_features(store: Path, feats: Path, compress: str) -> None:
    corpus = subprocess.run(
        ["bash", "-c", f'. "{ROOT}/egs/TEMPLATE/spk1/db.sh"; printf %s "$SPEECHOCEAN762"'],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if not Path(corpus, "train").is_dir():
        raise SystemExit(f"speechocean762 not found at '{corpus}' (db.sh: SPEECHOCEAN762)")
    data = store / "data" / "train"
    run([PY, "-m", "spkflow.bin.prepare_corpus", "speechocean762", "--split", "train", corpus, str(data)])
    # the audio goes on the mount too (the naive loop reads it there)
    wav = read_kv(data / "wav.scp")
    (store / "audio").mkdir(exist_ok=True)
    lines = []
    for utt, path in wav.items():
        dst = store / "audio" / f"{utt}{Path(path).suffix}"
        shutil.copy(path, dst)
        lines.append(f"{utt} {dst}\n")
    (data / "wav.scp").write_text("".join(lines))
    opts = {"float": ["--compress", "false"], "cm2": ["--compress", "true"]}.get(
        compress, ["--compress", "true", "--compression-method", "1"]
    )
    run(["bash", f"{ROOT}/scripts/feats/make_fbank.sh", "--nj", "2", *opts, str(data), str(feats)])


def view(feats: Path, store: Path, mnt: Path, out: Path) -> Path:
    """Copies of the scps naming the arks through the mount."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("feats.scp", "vad.scp", "cmvn_utt.scp", "cmvn_utt_voiced.scp"):
        text = (feats / name).read_text().replace(str(store), str(mnt))
        (out / name).write_text(text)
    return out


# --------------------------------------------------------------------------- loaders


class NaiveDataset:
    """WeSpeaker's style: for every utterance of a batch, read the audio file, cut a random segment,
    compute Kaldi fbank on it, subtract its mean."""

    def __init__(self, batches: list[list[str]], wav: dict[str, str], frames: int) -> None:
        self.batches, self.wav, self.frames = batches, wav, frames

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, b: int):
        rng = np.random.default_rng([0, b])
        samples = (self.frames - 1) * 160 + 400
        out = torch.empty((len(self.batches[b]), self.frames, 80))
        for i, utt in enumerate(self.batches[b]):
            w, _ = sf.read(self.wav[utt], dtype="float32")
            if len(w) < samples:
                w = np.tile(w, -(-samples // len(w)))
            s = int(rng.integers(0, len(w) - samples + 1))
            x = torch.from_numpy(w[s : s + samples].copy())[None] * 32768.0
            f = kaldi.fbank(x, num_mel_bins=80, dither=0.0, energy_floor=0.0)
            out[i] = f - f.mean(0)
        return out, self.batches[b]


def vm_hwm_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


SERVER_PID: set[int] = set()  # the FUSE server: a child process that is no loader worker


def children() -> list[int]:
    """This process's children but the FUSE server (the DataLoader workers while a loader runs)."""
    pids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            pids += [int(p) for p in open(f"/proc/self/task/{task}/children").read().split()]
    return [p for p in pids if p not in SERVER_PID]


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with contextlib.suppress(OSError):
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def timed_epoch(dataset, workers: int, limit: int | None = None) -> dict:
    """Batches/s over one epoch (or ``limit`` batches), worker start included; the peak RSS of
    each worker and the CPU seconds of the loader and its workers, read before the workers exit."""
    n = len(dataset) if limit is None else min(limit, len(dataset))
    c0 = proc_cpu_s(os.getpid())
    t0 = time.perf_counter()
    it = iter(make_loader(dataset, num_workers=workers, prefetch_factor=2))
    rss: dict[int, float] = {}
    cpu: dict[int, float] = {}
    for k in range(n):
        next(it)
        if k >= n - 2:  # the workers' peaks and CPU so far, read while they still run
            for p in children():
                rss[p], cpu[p] = max(rss.get(p, 0.0), vm_hwm_mb(p)), max(cpu.get(p, 0.0), proc_cpu_s(p))
    sec = time.perf_counter() - t0
    main_cpu = proc_cpu_s(os.getpid()) - c0
    del it
    return {
        "batches": n,
        "seconds": sec,
        "worker_peak_rss_mb": list(rss.values()),
        "cpu_s": main_cpu + sum(cpu.values()),
    }


def measure(name: str, make, epochs: list[int], workers: int, counters, roots, limit=None) -> dict:
    total_b, total_s, rss, req, nb, cpu = 0, 0.0, [], 0, 0, 0.0
    for e in epochs:
        drop_cache(*roots)
        r0, b0 = (counters[0].value, counters[1].value) if counters else (0, 0)
        r = timed_epoch(make(e), workers, limit)
        if counters:
            req += counters[0].value - r0
            nb += counters[1].value - b0
        total_b, total_s, cpu = total_b + r["batches"], total_s + r["seconds"], cpu + r["cpu_s"]
        rss.extend(r["worker_peak_rss_mb"])
        print(f"{name}: epoch {e}: {r['batches']} batches in {r['seconds']:.2f} s", flush=True)
    out = {"batches": total_b, "seconds": round(total_s, 3), "batches_per_s": round(total_b / total_s, 3)}
    out["worker_peak_rss_mb"] = round(max(rss, default=0.0), 1)
    out["cpu_s_per_batch"] = round(cpu / total_b, 3)
    if counters:
        out["read_requests"], out["read_mb"] = req, round(nb / 1e6, 1)
    return out


def vox_coverage(num_spk: int, num_utt: int, shard_utts: int, pool: int) -> dict:
    """Coverage of both plans on a VoxCeleb2-dev-sized spk2utt (planning only, no audio)."""
    from spkflow.data.shard_jobs import shard_order

    rng = np.random.default_rng(0)
    counts = np.maximum(rng.lognormal(np.log(160), 0.55, 5994).astype(int), 20)
    counts = (counts * (1_092_009 / counts.sum())).astype(int)
    spk2utt = {f"id{s:05d}": [f"id{s:05d}-{u:04d}" for u in range(c)] for s, c in enumerate(counts)}
    utt2spk = {u: s for s, us in spk2utt.items() for u in us}
    shards = shard_order(utt2spk, shard_utts, run=8, seed=0)
    u2s = {u: f"shard{i}" for i, us in enumerate(shards) for u in us}
    full = plan_epoch(spk2utt, num_spk, num_utt, 0, 1)
    sh = plan_shard_epoch(spk2utt, u2s, num_spk, num_utt, 0, 1, pool=pool)
    return {
        "utterances": int(counts.sum()),
        "speakers": len(counts),
        "shards": len(shards),
        "random_access_coverage": round(full.stats.coverage, 4),
        "shards_coverage": round(sh.stats.coverage, 4),
        "random_access_batches": len(full),
        "shards_batches": len(sh),
    }


@contextlib.contextmanager
def unchecked_shards() -> Iterator[None]:
    """Shards read without checking their members' crc32 (this process and the workers it forks):
    the peer that prices the checks.  The benchmark only; the loader always checks."""
    import spkflow.data.shards as shards

    verify = shards._verify
    shards._verify = lambda *args: None
    try:
        yield
    finally:
        shards._verify = verify


def fuse_missing() -> str | None:
    """Why the slow mount cannot come up here (None: it can): fuse3's ``fusermount3`` and its
    library, ``/dev/fuse``, the mfusepy module."""
    fix = "install the fuse3 package (Debian/Ubuntu, as root: apt-get install fuse3)"
    if shutil.which("fusermount3") is None:
        return f"fusermount3 not found: {fix}"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse not found: the kernel's FUSE device (a container needs --device /dev/fuse)"
    try:
        import mfusepy  # noqa: F401  (finds libfuse3 when imported)
    except (ImportError, OSError) as e:
        return f"mfusepy cannot load libfuse ({e}): {fix}; pip install mfusepy"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--latency-ms", type=float, default=5.0)
    ap.add_argument("--bandwidth-mb-s", type=float, default=150.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--num-spk", type=int, default=64)
    ap.add_argument("--num-utt", type=int, default=2)
    ap.add_argument("--crop", type=int, default=200, help="frames per crop (200 = 2 s)")
    ap.add_argument("--compress", choices=("float", "cm2", "cm1"), default="cm2")
    ap.add_argument("--shard-utts", type=int, default=250)
    ap.add_argument(
        "--frames", choices=("voiced", "all"), default="voiced", help="what the shards hold (make_shards.sh --voiced)"
    )
    ap.add_argument("--pool", type=int, default=3, help="shards per window of the shard plan")
    ap.add_argument("--epochs", type=int, default=2, help="epochs timed per row")
    ap.add_argument("--naive-batches", type=int, default=3)
    ap.add_argument("--no-vox-coverage", action="store_true")
    ap.add_argument("--work", default=None, help="keep the prepared data here (reused by a later run)")
    a = ap.parse_args()
    why = fuse_missing()
    if why:
        print(f"bench_slow_storage: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="bench_slow_"))
    store, mnt = (work / "store").resolve(), (work / "mnt").resolve()
    feats = prepare(store, a.compress, a.shard_utts, a.frames == "voiced")
    prep_s = time.perf_counter() - t_start
    spk2utt = feats / "spk2utt"
    u2s = read_utt2shard(feats / "shards" / "utt2shard")
    epochs = list(range(1, a.epochs + 1))
    N, M, T = a.num_spk, a.num_utt, a.crop
    ra_plans = {e: plan_epoch(spk2utt, N, M, 0, e) for e in epochs}
    sh_plans = {e: plan_shard_epoch(spk2utt, u2s, N, M, 0, e, pool=a.pool, streams=a.workers) for e in epochs}
    kw = {"seed": 0, "crop": T, "use_vad": True, "mean_norm": "none"}
    shard_bytes = ShardSet(feats / "shards" / "shards.list").bytes
    res: dict = {
        "latency_ms": a.latency_ms,
        "bandwidth_mb_s": a.bandwidth_mb_s,
        "workers": a.workers,
        "batch": f"{N} x {M}, {T} frames",
        "features": a.compress,
        "shard_frames": a.frames,
        "utterances": len(u2s),
        "shards": len(shard_bytes),
        "shard_mb_max": round(max(shard_bytes) / 1e6, 1),
        "features_mb": round(sum(shard_bytes) / 1e6, 1),
        "pool": a.pool,
        "coverage": {
            "random_access": round(ra_plans[1].stats.coverage, 4),
            "shards": round(sh_plans[1].stats.coverage, 4),
            "random_access_batches_per_epoch": len(ra_plans[1]),
            "shards_batches_per_epoch": len(sh_plans[1]),
        },
        "machine": f"{os.cpu_count()} CPUs, {os.uname().release}",
        "load_average_at_start": round(os.getloadavg()[0], 1),
    }
    wav = read_kv(store / "data" / "train" / "wav.scp")
    with slow_mount(store, mnt, a.latency_ms / 1000, a.bandwidth_mb_s * 1e6) as counters:
        slow = view(feats, store, mnt, work / "view")
        mfeats = mnt / feats.relative_to(store)
        roots = (store, mnt)

        def ra(e):
            return NxMCropDataset(slow / "feats.scp", ra_plans[e].batches, epoch=e, **kw)

        def sh(e, base=mfeats):
            store = FeatureShards(base / "shards" / "shards.list", means=False)
            return NxMCropDataset(store, sh_plans[e].batches, epoch=e, **kw)

        res["random_access"] = measure("random access", ra, epochs, a.workers, counters, roots)
        res["shards_run"] = measure("shards", sh, epochs, a.workers, counters, roots)
        with unchecked_shards():  # the peer: the same run without the members' crc32 checks
            res["shards_unchecked"] = measure("shards, crc32 unchecked", sh, epochs, a.workers, counters, roots)
        mwav = {u: p.replace(str(store), str(mnt)) for u, p in wav.items()}
        res["naive"] = measure(
            "naive",
            lambda e: NaiveDataset(ra_plans[e].batches, mwav, T),
            [1],
            a.workers,
            counters,
            roots,
            limit=a.naive_batches,
        )
    # the page cache: the local files, read once so that they are cached
    for p in (feats / "shards").glob("shard.*.tar"):
        p.read_bytes()
    pc = []
    for e in epochs:
        r = timed_epoch(sh(e, feats), a.workers)
        pc.append(r)
        print(f"shards from the page cache: epoch {e}: {r['batches']} batches in {r['seconds']:.2f} s", flush=True)
    res["page_cache_shards"] = {
        "batches": sum(r["batches"] for r in pc),
        "seconds": round(sum(r["seconds"] for r in pc), 3),
        "cpu_s_per_batch": round(sum(r["cpu_s"] for r in pc) / sum(r["batches"] for r in pc), 3),
    }
    res["page_cache_shards"]["batches_per_s"] = round(
        res["page_cache_shards"]["batches"] / res["page_cache_shards"]["seconds"], 3
    )
    # what the checksums cost: crc32 over every shard byte (each shard is read once per epoch),
    # timed on bytes in memory, against an epoch's time on the mount and from the page cache
    crc_s, crc_bytes = 0.0, 0
    for p in sorted((feats / "shards").glob("shard.*.tar")):
        raw = p.read_bytes()
        t0 = time.perf_counter()
        zlib.crc32(raw)
        crc_s += time.perf_counter() - t0
        crc_bytes += len(raw)
    res["crc32_s_per_epoch"] = round(crc_s, 4)
    res["crc32_mb_per_s"] = round(crc_bytes / 1e6 / crc_s, 1)
    res["crc32_share_of_shard_epoch"] = round(crc_s / (res["shards_run"]["seconds"] / len(epochs)), 4)
    res["crc32_share_of_page_cache_epoch"] = round(crc_s / (res["page_cache_shards"]["seconds"] / len(epochs)), 4)
    res["shards_unchecked_batches_per_s"] = res["shards_unchecked"]["batches_per_s"]
    res["ratio_checked_to_unchecked_shards"] = round(
        res["shards_run"]["batches_per_s"] / res["shards_unchecked"]["batches_per_s"], 3
    )
    res["random_access_batches_per_s"] = res["random_access"]["batches_per_s"]
    res["shards_batches_per_s"] = res["shards_run"]["batches_per_s"]
    res["naive_batches_per_s"] = res["naive"]["batches_per_s"]
    res["page_cache_shards_batches_per_s"] = res["page_cache_shards"]["batches_per_s"]
    res["ratio_shards_to_random_access"] = round(res["shards_batches_per_s"] / res["random_access_batches_per_s"], 2)
    res["goal_ratio"], res["goal_met"] = 10.0, res["ratio_shards_to_random_access"] >= 10.0
    res["peak_rss_mb"] = res["shards_run"]["worker_peak_rss_mb"]
    res["peak_rss_over_random_access_mb"] = round(res["peak_rss_mb"] - res["random_access"]["worker_peak_rss_mb"], 1)
    res["peak_rss_bound_mb"] = round(2 * a.pool * res["shard_mb_max"], 1)  # a window in use + the next being read
    if not a.no_vox_coverage:
        res["voxceleb2_sized_coverage"] = vox_coverage(N, M, 1000, 8)
    res["prepare_seconds"] = round(prep_s, 1)
    res["load_average_at_end"] = round(os.getloadavg()[0], 1)
    res["total_seconds"] = round(time.perf_counter() - t_start, 1)
    Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
