"""N x M crops from shards read front to back: the training loader for slow storage.

:class:`NxMShardDataset` is :class:`spkflow.train.loader.NxMCropDataset` with its arks in memory:
before batch ``b`` it makes sure the shards holding b's utterances are loaded (each shard one
sequential read of the whole file, :func:`spkflow.data.shards.load_shard`), then crops exactly as
the random-access loader does (the same code over the same record bytes), so a batch equals the
random-access loader's batch of the same batch list bit for bit, with the same (seed, epoch,
batch) crops.  Served through :func:`spkflow.train.loader.make_loader` like the ark dataset.

Memory and reads, per process (the trainer, or each DataLoader worker, which with in-order
dispatch serves batches ``b0, b0 + W, ...``): a shard is read when the first of this process's
batches needs it (or earlier, by a background thread, ``prefetch`` shards ahead in the order of
first use), and dropped after the last of them.  With batch lists from
:mod:`spkflow.train.shard_plan` (windows of ``pool`` shards) that is at most ``pool`` shards in
use plus ``prefetch`` being read, and every shard read once per epoch per stream of batches
(a worker reads the windows of the batches it serves; ``streams`` = workers gives each worker
its own).  A batch that needs more shards than ``max_shards`` (a list planned for random access)
is refused with a message saying so.

Compared with WeSpeaker's shard pipeline (shard list shuffled per epoch, tar members streamed,
then a shuffle buffer): batches here keep the N x M structure and a batch is a pure function of
(files, seed, epoch, batch index), so a resume at batch k reads only the shards batch k onward
needs and continues the exact batch sequence; WeSpeaker, WebDataset and lhotse Shar draw
batches from a buffer whose contents depend on everything read before.
"""

from __future__ import annotations

import concurrent.futures
import os
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from spkflow.core.errors import InputError
from spkflow.data.ark import KaldiArkReader, parse_header
from spkflow.data.audio import decode_audio_bytes, resample
from spkflow.data.shards import Shard, ShardSet
from spkflow.train.loader import MEAN_NORM_MODES, NxMCropDataset
from spkflow.train.raw_loader import NxMWaveDataset

__all__ = ["NxMShardDataset", "NxMWaveShardDataset", "ShardPool"]


class _MemoryArks(KaldiArkReader):
    """The :class:`KaldiArkReader` interface over one field of the shards in memory."""

    def __init__(self, name: str, paths: list[str]) -> None:  # no scp: entries come with shards
        self.scp = name
        self._files = paths
        self._index: dict[str, tuple[int, int]] = {}
        self._other: dict[str, str] = {}
        self.access = "mmap"
        self._maps: dict[int, np.ndarray] = {}
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self._sizes: dict[int, int] = {}
        self._headers = {}
        self._scratch = None

    def add(self, i: int, data: np.ndarray, offsets: Mapping[str, int]) -> None:
        self._maps[i] = data
        for utt, off in offsets.items():
            self._index[utt] = (i, off)

    def drop(self, i: int, utts: Sequence[str]) -> None:
        self._maps.pop(i, None)
        for u in utts:
            self._index.pop(u, None)
            self._headers.pop(u, None)

    def _map(self, i: int) -> np.ndarray:
        m = self._maps.get(i)
        if m is None:
            raise RuntimeError(f"{self._files[i]} is not in memory (a shard pool bug)")
        return m

    def _open(self, i: int) -> int:
        raise RuntimeError("shards in memory are not read with pread")


class ShardPool:
    """Shards in memory for one process, with a background reader (see the module doc)."""

    def __init__(self, shards: ShardSet, fields: Sequence[str], known_utts: Mapping[str, str] | None) -> None:
        self.shards, self.known = shards, known_utts
        paths = [shards.path(i) for i in range(len(shards))]
        self.arks = {f: _MemoryArks(f"{shards.list_path} ({f})", paths) for f in fields}
        self.voiced: set[str] = set()  # utterances whose features are their voiced frames only
        self.loaded: dict[int, Shard] = {}
        self.where: dict[str, int] = {}  # utterance -> loaded shard
        self.pending: dict[int, concurrent.futures.Future[Shard]] = {}
        self.peak = 0  # most shards loaded or being read at once
        self.reads = 0  # shards read so far
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def _reader(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None or self._pid != os.getpid():  # a forked worker starts its own
            self._executor, self._pid, self.pending = concurrent.futures.ThreadPoolExecutor(1), os.getpid(), {}
        return self._executor

    def prefetch(self, i: int) -> None:
        if i not in self.loaded and i not in self.pending:
            self.pending[i] = self._reader().submit(self.shards.load, i, self.known)
            self._count()

    def ensure(self, i: int) -> None:
        if i in self.loaded:
            return
        self.prefetch(i)
        shard = self.pending.pop(i).result()
        voiced = shard.offsets.get("feats_voiced", {})
        if voiced and "feats" in self.arks and "vad" not in self.arks:
            raise InputError(
                self.shards.path(i),
                None,
                "holds the voiced frames only ('feats_voiced'): training without the VAD (frontend.vad: false) "
                "needs shards of every frame (make_shards.sh --voiced false)",
            )
        for field, ark in self.arks.items():
            offsets = shard.offsets.get(field, {})
            if field == "feats":
                offsets = {**offsets, **voiced}  # a voiced utterance's frames are all kept: no VAD
            if len(offsets) != len(shard.utts) - (len(voiced) if field == "vad" else 0):
                raise InputError(
                    self.shards.path(i), None, f"has no '{field}' member for every utterance (write the shards again)"
                )
            ark.add(i, shard.data, offsets)
        self.loaded[i] = shard
        self.voiced.update(voiced)
        self.where.update((u, i) for u in shard.utts)
        self.reads += 1
        self._count()

    def evict(self, i: int) -> None:
        shard = self.loaded.pop(i, None)
        if shard is not None:
            for u in shard.utts:
                self.where.pop(u, None)
                self.voiced.discard(u)
            for ark in self.arks.values():
                ark.drop(i, shard.utts)

    def _count(self) -> None:
        self.peak = max(self.peak, len(self.loaded) + len(self.pending))


class _ShardReads:
    """What a dataset indexed by batch needs to serve its batches from shards: which shards each
    batch needs, and before batch ``b`` in this process, evict, load and read ahead."""

    shard_set: ShardSet
    batches: list[list[str]]
    pool: ShardPool | None

    def _init_reads(
        self,
        shards: ShardSet | str | os.PathLike[str],
        batches: Sequence[Sequence[str]],
        fields: list[str],
        known_utts: Mapping[str, str] | None,
        max_shards: int,
        prefetch: int | None,
    ) -> None:
        self.shard_set = shards if isinstance(shards, ShardSet) else ShardSet(shards)
        u2s = self.shard_set.utt2shard
        self.needs: list[tuple[int, ...]] = []
        for b, batch in enumerate(batches):
            missing = [u for u in batch if u not in u2s]
            if missing:
                raise KeyError(
                    f"batch {b} (line {b + 1} of the batch list): utterance '{missing[0]}' is in no shard of "
                    f"{self.shard_set.list_path}"
                )
            self.needs.append(tuple(sorted({u2s[u] for u in batch})))
        widest = max((len(n) for n in self.needs), default=0)
        if widest > max_shards:
            raise InputError(
                self.shard_set.list_path,
                None,
                f"a batch needs {widest} shards, more than the {max_shards} the loader holds: "
                "plan the batch lists for shards (stage 3 with --train_shards true)",
            )
        self.max_shards = max(widest, 1)
        self.prefetch_shards = self.max_shards if prefetch is None else int(prefetch)
        self._fields, self._known = fields, known_utts
        self.pool = None
        self._served: tuple[int, int] | None = None  # (first batch, step) this process serves
        self._first_use: list[int] = []  # shards in the order this process's batches need them
        self._last_use: dict[int, int] = {}
        self._next = 0

    def _plan_reads(self, b: int) -> None:
        info = torch.utils.data.get_worker_info()
        step = info.num_workers if info is not None else 1
        self._served = (b, step)
        self._first_use, self._last_use, seen = [], {}, set()
        for k in range(b, len(self.batches), step):
            for s in self.needs[k]:
                if s not in seen:
                    seen.add(s)
                    self._first_use.append(s)
                self._last_use[s] = k
        self._next = 0
        if self.pool is None or self.pool._pid != os.getpid():
            self.pool = ShardPool(self.shard_set, self._fields, self._known)
        self._attach(self.pool)

    def _attach(self, pool: ShardPool) -> None:
        """Point the dataset's readers at ``pool``."""

    def _ensure(self, b: int) -> None:
        st = self._served
        if st is None or self.pool is None or self.pool._pid != os.getpid() or b < st[0] or (b - st[0]) % st[1]:
            self._plan_reads(b)
        pool = self.pool
        assert pool is not None
        for s in [s for s in pool.loaded if self._last_use.get(s, -1) < b]:
            pool.evict(s)
        for s in self.needs[b]:
            pool.ensure(s)
        while self._next < len(self._first_use) and self._first_use[self._next] in pool.loaded:
            self._next += 1
        k = self._next  # read ahead in order of first use, within the bound
        while (
            k < len(self._first_use) and len(pool.loaded) + len(pool.pending) < self.max_shards + self.prefetch_shards
        ):
            pool.prefetch(self._first_use[k])
            k += 1

    def __getstate__(self) -> dict[str, object]:  # a spawned worker starts with no shard in memory
        state = self.__dict__.copy()
        state["pool"], state["_served"] = None, None
        return state


class NxMShardDataset(_ShardReads, NxMCropDataset):
    """Batch ``b`` -> ``(feats [N*M, T, F], utt_ids)`` from shards; see the module doc.

    Parameters as :class:`NxMCropDataset`, with ``shards`` (a :class:`ShardSet` or the path of
    ``shards.list``) in place of the scp; ``known_utts``: the training data dir's utt2spk, which
    every loaded shard is checked against; ``max_shards``: the most shards one batch may need;
    ``prefetch``: shards read ahead (default: as many as one batch may need).
    """

    def __init__(
        self,
        shards: ShardSet | str | os.PathLike[str],
        batches: Sequence[Sequence[str]],
        *,
        seed: int = 0,
        epoch: int = 0,
        crop: int | tuple[int, int] = (140, 180),
        use_vad: bool = True,
        mean_norm: str | bool = "utterance",
        known_utts: Mapping[str, str] | None = None,
        max_shards: int = 16,
        prefetch: int | None = None,
    ) -> None:
        self.batches = [list(b) for b in batches]
        self.seed, self.epoch = int(seed), int(epoch)
        self.crop_range = (crop, crop) if isinstance(crop, int) else (int(crop[0]), int(crop[1]))
        if not 1 <= self.crop_range[0] <= self.crop_range[1]:
            raise ValueError(f"crop must be >= 1 frames (min <= max), got {crop}")
        mean_norm = {True: "utterance", False: "none"}.get(mean_norm, mean_norm)  # type: ignore[call-overload]
        if mean_norm not in MEAN_NORM_MODES:
            raise ValueError(f"mean_norm must be one of {MEAN_NORM_MODES}, got {mean_norm!r}")
        self.mean_norm, self.use_vad = str(mean_norm), bool(use_vad)
        fields = ["feats"]
        if self.use_vad:
            fields.append("vad")
        if self.mean_norm == "utterance":
            fields.append("cmvn_voiced" if self.use_vad else "cmvn")
        self._init_reads(shards, self.batches, fields, known_utts, max_shards, prefetch)

    def _attach(self, pool: ShardPool) -> None:
        self.feats = pool.arks["feats"]
        self.vad = pool.arks.get("vad")
        self.cmvn = pool.arks.get("cmvn_voiced" if self.use_vad else "cmvn")

    def _frames_kept(self, utt: str, rows: int) -> np.ndarray | None:
        if self.pool is not None and utt in self.pool.voiced:
            return None  # the shard holds the frames the VAD keeps, and only those
        return super()._frames_kept(utt, rows)

    def batch_numel(self) -> int:
        """Elements of the largest batch (for the buffer pool): the dimension from the header of
        the first feature member of the first batch's shard (every utterance has the same), a
        few kilobytes at its front, not a scan of the shard (each read a round trip)."""
        if not self.batches:
            return 0
        path = self.shard_set.path(self.shard_set.utt2shard[self.batches[0][0]])
        try:
            with tarfile.open(path, mode="r:") as tar:
                member = next(m for m in tar if m.name.endswith((".feats", ".feats_voiced")))
                f = tar.fileobj
                assert f is not None
                f.seek(member.offset_data)
                h = parse_header(f.read(32), 0)
        except (OSError, tarfile.TarError, StopIteration) as e:
            raise InputError(path, None, f"no readable feature member ({e or 'none found'})") from None
        return max(len(b) for b in self.batches) * self.crop_range[1] * (h.cols if h is not None else 1)

    def __getitem__(self, index: int | tuple[int, torch.Tensor | None]) -> tuple[torch.Tensor, list[str]]:
        self._ensure(index[0] if isinstance(index, tuple) else index)
        return super().__getitem__(index)

    def __getstate__(self) -> dict[str, object]:
        state = _ShardReads.__getstate__(self)
        for k in ("feats", "vad", "cmvn"):
            state.pop(k, None)
        return state


class _ShardAudio:
    """The part of :class:`spkflow.data.audio.AudioReader` the raw loader uses, over the audio
    files held by the shards in memory (decoded as the reader decodes the same files)."""

    def __init__(self, pool: ShardPool, sample_rate: int | None) -> None:
        self.pool, self.sample_rate = pool, sample_rate

    def __contains__(self, utt: object) -> bool:
        return utt in self.pool.shards.utt2shard

    def source(self, utt: str) -> str:
        return f"{self.pool.shards.path(self.pool.shards.utt2shard[utt])}:{utt}"

    def read(self, utt: str) -> np.ndarray:
        i = self.pool.where.get(utt)
        if i is None:
            raise RuntimeError(f"{self.source(utt)} is not in memory (a shard pool bug)")
        shard = self.pool.loaded[i]
        field = shard.audio_field(utt)
        if field is None:
            raise InputError(self.pool.shards.path(i), None, f"'{utt}' has no audio member: a feature shard?")
        wave, rate = decode_audio_bytes(shard.payload(utt, field), utt, f"{self.source(utt)}.{field}")
        return wave if self.sample_rate is None else resample(wave, rate, self.sample_rate)


class NxMWaveShardDataset(_ShardReads, NxMWaveDataset):
    """:class:`NxMWaveDataset` (``frontend.feats_type: raw``) with the audio files read from
    shards (``make_shards.sh --audio true``): the same batches as from the files themselves.
    ``data_dir`` still gives the speakers and, with ``use_vad``, ``vad_scp`` the VAD (one small
    memory-mapped ark, in the page cache after the first epoch); parameters otherwise as
    :class:`NxMShardDataset`."""

    def __init__(
        self,
        shards: ShardSet | str | os.PathLike[str],
        data_dir: str | os.PathLike[str],
        batches: Sequence[Sequence[str]],
        *,
        known_utts: Mapping[str, str] | None = None,
        max_shards: int = 16,
        prefetch: int | None = None,
        **kwargs: Any,
    ) -> None:
        NxMWaveDataset.__init__(self, data_dir, batches, **kwargs)
        self._file_reader = self.audio
        self._init_reads(shards, self.batches, [], known_utts, max_shards, prefetch)

    def _attach(self, pool: ShardPool) -> None:
        self.audio = _ShardAudio(pool, self.rate)  # type: ignore[assignment]

    def __getitem__(
        self, index: int | tuple[int, torch.Tensor | None]
    ) -> tuple[torch.Tensor, list[str], torch.Tensor, dict[str, int]]:
        self._ensure(index[0] if isinstance(index, tuple) else index)
        return super().__getitem__(index)

    def __getstate__(self) -> dict[str, object]:
        state = _ShardReads.__getstate__(self)
        state["audio"] = self._file_reader
        return state
