"""N x M training loader: random fixed-length crops of stage 2's features, fast.

Given a feature store (:mod:`spkflow.train.stores`: stage 2's ``feats.scp`` + ``vad.scp`` +
per-utterance CMVN stats, or shards of them) and a batch list (one batch of N*M utterance ids
per line, :mod:`spkflow.train.batches`), batch ``b`` of epoch ``e`` is a float32 tensor
``[N*M, T, F]`` and the list of its utterance ids, where

* ``T`` is :func:`spkflow.train.batches.crop_frames` ``(seed, e, b, min, max)`` (or a fixed length);
* each utterance contributes one crop of T consecutive frames, taken from its voiced frames
  only when ``use_vad`` (Kaldi's ``select-voiced-frames`` followed by a crop); an utterance
  shorter than T (after VAD) is extended by wrapping around (frames ``0..n-1, 0..``);
* the crop start is drawn from a generator seeded by ``(seed, e, b)`` only, so a batch is
  a pure function of (files, seed, epoch, batch index): resuming at batch k gives the same
  tensors as an uninterrupted run, with any number of workers;
* ``mean_norm="utterance"`` subtracts the mean of the utterance's frames that the frontend
  keeps (voiced, or all), i.e. exactly what :func:`spkflow.features.fbank.apply_frontend` does at
  extraction time, so training crops and test utterances are normalised alike; the mean
  comes from ``cmvn_utt[_voiced].scp`` (written by make_fbank) without reading the whole
  utterance.  ``"crop"`` uses the crop's own mean; ``"none"`` leaves features as they are;
* no masking here: SpecAugment is the model's (``model.specaug``, after input normalisation,
  where a masked value is the training mean); waveform augmentation is the raw path's
  (:mod:`spkflow.train.raw_loader`, :mod:`spkflow.augment.wave`).

Why it is fast (``test/bench/bench_loader.py``): a batch is built inside a DataLoader worker
(``batch_size=None``: the dataset is indexed by batch, not by utterance); every ark file is
memory-mapped once per worker (no system call per read: on this project's VM one costs about
as much as copying a crop) and read at the offsets of the scp; for float matrices only the
rows of the crop are touched (a 1.6 s crop of a 10 s utterance reads 16% of it); compressed
matrices are decoded only for the crop's rows; headers are cached per worker; VAD vectors and
CMVN stats are read in place, without copies.
The batch tensor is made in shared memory, so handing it to the trainer copies nothing, and
those buffers are recycled (:mod:`spkflow.core.shared_batches`, which stage 5 uses too): a fresh
33 MB shared segment per batch cost a worker about as much CPU as reading the crops (page
allocation, zeroing, mapping, unmapping), so the main process keeps a pool of them and sends a
free one along with each batch index.  For a GPU (``pin_memory``) those slots are page-locked once
per epoch instead of each batch being copied into pinned memory by torch's pin thread
(:class:`spkflow.core.shared_batches.PageLocks`), and each batch is held until the device is past
the copy from its slot.
Anchors: WeSpeaker's and voxceleb_trainer's loaders read audio and compute fbank per
utterance per step; ESPnet's ``kaldiio.load_scp`` readers read whole matrices and reopen or
LRU-cache file handles.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from spkflow.core import procs
from spkflow.core.errors import InputError, UtteranceError
from spkflow.core.shared_batches import (
    PREFETCH,
    BufferPool,
    HeldBuffers,
    IndexSampler,
    PageLocks,
    can_pool,
    from_slots,
    shared_empty,
    slot_count,
    to_slots,
)
from spkflow.train.batches import crop_frames
from spkflow.train.stores import ArkStore

__all__ = ["NxMBatches", "NxMCropDataset", "make_loader", "MEAN_NORM_MODES"]

MEAN_NORM_MODES = ("utterance", "crop", "none")
_LOADER_PURPOSE = 0x6C6F6164  # "load": keeps this stream apart from other (seed, epoch, batch) streams


# --------------------------------------------------------------------------- dataset


class NxMBatches(Dataset):
    """What both N x M datasets share (this module's, :mod:`spkflow.train.raw_loader`'s): an
    epoch's batch list indexed by batch, the (seed, epoch) of its crops and their length range,
    the store serving the list (:mod:`spkflow.train.stores`, bound to it with ``serve``), and
    where a batch tensor is written.

    :meth:`batch_tensor` returns a view of the pool buffer sent with the index (see
    :func:`make_loader`), a fresh shared-memory tensor in a worker, or a plain tensor in process.
    Subclasses define :meth:`batch_numel` (the largest batch, for the pool)."""

    def __init__(self, store: Any, batches: Sequence[Sequence[str]], seed: int, epoch: int, crop: Any) -> None:
        self.batches = [list(b) for b in batches]
        self.seed, self.epoch = int(seed), int(epoch)
        self.crop_range = (crop, crop) if isinstance(crop, int) else (int(crop[0]), int(crop[1]))
        if not 1 <= self.crop_range[0] <= self.crop_range[1]:
            raise ValueError(f"crop must be >= 1 frames (min <= max), got {crop}")
        self.store = store.serve(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def crop_length(self, b: int) -> int:
        """Frames of batch ``b``'s crops: :func:`spkflow.train.batches.crop_frames` over the crop range."""
        return crop_frames(self.seed, self.epoch, b, *self.crop_range)

    def batch_numel(self) -> int:
        raise NotImplementedError

    def _hold(self, buffer: torch.Tensor) -> torch.Tensor:
        """Keep the last few pool buffers mapped in this worker (:class:`HeldBuffers`)."""
        held: HeldBuffers | None = getattr(self, "_held", None)
        if held is None:
            held = self._held = HeldBuffers()
        return held.hold(buffer)

    def batch_tensor(self, shape: tuple[int, ...], into: torch.Tensor | None) -> torch.Tensor:
        numel = int(np.prod(shape))
        # In a worker the batch is made in shared memory and filled in place: handing it to the
        # trainer then copies nothing (torch would otherwise move it there, a 33 MB copy).
        if into is not None and into.numel() >= numel:
            return self._hold(into)[:numel].view(shape)
        if torch.utils.data.get_worker_info() is not None:
            return shared_empty(shape)
        return torch.empty(shape)


class NxMCropDataset(NxMBatches):
    """Batch ``b`` -> ``(feats FloatTensor [N*M, T, F], utt_ids list[str])``; see the module doc.

    Parameters
    ----------
    store: a feature store (:mod:`spkflow.train.stores`: :class:`~spkflow.train.stores.ArkStore`
        or :class:`~spkflow.train.stores.FeatureShards`), or the path of a ``feats.scp``, opened
        as an ``ArkStore`` with ``use_vad``, ``vad_scp``, ``cmvn_scp`` and ``access``.
    batches: the epoch's batch list (list of id lists, e.g. from ``read_batch_list``).
    seed, epoch: with the batch index, the only sources of randomness.
    crop: a fixed T, or ``(min_frames, max_frames)`` for :func:`spkflow.train.batches.crop_frames`.
    use_vad: crop voiced frames only (a store's own setting; a path: default True, needs
        ``vad_scp``, default ``vad.scp`` beside feats.scp).
    mean_norm: ``"utterance"`` (or True), ``"crop"``, ``"none"`` (or False).
    cmvn_scp: per-utterance stats for ``"utterance"`` (default: ``cmvn_utt_voiced.scp`` or
        ``cmvn_utt.scp`` beside feats.scp, matching ``use_vad``; without one, whole utterances
        are read to compute the mean).
    access: how feature arks are read, ``"pread"`` (default: one system call per crop, straight
        into the batch, read-ahead off, so no more than the crop is read from disk) or
        ``"mmap"`` (no system call: a little faster when the arks sit in the page cache, but a
        fault on a cold page reads the device's read-ahead around it, 8 MiB on this project's
        VM).  VAD and CMVN arks are always memory-mapped (small, read for every crop, hot).
    """

    def __init__(
        self,
        store: Any,
        batches: Sequence[Sequence[str]],
        *,
        seed: int = 0,
        epoch: int = 0,
        crop: int | tuple[int, int] = (140, 180),
        use_vad: bool | None = None,
        mean_norm: str | bool = "utterance",
        vad_scp: str | os.PathLike[str] | None = None,
        cmvn_scp: str | os.PathLike[str] | None = None,
        access: str = "pread",
    ) -> None:
        mean_norm = {True: "utterance", False: "none"}.get(mean_norm, mean_norm)  # type: ignore[call-overload]
        if mean_norm not in MEAN_NORM_MODES:
            raise ValueError(f"mean_norm must be one of {MEAN_NORM_MODES}, got {mean_norm!r}")
        self.mean_norm = str(mean_norm)
        if isinstance(store, (str, os.PathLike)):
            means = self.mean_norm == "utterance"
            vad = True if use_vad is None else use_vad
            store = ArkStore(store, use_vad=vad, means=means, vad_scp=vad_scp, cmvn_scp=cmvn_scp, access=access)
        elif use_vad is not None and bool(use_vad) != store.use_vad:
            raise ValueError(f"use_vad={use_vad} but the store ({store.name}) was opened with use_vad={store.use_vad}")
        self.use_vad = store.use_vad
        super().__init__(store, batches, seed, epoch, crop)

    def batch_numel(self) -> int:
        """Elements of the largest batch tensor this dataset can make (for buffer pools)."""
        if not self.batches or not self.batches[0]:
            return 0
        return max(len(b) for b in self.batches) * self.crop_range[1] * self.store.dim(self.batches[0][0])

    def __getitem__(self, index: int | tuple[int, torch.Tensor | None]) -> tuple[torch.Tensor, list[str]]:
        """Batch ``index``; or ``(index, buffer)``: the batch is written into the first elements of
        ``buffer`` (a flat float32 tensor in shared memory from :func:`make_loader`'s pool) and
        returned as a view of it."""
        b, into = index if isinstance(index, tuple) else (index, None)
        store = self.store
        store.prepare(b)
        utts = self.batches[b]
        T = self.crop_length(b)
        rng = np.random.default_rng([self.seed, self.epoch, b, _LOADER_PURPOSE])
        rows, kept = zip(*(store.frames(u) for u in utts), strict=True)
        n = np.array([r if k is None else len(k) for k, r in zip(kept, rows, strict=True)], dtype=np.int64)
        if (n == 0).any():
            bad = utts[int(np.flatnonzero(n == 0)[0])]
            raise ValueError(f"utterance '{bad}' has no frames in {store.name}")
        # start in [0, n - T] when the utterance is long enough, else a random rotation of it
        starts = rng.integers(0, np.where(n >= T, n - T + 1, n)).tolist()
        dim = store.dim(utts[0])
        out = self.batch_tensor((len(utts), T, dim), into)
        buf = out.numpy()
        if all(k is None for k in kept) and (n >= T).all():  # the common case: T consecutive rows each
            store.spans(utts, starts, buf)
        else:
            offs = np.arange(T)
            for i, u in enumerate(utts):
                s, ni, k = starts[i], int(n[i]), kept[i]
                pos = s + offs if ni >= T else (s + offs) % ni
                store.gather(u, pos if k is None else k[pos], buf[i], contiguous=k is None and ni >= T)
        means = store.means_of(utts, kept, rows, dim) if self.mean_norm == "utterance" else None
        # torch's broadcast subtraction: half numpy's time on rows of 80 (the same float32 results)
        if means is not None:
            out.sub_(torch.from_numpy(means.astype(np.float32)).unsqueeze(1))
        elif self.mean_norm == "crop":
            out.sub_(torch.from_numpy(buf.mean(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)))
        return out, list(utts)


class _Failed:
    """A batch a worker could not make: the error, sent back as itself (torch would re-raise an
    error whose ``__init__`` takes more than the message as a RuntimeError holding a traceback as text)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Relay(Dataset):
    """``dataset`` as the workers see it: an :class:`InputError`, :class:`UtteranceError` or
    :class:`OSError` (bad input or a file that cannot be read, said by name) comes back to the
    loader's process as a :class:`_Failed` item."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.slots: list[torch.Tensor] = []  # the pool's slots (set before the workers start)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> Any:
        try:
            if isinstance(index, tuple) and isinstance(index[1], int):  # a slot, by number
                b, slot = index
                return to_slots(self.dataset[(b, self.slots[slot])], slot, self.slots[slot])
            return self.dataset[index]
        except (InputError, UtteranceError, OSError) as e:
            return _Failed(e)

    def batch_numel(self) -> int:
        return self.dataset.batch_numel()  # type: ignore[attr-defined]


class _Loader(DataLoader):
    """A DataLoader that raises a worker's :class:`_Failed` error as itself and, with ``pooled``,
    whose workers fill recycled shared-memory buffers (:class:`BufferPool`).  Its workers are
    shut down as soon as iteration stops, by an error or by the caller: they ignore SIGTERM
    (:func:`spkflow.core.procs.worker_init`), so workers left to the garbage collector would make
    the interpreter's exit wait on them for ever."""

    pooled = False
    _slots: list[torch.Tensor] | None = None
    page_locks: PageLocks | None = None  # pooled for a GPU: the slots page-locked each iteration

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        pool = None
        slots: list[torch.Tensor] = []
        if self.pooled:
            sampler: IndexSampler = self.sampler  # type: ignore[assignment]
            relay: _Relay = self.dataset  # type: ignore[assignment]
            numel = relay.batch_numel()
            in_flight = self.num_workers * (self.prefetch_factor or 2)
            if self._slots is None:  # made once, before the workers start (persistent ones keep them)
                self._slots = relay.slots = BufferPool.make_slots(
                    numel, slot_count(self.num_workers, self.prefetch_factor or 2)
                )
            slots = self._slots
            pool = BufferPool(numel, limit=4 * in_flight + 4, slots=slots)
            sampler.pool = pool

        def arriving(it: Iterator[Any]) -> Iterator[Any]:
            for item in it:
                if isinstance(item, _Failed):
                    raise item.error
                if slots:
                    item = from_slots(item, slots)
                if pool is not None:
                    pool.arrived(
                        item[0] if isinstance(item, tuple) and item and isinstance(item[0], torch.Tensor) else None
                    )
                yield item

        it = super().__iter__()  # the workers start and are sent their first indices
        try:
            if self.page_locks is not None and slots:
                yield from self.page_locks.feeding(arriving(it), slots)
            else:
                yield from arriving(it)
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)  # torch's own, as its __del__ calls it
            if shutdown is not None and not self.persistent_workers:
                shutdown()


def make_loader(
    dataset: Dataset,
    *,
    start_batch: int = 0,
    num_workers: int = 2,
    prefetch_factor: int = PREFETCH,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    multiprocessing_context: str | None = None,
    reuse_buffers: bool = True,
) -> DataLoader:
    """A DataLoader over batches ``start_batch, start_batch + 1, ...`` of ``dataset``.

    Each item is ``(feats [N*M, T, F], utt_ids)``.  Batches come in order whatever
    ``num_workers`` is; starting at ``k`` yields exactly batches ``k..`` of an uninterrupted
    run (resume after a checkpoint at step k).  With workers, batch buffers are recycled once
    nothing refers to them any more (``reuse_buffers``; keeping a batch is always safe; only for
    :class:`NxMBatches` datasets, other datasets get a plain DataLoader over the same indices).
    ``pin_memory`` (a GPU's loader): those buffers are page-locked for the copies to the current
    CUDA device (:class:`PageLocks`); where there are none, torch's ``pin_memory`` pins a copy of
    each batch.
    Bad input met in a worker (:class:`InputError`, :class:`UtteranceError`, :class:`OSError`:
    a damaged shard, a missing file) is raised here as itself, one line naming the file.
    """
    if not 0 <= start_batch <= len(dataset):
        raise ValueError(f"start_batch {start_batch} is outside [0, {len(dataset)}]")
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs.update(
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            multiprocessing_context=multiprocessing_context,
            worker_init_fn=procs.worker_init,  # workers die with the trainer, even when it is SIGKILLed
        )
    pooled = num_workers > 0 and reuse_buffers and isinstance(dataset, NxMBatches) and can_pool()
    locked = pooled and pin_memory and torch.cuda.is_available()
    loader = _Loader(
        _Relay(dataset) if num_workers > 0 else dataset,
        batch_size=None,
        sampler=IndexSampler(start_batch, len(dataset)),
        num_workers=num_workers,
        pin_memory=pin_memory and not locked,
        collate_fn=_identity,
        **kwargs,
    )
    loader.pooled = pooled
    if locked:
        loader.page_locks = PageLocks(f"cuda:{torch.cuda.current_device()}")
    return loader


def _identity(x: Any) -> Any:
    return x
