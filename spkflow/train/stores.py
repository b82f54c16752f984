"""Where the N x M datasets read: one interface over the four kinds of training storage.

Whether a crop is made of features or of audio is the dataset's business
(:class:`~spkflow.train.loader.NxMCropDataset`, :class:`~spkflow.train.raw_loader.NxMWaveDataset`);
where the bytes lie is the store's:

=====================  ===============================================  ==============================
store                  reads                                            written by
=====================  ===============================================  ==============================
:class:`ArkStore`      stage 2's arks (feats.scp, vad.scp, cmvn stats)  ``make_fbank.sh``
:class:`FeatureShards` shards of every frame, or of the voiced frames   ``make_shards.sh [--voiced]``
:class:`AudioFiles`    a data dir's audio files (wav.scp)               stage 1
:class:`AudioShards`   shards of those files, as stored                 ``make_shards.sh --audio true``
=====================  ===============================================  ==============================

Every store answers the same questions: ``name`` (the file that lists it, for messages),
``has(utt)``, ``serve(batches)`` (the store bound to one epoch's batch list, every utterance
checked: an :class:`~spkflow.core.errors.InputError` naming the store's list, the utterance and
its batch list line), ``prepare(b)`` (before batch ``b`` in this process) and ``release()``
(drop what it holds).  Feature stores then read ``frames(utt)`` (rows, and the rows a crop may
take), ``gather``, ``mean`` and ``dim``; audio stores ``read(utt)`` and ``source(utt)``.
:func:`open_store` opens the one a training config asks for.

Audio files are read by span: :meth:`AudioFiles.samples` gives the raw loader an utterance's
length from its file's header, and each crop reads only the samples it covers, by seeking (WAV
and FLAC at the loader's rate, ``segments`` included: where libsndfile's seek is exact; anything
else is decoded whole).  The rule for the per-process decoded-audio cache
(:data:`spkflow.augment.wave.AUDIO_CACHE`): a file in it is cropped from memory; a file not in it
is decoded whole and kept while the cache has room for it without dropping anything (a set that
fits, the demo's, is decoded once per worker), else read by span and not kept, so a training set
larger than the cache costs a span read per crop instead of a decode, a quantisation and an
eviction per crop; what is decoded whole (babble and RIR sources, audio to resample or decompress
whole, shards) fills it too.

Arks and audio files are random access: ``prepare`` does nothing.  Shards are read front to
back: ``prepare(b)`` follows the batch list, so it knows which shards batch ``b`` needs and which
batches this process will serve (the trainer's, or a DataLoader worker's ``b0, b0 + W, ...``):
it drops the shards no later batch of this process needs, loads (one sequential read of the
whole file, every member checked against its crc32, :func:`spkflow.data.shards.load_shard`)
those ``b`` needs, and has a thread read ahead, in order of first use, up to ``prefetch``
shards.  With batch lists from :mod:`spkflow.train.shard_plan` (windows of ``pool`` shards) a
process holds at most ``pool`` shards plus those read ahead, and reads each once per epoch; a
batch needing more than ``max_shards`` (a list planned for random access) is refused when the
store is bound to the list.  A shard's feature member is the ark's record byte for byte (or its
voiced rows, each row as stored), decoded by the same code (:class:`spkflow.data.ark.MemoryArks`),
so every store gives the same crops bit for bit.

What this guarantees that the anchors do not.  WeSpeaker's data pipeline is one chain of
processors whose first links are the storage (``url_opener`` + ``tar_file_and_group`` for
shards, ``parse_raw``, ``parse_feat``), then a shuffle buffer: a batch depends on everything read
before it (no resume inside an epoch, no batch equal across runs or storage kinds), and a tar
member that fails to decode is skipped with a warning.  lhotse's samplers know no storage (they
only see manifests); its Shar readers, like WebDataset, stream shards through a buffer too.  Here:

* a batch is a pure function of (files, seed, epoch, batch index), whatever the storage, the
  number of workers or where a run resumed: storage only changes the order of reads, and the
  store's ``prepare`` follows the stage-3 batch list (a resume at batch k reads only what batch
  k onward needs);
* the four stores give the same batches bit for bit (``test/train/test_stores.py``: arks, shards,
  voiced shards; audio files, audio shards);
* a crop read by span is the whole file decoded then indexed, bit for bit, and its start is drawn
  from the header's length: a batch is the same whether its files were read by span, from the
  cache or whole (``test/train/test_raw_loader.py``).  WeSpeaker decodes each file whole for every
  crop (``parse_raw``, then ``random_chunk``); SpeechBrain's VoxCeleb recipe reads only the crop
  (``torchaudio.load`` with ``frame_offset``) but draws its start with Python's ``random`` from
  the duration its CSV recorded, at 16 kHz whatever the file's rate, and without a VAD;
* a damaged shard is a loud error naming the shard and the member (a crc32 per member, checked
  as it is read), never a skipped utterance: skipping would change the batch (it would no longer
  equal the arks' batch of the same list, and a resumed run would differ from an uninterrupted
  one), and Kaldi's and WeSpeaker's users expect a corrupt input to stop the run; the fix, a
  rerun of ``make_shards.sh``, rewrites only the damaged shard.

Memory and workers as the loaders describe (shared-memory batch buffers recycled by
:func:`spkflow.train.loader.make_loader`); a store is picklable (a spawned worker starts with
nothing in memory) and fork-safe (a forked worker drops what it inherited and reads its own).
"""

from __future__ import annotations

import concurrent.futures
import copy
import os
import tarfile
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spkflow.augment.wave import AUDIO_CACHE
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.ark import ArkRecords, KaldiArkReader, MemoryArks, parse_header
from spkflow.data.audio import AudioReader, FileSpan, decode_audio_bytes
from spkflow.data.resample import resample
from spkflow.data.shards import Shard, ShardSet
from spkflow.data.tables import read_kv
from spkflow.data.voiced import voiced_frames
from spkflow.features.fbank import FbankOptions

__all__ = [
    "ArkStore",
    "AudioFiles",
    "AudioShards",
    "FeatureShards",
    "FileCrops",
    "InMemory",
    "check_batches",
    "open_store",
]


def check_batches(batches: Sequence[Sequence[str]], *tables: tuple[Container[str], str]) -> None:
    """Every utterance of ``batches`` is in each ``(table, its file)``; else an :class:`InputError`
    naming the file, the utterance and its batch (line of the batch list)."""
    for b, batch in enumerate(batches):
        for u in batch:
            for table, name in tables:
                if u not in table:
                    raise InputError(
                        name, None, f"utterance '{u}' of batch {b} (line {b + 1} of the batch list) is not here"
                    )


class _Features:
    """The reads of a feature store over three record sets: ``feats``, ``vad`` (when the crops
    take voiced frames only) and ``cmvn`` (per-utterance statistics, when there are some)."""

    name: str
    use_vad: bool
    feats: ArkRecords
    vad: ArkRecords | None
    cmvn: ArkRecords | None

    def _all_kept(self, utt: str) -> bool:
        """Whether every stored row of ``utt`` is one a crop may take (shards of voiced frames)."""
        return False

    def frames(self, utt: str) -> tuple[int, np.ndarray | None]:
        """(rows stored, the indices of the rows a crop may take; None: all of them)."""
        rows = self.feats.num_rows(utt)
        if self.vad is None or self._all_kept(utt):
            return rows, None
        v = self.vad.plain_view(utt, "FV", rows)
        if v is None:
            v = self.vad.read(utt, cache_header=False)
            if len(v) != rows:
                raise ValueError(f"'{utt}': {len(v)} VAD frames in {self.vad.scp} but {rows} feature frames")
        return rows, voiced_frames(v)

    def gather(self, utt: str, frames: np.ndarray, out: np.ndarray, contiguous: bool = False) -> None:
        """``out[:] = features[frames]`` (:meth:`spkflow.data.ark.ArkRecords.gather`)."""
        self.feats.gather(utt, frames, out, contiguous=contiguous)

    def mean(self, utt: str, kept: np.ndarray | None, rows: int, dim: int) -> np.ndarray:
        """The mean (float64) of the rows a crop may take: from the stored statistics when there
        are some, else computed from those rows."""
        if self.cmvn is not None:
            s = self.cmvn.plain_view(utt, "DM", 2, dim + 1)
            if s is None and utt in self.cmvn:
                s = self.cmvn.read(utt, cache_header=False).reshape(2, -1)
            if s is not None:
                return s[0, :dim] / s[0, dim]
        full = self.feats.rows_view(utt, 0, rows)
        return (full if kept is None else full[kept]).mean(axis=0, dtype=np.float64)

    def spans(self, utts: Sequence[str], starts: Sequence[int], out: np.ndarray) -> None:
        """``out[j]`` = the rows ``starts[j] :`` of ``utts[j]`` (:meth:`spkflow.data.ark.ArkRecords.spans_into`)."""
        self.feats.spans_into(utts, starts, out)

    def means_of(
        self, utts: Sequence[str], kept: Sequence[np.ndarray | None], rows: Sequence[int], dim: int
    ) -> np.ndarray:
        """:meth:`mean` of each of ``utts`` ([len(utts), dim] float64), the stored statistics
        gathered for the whole batch at once."""
        out = np.empty((len(utts), dim), dtype=np.float64)
        found = np.zeros(len(utts), dtype=bool)
        if self.cmvn is not None:
            stats, found = self.cmvn.plain_stack(utts, "DM", 2, dim + 1)
            counts = np.where(found, stats[:, 0, dim], 1.0)
            np.divide(stats[:, 0, :dim], counts[:, None], out=out)
        for j in np.flatnonzero(~found).tolist():
            out[j] = self.mean(utts[j], kept[j], rows[j], dim)
        return out

    def dim(self, utt: str) -> int:
        """The feature dimension (that of ``utt``)."""
        h = self.feats.header(utt)
        return h.cols if h is not None else self.feats.read(utt).shape[1]


def _sibling(scp: str | os.PathLike[str], name: str) -> Path | None:
    p = Path(scp).parent / name
    return p if p.is_file() else None


class ArkStore(_Features):
    """Stage 2's features by random access: ``feats.scp`` (``access``: ``"pread"``, one system
    call per crop straight into the batch, read-ahead off; or ``"mmap"``), with ``use_vad`` its
    ``vad.scp`` (default: beside it), with ``means`` its per-utterance statistics
    (``cmvn_utt_voiced.scp`` or ``cmvn_utt.scp`` beside it, matching ``use_vad``; without one a
    mean is computed from the rows).  VAD and statistics are memory-mapped (small, hot)."""

    def __init__(
        self,
        feats_scp: str | os.PathLike[str],
        *,
        use_vad: bool = True,
        means: bool = True,
        vad_scp: str | os.PathLike[str] | None = None,
        cmvn_scp: str | os.PathLike[str] | None = None,
        access: str = "pread",
    ) -> None:
        self.feats = KaldiArkReader(feats_scp, access=access)
        self.name = self.feats.scp
        self.use_vad = bool(use_vad)
        self.vad = None
        if self.use_vad:
            path = vad_scp or _sibling(self.name, "vad.scp")
            if path is None:
                raise InputError(
                    Path(self.name).parent / "vad.scp",
                    None,
                    "use_vad needs a vad.scp (from make_fbank.sh); pass vad_scp or use_vad=False",
                )
            self.vad = KaldiArkReader(path)
        self.cmvn = None
        if means:
            path = cmvn_scp or _sibling(self.name, "cmvn_utt_voiced.scp" if self.use_vad else "cmvn_utt.scp")
            self.cmvn = KaldiArkReader(path) if path is not None else None

    def has(self, utt: str) -> bool:
        return utt in self.feats

    def serve(self, batches: Sequence[Sequence[str]]) -> ArkStore:
        check_batches(batches, (self.feats, self.name), *([(self.vad, self.vad.scp)] if self.vad is not None else []))
        return self

    def prepare(self, b: int) -> None:
        """Nothing to do: random access."""

    def release(self) -> None:
        self.feats.close()

    def describe(self) -> str:
        return f"{self.name}, random access"


class _ShardCache:
    """Which shards each batch of a list needs, and, before batch ``b`` in this process, which to
    drop, load and read ahead (see the module doc).  Holds the loaded :class:`Shard` objects."""

    def __init__(
        self,
        shards: ShardSet,
        batches: Sequence[Sequence[str]],
        known_utts: Mapping[str, str] | None,
        max_shards: int,
        prefetch: int | None,
    ) -> None:
        self.shards, self.known = shards, known_utts
        u2s = shards.utt2shard
        check_batches(batches, (u2s, shards.list_path))
        self.needs = [tuple(sorted({u2s[u] for u in batch})) for batch in batches]
        widest = max((len(n) for n in self.needs), default=0)
        if widest > max_shards:
            raise InputError(
                shards.list_path,
                None,
                f"a batch needs {widest} shards, more than the {max_shards} the loader holds: "
                "plan the batch lists for shards (stage 3 with --train_shards true)",
            )
        self.max_shards = max(widest, 1)
        self.prefetch = self.max_shards if prefetch is None else int(prefetch)
        self.peak = 0  # most shards loaded or being read at once
        self.reads = 0  # shards read so far
        self._reset()

    def _reset(self) -> None:
        """Nothing in memory, nothing planned (a new process)."""
        self.loaded: dict[int, Shard] = {}
        self.pending: dict[int, concurrent.futures.Future[Shard]] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._served: tuple[int, int] | None = None  # (first batch, step) of this process's batches
        self._first_use: list[int] = []  # shards in the order this process's batches need them
        self._last_use: dict[int, int] = {}
        self._next = 0

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker starts with no shard in memory
        state = self.__dict__.copy()
        state.update(loaded={}, pending={}, _executor=None, _pid=-1, _served=None)
        return state

    def _plan(self, b: int) -> None:
        """This process serves batches ``b, b + step, ...`` (step: the DataLoader's workers)."""
        info = torch.utils.data.get_worker_info()
        step = info.num_workers if info is not None else 1
        self._served = (b, step)
        self._first_use, self._last_use, seen = [], {}, set()
        for k in range(b, len(self.needs), step):
            for s in self.needs[k]:
                if s not in seen:
                    seen.add(s)
                    self._first_use.append(s)
                self._last_use[s] = k
        self._next = 0

    def _read(self, i: int) -> None:
        if i not in self.loaded and i not in self.pending:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1)
            self.pending[i] = self._executor.submit(self.shards.load, i, self.known)
            self.peak = max(self.peak, len(self.loaded) + len(self.pending))

    def prepare(self, b: int) -> tuple[list[tuple[int, Shard]], list[tuple[int, Shard]]]:
        """Before batch ``b``: (the shards dropped, the shards loaded), as (index, shard)."""
        if self._pid != os.getpid():  # a forked worker: what it inherited is the parent's
            self._reset()
        st = self._served
        if st is None or b < st[0] or (b - st[0]) % st[1]:
            self._plan(b)
        dropped = [(s, self.loaded.pop(s)) for s in list(self.loaded) if self._last_use.get(s, -1) < b]
        loaded = []
        for s in self.needs[b]:
            if s not in self.loaded:
                self._read(s)
                self.loaded[s] = self.pending.pop(s).result()
                self.reads += 1
                loaded.append((s, self.loaded[s]))
        while self._next < len(self._first_use) and self._first_use[self._next] in self.loaded:
            self._next += 1
        k = self._next  # read ahead in order of first use, within the bound
        while k < len(self._first_use) and len(self.loaded) + len(self.pending) < self.max_shards + self.prefetch:
            self._read(self._first_use[k])
            k += 1
        return dropped, loaded

    def release(self) -> list[tuple[int, Shard]]:
        """Drop every loaded shard (those being read ahead are dropped when they arrive)."""
        dropped = list(self.loaded.items())
        self.loaded, self.pending, self._served = {}, {}, None
        return dropped


def _open_shards(
    store: Any, shards: ShardSet | str | os.PathLike[str], known: Mapping[str, str] | None, most: int, ahead: int | None
) -> None:
    """What both shard stores hold: the set, checked (:class:`ShardSet`), and how to read it."""
    store.shards = shards if isinstance(shards, ShardSet) else ShardSet(shards)
    store.name = store.shards.list_path
    store.known, store.max_shards, store.prefetch_shards = known, int(most), ahead
    store.reads = None  # a _ShardCache once bound to a batch list (serve)


def _bound(store: Any, batches: Sequence[Sequence[str]]) -> Any:
    """A copy of a shard store bound to ``batches`` (its reads planned, nothing in memory)."""
    bound = copy.copy(store)
    bound.reads = _ShardCache(store.shards, batches, store.known, store.max_shards, store.prefetch_shards)
    return bound


def _describe(store: Any) -> str:
    s = store.shards
    held = f", at most {store.reads.max_shards} in use per batch" if store.reads is not None else ""
    return f"shards, front to back: {len(s)} shards ({sum(s.bytes) / 1e6:.1f} MB) in {s.list_path}{held}"


def _reads(store: Any) -> _ShardCache:
    if store.reads is None:
        raise RuntimeError(f"{store.name}: serve(batches) first (a shard store follows a batch list)")
    return store.reads


class FeatureShards(_Features):
    """Features from shards read front to back (see the module doc): of every frame
    (``make_shards.sh --voiced false``: ``feats``, ``vad``, ``cmvn`` members) or of the frames the
    VAD keeps (``feats_voiced``, ``cmvn_voiced``; a crop may take all of them).  ``use_vad`` and
    ``means`` as :class:`ArkStore`; ``known_utts``: the training data dir's utt2spk, which every
    loaded shard is checked against; ``max_shards``: the most shards one batch may need;
    ``prefetch``: shards read ahead (default: as many as one batch may need)."""

    def __init__(
        self,
        shards: ShardSet | str | os.PathLike[str],
        *,
        use_vad: bool = True,
        means: bool = True,
        known_utts: Mapping[str, str] | None = None,
        max_shards: int = 16,
        prefetch: int | None = None,
    ) -> None:
        _open_shards(self, shards, known_utts, max_shards, prefetch)
        self.use_vad, self.means = bool(use_vad), bool(means)
        self._records()

    def _records(self) -> None:
        self.feats = MemoryArks(f"{self.name} (feats)")
        self.vad = MemoryArks(f"{self.name} (vad)") if self.use_vad else None
        self.cmvn = MemoryArks(f"{self.name} (cmvn)") if self.means else None
        self.voiced: set[str] = set()  # utterances whose stored rows are their voiced frames only
        self._pid = os.getpid()

    def has(self, utt: str) -> bool:
        return utt in self.shards.utt2shard

    def serve(self, batches: Sequence[Sequence[str]]) -> FeatureShards:
        bound = _bound(self, batches)
        bound._records()
        return bound

    def _all_kept(self, utt: str) -> bool:
        return utt in self.voiced

    def _add(self, i: int, shard: Shard) -> None:
        path = self.shards.path(i)
        voiced = shard.offsets.get("feats_voiced", {})
        if voiced and not self.use_vad:
            raise InputError(
                path,
                None,
                "holds the voiced frames only ('feats_voiced'): training without the VAD (frontend.vad: false) "
                "needs shards of every frame (make_shards.sh --voiced false)",
            )
        feats = {**shard.offsets.get("feats", {}), **voiced}  # a voiced utterance's rows are all kept
        if len(feats) != len(shard.utts):
            raise InputError(path, None, "has no feature member for every utterance: a shard of audio files?")
        vad = shard.offsets.get("vad", {})
        if self.vad is not None and len(vad) != len(shard.utts) - len(voiced):
            raise InputError(path, None, "has no 'vad' member for every utterance (write the shards again)")
        self.feats.add(i, path, shard.data, feats)
        if self.vad is not None:
            self.vad.add(i, path, shard.data, vad)
        if self.cmvn is not None:
            self.cmvn.add(i, path, shard.data, shard.offsets.get("cmvn_voiced" if self.use_vad else "cmvn", {}))
        self.voiced.update(voiced)

    def _drop(self, i: int, shard: Shard) -> None:
        for records in (self.feats, self.vad, self.cmvn):
            if records is not None:
                records.drop(i)
        self.voiced.difference_update(shard.utts)

    def prepare(self, b: int) -> None:
        if self._pid != os.getpid():  # a forked worker: the parent's records are not this process's
            self._records()
        dropped, loaded = _reads(self).prepare(b)
        for i, shard in dropped:
            self._drop(i, shard)
        for i, shard in loaded:
            self._add(i, shard)

    def release(self) -> None:
        for i, shard in _reads(self).release():
            self._drop(i, shard)

    def describe(self) -> str:
        return _describe(self)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["voiced"], state["_pid"] = set(), -1  # the records' buffers stay too (MemoryArks)
        return state

    def dim(self, utt: str) -> int:
        """The feature dimension: from the record in memory, or (before any shard is loaded: the
        batch buffers are sized first) the header of the first feature member of ``utt``'s shard,
        a few kilobytes at its front, not a scan of the shard (each read a round trip)."""
        if utt in self.feats:
            return super().dim(utt)
        path = self.shards.path(self.shards.utt2shard[utt])
        try:
            with tarfile.open(path, mode="r:") as tar:
                member = next(m for m in tar if m.name.endswith((".feats", ".feats_voiced")))
                f = tar.fileobj
                assert f is not None
                f.seek(member.offset_data)
                h = parse_header(f.read(32), 0)
        except (OSError, tarfile.TarError, StopIteration) as e:
            raise InputError(path, None, f"no readable feature member ({e or 'none found'})") from None
        return h.cols if h is not None else 1


class InMemory:
    """An utterance's samples held whole (decoded): ``len`` and :meth:`take`, as :class:`FileCrops`."""

    def __init__(self, wave: np.ndarray) -> None:
        self.wave = wave

    def __len__(self) -> int:
        return len(self.wave)

    def take(self, positions: np.ndarray) -> np.ndarray:
        """``wave[positions]`` (float32)."""
        return self.wave[positions]


class FileCrops:
    """An utterance's samples left in its file (:meth:`AudioFiles.samples`): ``len`` from the
    header; :meth:`take` reads the one contiguous span from the smallest position asked to the
    largest (:meth:`spkflow.data.audio.AudioReader.read_span`), the same float32 values as the
    whole file decoded then indexed."""

    def __init__(self, reader: AudioReader, utt: str, span: FileSpan) -> None:
        self.reader, self.utt, self.span = reader, utt, span

    def __len__(self) -> int:
        return self.span.frames

    def take(self, positions: np.ndarray) -> np.ndarray:
        lo, hi = int(positions.min()), int(positions.max()) + 1
        return self.reader.read_span(self.utt, self.span, lo, hi)[positions - lo]


class AudioFiles:
    """A data dir's audio files (``wav.scp``, optional ``segments``) at ``sample_rate``, read by
    :class:`spkflow.data.audio.AudioReader`.

    :meth:`samples` (what the raw loader crops) follows one rule: an utterance in the
    per-process decoded-audio cache (:data:`spkflow.augment.wave.AUDIO_CACHE`) is cropped from
    memory; one that is not, in a file whose samples can be read exactly by seeking (WAV or
    FLAC, PCM or float, at ``sample_rate``: :attr:`FileSpan.exact`; with or without
    ``segments``), is decoded whole and kept while the cache has room for it without dropping
    anything, else left in its file: its length comes from the header and each crop reads only
    the samples it spans, without entering the cache (a training set larger than the cache no
    longer evicts and decodes a whole file per crop); anything else (a rate to resample, MP3 /
    OGG / m4a, a ``cmd |`` pipe, an ark entry; or ``span_reads=False``) is decoded whole through
    the cache, as :meth:`read` does.  Either way a crop has the same
    samples bit for bit (``test/train/test_raw_loader.py``)."""

    def __init__(self, data_dir: str | os.PathLike[str], sample_rate: int, *, span_reads: bool = True) -> None:
        self.audio = AudioReader(data_dir, sample_rate=int(sample_rate))
        self.sample_rate = int(sample_rate)
        self.span_reads = bool(span_reads)
        self.name = str(Path(data_dir) / "wav.scp")
        spk = Path(data_dir) / "utt2spk"
        self.speakers: Mapping[str, str] = read_kv(spk) if spk.is_file() else {}

    def has(self, utt: str) -> bool:
        return utt in self.audio

    def serve(self, batches: Sequence[Sequence[str]]) -> AudioFiles:
        check_batches(batches, (self.audio, self.name))
        return self

    def prepare(self, b: int) -> None:
        """Nothing to do: random access."""

    def release(self) -> None:
        """Nothing held but the cache of decoded audio (bounded, shared by the process)."""

    def describe(self) -> str:
        return f"{self.name}, random access"

    def source(self, utt: str) -> str:
        return self.audio.source(utt)

    def read(self, utt: str) -> np.ndarray:
        """The whole waveform of ``utt`` (through :data:`AUDIO_CACHE`)."""
        return AUDIO_CACHE.read(self.audio, utt)

    def samples(self, utt: str) -> InMemory | FileCrops:
        """The samples of ``utt`` as a crop takes them, by the rule of the class doc."""
        wave = AUDIO_CACHE.get(self.audio, utt)
        if wave is not None:
            return InMemory(wave)
        span = self.audio.file_span(utt) if self.span_reads else None
        if span is None or not span.exact or span.rate != self.sample_rate or AUDIO_CACHE.has_room_for(span.frames):
            return InMemory(self.read(utt))  # decoded whole (and kept while the cache has room: float32 at most)
        if span.frames <= 0:
            raise UtteranceError(utt, self.source(utt), "audio has no samples")
        return FileCrops(self.audio, utt, span)


class _ShardAudio:
    """The reader :data:`AUDIO_CACHE` asks (``source``, ``sample_rate``, ``read``) over the audio
    members of the shards in memory, decoded as :class:`AudioReader` decodes the same files."""

    def __init__(self, store: AudioShards) -> None:
        self.store = store
        self.sample_rate = store.sample_rate

    def source(self, utt: str) -> str:
        return self.store.source(utt)

    def read(self, utt: str) -> np.ndarray:
        reads = _reads(self.store)
        i = self.store.shards.utt2shard[utt]
        shard = reads.loaded.get(i)
        if shard is None:
            raise RuntimeError(f"{self.source(utt)} is not in memory (prepare(b) first)")
        field = shard.audio_field(utt)
        if field is None:
            raise InputError(self.store.shards.path(i), None, f"'{utt}' has no audio member: a shard of features?")
        wave, rate = decode_audio_bytes(shard.payload(utt, field), utt, f"{self.source(utt)}.{field}")
        return resample(wave, rate, self.sample_rate)


class AudioShards:
    """The audio files of :class:`AudioFiles` from shards read front to back (``make_shards.sh
    --audio true``; the module doc); parameters as :class:`FeatureShards`."""

    def __init__(
        self,
        shards: ShardSet | str | os.PathLike[str],
        sample_rate: int,
        *,
        known_utts: Mapping[str, str] | None = None,
        max_shards: int = 16,
        prefetch: int | None = None,
    ) -> None:
        _open_shards(self, shards, known_utts, max_shards, prefetch)
        self.sample_rate = int(sample_rate)
        self.speakers: Mapping[str, str] = known_utts or {}

    def has(self, utt: str) -> bool:
        return utt in self.shards.utt2shard

    def serve(self, batches: Sequence[Sequence[str]]) -> AudioShards:
        return _bound(self, batches)

    def prepare(self, b: int) -> None:
        _reads(self).prepare(b)

    def release(self) -> None:
        _reads(self).release()

    def describe(self) -> str:
        return _describe(self)

    def source(self, utt: str) -> str:
        return f"{self.shards.path(self.shards.utt2shard[utt])}:{utt}"

    def read(self, utt: str) -> np.ndarray:
        return AUDIO_CACHE.read(_ShardAudio(self), utt)

    def samples(self, utt: str) -> InMemory:
        """The samples of ``utt`` as a crop takes them: decoded whole from its shard (through the cache)."""
        return InMemory(self.read(utt))


def open_store(
    cfg: Mapping[str, Any],
    train_data: str,
    train_feats: str,
    *,
    known_utts: Mapping[str, str] | None = None,
    shards: ShardSet | None = None,
) -> ArkStore | FeatureShards | AudioFiles | AudioShards:
    """The store a normalised training config reads: audio (``frontend.feats_type: raw``) or
    features, from ``<train_feats>/shards`` (``train.shards``; ``shards``: that set, opened
    already) or by random access (``<train_feats>/feats.scp``, ``<train_data>``'s audio)."""
    fe = cfg["frontend"]
    if not cfg["train"].get("shards"):
        shards = None
    elif shards is None:
        shards = ShardSet(os.path.join(train_feats, "shards", "shards.list"))
    if fe["feats_type"] == "raw":
        rate = int(
            (FbankOptions.from_dict(fe["fbank"]) if fe["fbank"] else FbankOptions()).sample_frequency
        )  # as the dataset
        if shards is not None:
            return AudioShards(shards, rate, known_utts=known_utts)
        return AudioFiles(train_data, rate)
    use_vad, means = bool(fe["vad"]), bool(fe["mean_norm"])
    if shards is not None:
        return FeatureShards(shards, use_vad=use_vad, means=means, known_utts=known_utts)
    # mapped, as the trainer read them before stores (one reader shared by the epochs): the arks of
    # a training set usually sit in the page cache after the first epoch
    return ArkStore(os.path.join(train_feats, "feats.scp"), use_vad=use_vad, means=means, access="mmap")
