"""Stage 5's job loader: a job's utterances in batches planned by length, read and prepared by
DataLoader worker processes (:func:`job_loader`, what :func:`spkflow.embed.run.run_job` reads and
``test/bench/bench_feed.py`` times without a model).

What it guarantees
------------------
* **Feeding the device.**  Batches are padded in the workers into shared-memory slots the job
  recycles (:mod:`spkflow.core.shared_batches`), on CUDA page-locked once while the workers make
  the first batches, so that no batch is mapped or copied on the host on its way to the device
  (torch's ``pin_memory`` maps and copies each one); with the fbank on the device, a 16-bit WAV or
  FLAC at the model's rate is read straight into its row of the slot
  (:meth:`spkflow.data.audio.AudioReader.open_samples`: the same samples bit for bit, without a
  float32 copy in between; a file that then reads short is read again whole, which names it).
  ESPnet's, WeSpeaker's and SpeechBrain's extraction loaders decode into a new array, then pad
  into a new batch.
* **Errors as data.**  An utterance that cannot be read or prepared comes back as its error
  (source, message), so the job, not the worker, decides: fail naming it, or skip it.
* **Workers as the job runs them.**  Each worker dies with its job and runs one thread in torch,
  OpenMP and BLAS (:mod:`spkflow.core.procs`, :mod:`spkflow.core.threads`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from spkflow.core.errors import UtteranceError
from spkflow.core.procs import die_with_parent
from spkflow.core.shared_batches import (
    PREFETCH,
    BufferPool,
    IndexSampler,
    PageLocks,
    can_pool,
    from_slots,
    slot_count,
    to_slots,
)
from spkflow.core.threads import worker_threads
from spkflow.data.audio import OpenSamples, ReadWhole
from spkflow.data.durations import known_durations
from spkflow.embed.base import Embedder, batch_elements, plan_batches, planned_frames

__all__ = ["job_loader"]

log = logging.getLogger("spkflow.embed.run")  # the job's log: its lines are the job's


class _Inputs:
    """Map-style dataset: index -> ``(utt, input or None, (source, message) or None)``.

    Errors travel as data so the job, not the worker, decides (fail naming the utterance, or
    skip it).  An input that is not finite fails its utterance, unless ``prepare`` says its
    inputs are finite already (``prepare.finite``: audio, which the reader checked)."""

    def __init__(self, utts: Sequence[str], prepare: Callable[[str], np.ndarray], in_place: bool = False) -> None:
        self.utts, self.prepare = list(utts), prepare
        self.checked = bool(getattr(prepare, "finite", False))
        # in_place: an input may stay in its file (prepare.open, spkflow.data.audio.OpenSamples)
        # for PadCollate to read into the batch; only where a file that then reads short is read
        # again whole (_PaddedBatches)
        self.open: Callable[[str], Any] | None = getattr(prepare, "open", None) if in_place else None

    def __len__(self) -> int:
        return len(self.utts)

    def __getitem__(self, i: int) -> tuple[str, Any, tuple[str, str] | None]:
        if self.open is not None:
            x = self.open(self.utts[i])
            if x is not None:
                return self.utts[i], x, None
        return self.read(i)

    def read(self, i: int) -> tuple[str, np.ndarray | None, tuple[str, str] | None]:
        """Item ``i`` with its input read whole (an array)."""
        utt = self.utts[i]
        try:
            x = np.asarray(self.prepare(utt), dtype=np.float32)
        except UtteranceError as exc:
            return utt, None, (exc.source, exc.message)
        except Exception as exc:  # anything else is still this utterance's failure
            return utt, None, ("", f"{type(exc).__name__}: {exc}")
        if not self.checked and not np.all(np.isfinite(x)):
            return utt, None, ("", "input contains NaN or infinite values")
        return utt, x, None


def _collate(items: list[Any]) -> list[Any]:
    return items


def _worker_init(worker_id: int) -> None:
    die_with_parent()  # a SIGKILLed job (the OOM killer) must not leave its workers behind
    worker_threads(worker_id)  # one thread in torch, OpenMP and BLAS: the workers are the parallelism


def job_loader(
    embedder: Embedder,
    data_dir: str | os.PathLike[str],
    utts: Sequence[str],
    *,
    batch_size: int = 32,
    max_frames: int = 60000,
    num_workers: int = 1,
    job_id: int | str = 1,
) -> tuple[Any, bool]:
    """(the loader of a job's inputs, whether its batches are padded in the workers): batches of
    ``utts`` planned by duration; spkflow models get ``(items, parts)`` of :class:`PadCollate`
    (with workers, padded into the slots of a :class:`~spkflow.core.shared_batches.BufferPool`
    the job sends again, page-locked on CUDA; without, pinned on CUDA), other models lists of
    ``(utt, input, error)``.  What :func:`run_job` reads,
    and what ``test/bench/bench_feed.py`` times without a model."""
    from torch.utils.data import DataLoader

    durations = known_durations(data_dir, utts)
    batches = plan_batches(utts, durations, batch_size, max_frames)
    index = {u: i for i, u in enumerate(utts)}
    log.info(
        "job %s: %d batches (at most %d utterances, %d padded frames each); %d DataLoader workers",
        job_id,
        len(batches),
        batch_size,
        max_frames,
        num_workers,
    )
    # spkflow models: padding in the workers (PadCollate) into slots the job recycles (page-locked
    # on CUDA), pinned batches on CUDA without workers; others: lists
    collater = getattr(embedder, "collater", None)
    worker_side = collater is not None and hasattr(embedder, "launch_padded")
    on_cuda = str(getattr(embedder, "device", "cpu")).startswith("cuda")
    pooled = worker_side and num_workers > 0 and can_pool()
    inputs = _Inputs(utts, embedder.preparer(data_dir), in_place=pooled)
    plan = [[index[u] for u in b] for b in batches]
    common: dict[str, Any] = dict(
        num_workers=num_workers,
        pin_memory=on_cuda and worker_side and not pooled,
        worker_init_fn=_worker_init if num_workers > 0 else None,
        prefetch_factor=PREFETCH if num_workers > 0 else None,
    )
    if not pooled:
        collate = collater(max_frames) if worker_side else _collate
        return DataLoader(inputs, batch_sampler=plan, collate_fn=collate, **common), worker_side
    collate = collater(max_frames)
    in_flight = num_workers * common["prefetch_factor"]
    # slots: the workers get them once, batches travel by number; as large as the largest batch
    # planned, within the bound (a 6 s clip in batches of 256 needs 98 MB, not max_frames' worth)
    planned = planned_frames(batches, durations)
    numel = collate.bound if planned is None else min(collate.bound, collate.elements(planned))
    slots = BufferPool.make_slots(numel, slot_count(num_workers, common["prefetch_factor"]))
    pool = BufferPool(numel, limit=in_flight + 4, slots=slots)
    loader = DataLoader(
        _PaddedBatches(inputs, plan, collate, slots), batch_size=None,
        sampler=IndexSampler(0, len(plan), pool), collate_fn=_collate, **common,
    )  # fmt: skip
    locks = PageLocks(str(embedder.device)) if on_cuda and slots else None
    return _Recycled(loader, pool, slots, locks), True


def _open_files() -> int:
    """Files a worker keeps open at once for a batch read in place (the rest of a larger batch is
    read whole): a quarter of this process's file limit, at most 256 (a GPU batch)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 256 if soft == resource.RLIM_INFINITY else max(0, min(256, soft // 4))


_OPEN_FILES = _open_files()


class _PaddedBatches:
    """Batch ``b`` of a job's plan, padded by ``collate`` (:class:`PadCollate`) in the worker
    into the pool buffer sent with its index (a slot of ``slots`` by number); its lengths go back
    as numpy arrays (a tensor would cross in a shared segment of its own)."""

    def __init__(self, inputs: _Inputs, plan: list[list[int]], collate: Any, slots: list[Any]) -> None:
        self.inputs, self.plan, self.collate, self.slots = inputs, plan, collate, slots

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, index: tuple[int, Any]) -> Any:
        b, into = index
        buffer = self.slots[into] if isinstance(into, int) else into
        whole: set[str] = set()  # files that read short in place: read whole, which says why
        while True:
            loaded = [
                self.inputs.read(i) if k >= _OPEN_FILES or self.inputs.utts[i] in whole else self.inputs[i]
                for k, i in enumerate(self.plan[b])
            ]
            try:
                items, parts = self.collate(loaded, buffer)
                break
            except ReadWhole as e:
                whole.add(e.utt)
            finally:
                for _, x, _ in loaded:
                    if isinstance(x, OpenSamples):
                        x.close()
        batch = (items, [(keys, feats, lengths.numpy()) for keys, feats, lengths in parts])
        return to_slots(batch, into, buffer) if isinstance(into, int) else batch


class _Recycled:
    """The job's loader, telling its pool each batch that comes back (in its order): its slots
    turned back into views, its lengths into tensors.  With ``locks`` (CUDA), the slots are
    page-locked while the workers make the first batches, each batch is held until the device is
    past it (:meth:`PageLocks.hold`), and the slots are released when the loop ends."""

    def __init__(self, loader: Any, pool: BufferPool, slots: list[Any], locks: PageLocks | None = None) -> None:
        self.loader, self.pool, self.slots, self.locks = loader, pool, slots, locks

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        import torch

        def arriving(batches: Iterator[Any]) -> Iterator[Any]:
            for batch in batches:
                items, parts = from_slots(batch, self.slots) if self.slots else batch
                parts = [(keys, feats, torch.as_tensor(lengths)) for keys, feats, lengths in parts]
                self.pool.arrived(parts[0][1] if parts else None, needed=batch_elements((items, parts)))
                yield items, parts

        batches = arriving(iter(self.loader))  # the workers start and are sent their first indices
        if self.locks is None:
            yield from batches
        else:
            yield from self.locks.feeding(batches, self.slots)
