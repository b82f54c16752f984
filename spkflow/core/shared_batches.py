"""Batches handed from DataLoader workers to the main process through shared memory, uncopied,
in buffers that are used again.

A worker that makes a batch in its own memory has torch copy every byte into a fresh shared
segment to hand it over; a worker that makes it in a fresh shared segment (:func:`shared_empty`)
saves the copy but still pays for the segment: its pages are faulted in and zeroed when first
written, then unmapped (stage 5 from WAV on two workers: -19 % CPU per utterance with the pool,
docs/gpu.md "Stage 5's batches in recycled buffers", with the command).
So the main process keeps a :class:`BufferPool` and sends a free buffer along with each batch
index; the worker fills it (keeping the last few mapped, :class:`HeldBuffers`) and the batch comes
back in it.

What a buffer being free means: it is not on its way through a worker (sent and not yet back),
and nothing outside the pool refers to its storage (the storage's reference count), so a batch
the caller keeps is never overwritten.  Batches come back in the order their indices were sent;
should torch ever hand a batch back in a storage other than the one sent with it (its mapping
cache missed, so the caller's tensor is a second mapping the count cannot see), reuse stops
for the rest of the epoch instead of guessing.  A batch that needed more than its buffer (made
in a fresh segment) makes the pool's buffers larger, unless the pool has slots (below: those stay,
and such a batch, a lone utterance over stage 5's frame bound, keeps a segment of its own).  PyTorch's
DataLoader, ESPnet's, WeSpeaker's and SpeechBrain's loaders allocate a new segment per batch.

Slots: a buffer sent with an index travels as a file descriptor (torch's sharing: a connection to
the sender's resource sharer, both ways, per batch).  When the buffers' size is known before the
workers start, the pool makes its first ones then (:meth:`BufferPool.make_slots`); the workers get
them once, with the dataset, and a batch in a slot goes out as the slot's number and comes back as
a :class:`InSlot` the main process turns into a view of its own buffer (:func:`from_slots`): no
descriptor either way (the trainer's loader on arks, with the loader's torch subtraction of the
means: -21 % CPU per crop, +54 % crops/s; docs/gpu.md "Slots", with its command).  Stage 5 sizes
its slots by its planner's frame bound.

Page-locked slots (:class:`PageLocks`, stage 5 on CUDA): torch's ``pin_memory`` has a thread of
the main process map each batch's fresh segment and copy it into pinned memory (on an H200 with
batches of 256 x 6 s, 98 MB a batch: the mapping alone took 28 ms, under the interpreter the model's
launches need; docs/gpu.md "The second check").  Stage 5's slots are instead registered once with
CUDA as page-locked (``cudaHostRegister``), in a thread of their own while the workers make the
first batches and the job takes them, so a batch is neither mapped nor copied on the host: the
copy to the device reads the slot itself, asynchronously (a slot not registered yet is copied as
ordinary memory).  A slot stays busy while a tensor refers to it, so the loader holds each batch
it handed over until the device has done what was queued when its caller asked for the next
(:meth:`PageLocks.hold`, a CUDA event): the copy from the slot, however far the caller runs ahead
of the device.  Training (:mod:`spkflow.train.loader`) uses the same slots.  PyTorch's DataLoader,
ESPnet's, WeSpeaker's and SpeechBrain's loaders pin a copy of every batch.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

#: batches a DataLoader worker of stage 5 or of training makes ahead (torch's ``prefetch_factor``)
PREFETCH = 4

#: pool buffers a worker keeps mapped (torch's mapping cache finds them when they come back)
HELD = 16


def shared_empty(shape: tuple[int, ...]) -> Any:
    """An uninitialised float32 torch tensor in shared memory, allocated there directly (measured:
    a third less CPU per training batch than ``torch.empty(...).share_memory_()``, which copies)."""
    import torch

    nbytes = 4 * math.prod(shape)
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)  # what torch.multiprocessing uses
        return torch.empty(0, dtype=torch.float32).set_(storage).view(shape)
    except (AttributeError, RuntimeError, TypeError):
        return torch.empty(shape, dtype=torch.float32).share_memory_()


def slot_count(num_workers: int, prefetch_factor: int = PREFETCH) -> int:
    """Slots a loader makes: one per batch in flight (``prefetch_factor`` a worker), one for the
    batch just handed over and one for the batch the caller still holds.  A buffer comes round
    again every this many batches, so a worker writes each batch into memory that has left its
    caches (10 x 8 MB for two workers' training batches, 2-core VM: 32 MB of L3)."""
    return num_workers * prefetch_factor + 2


def can_pool() -> bool:
    """Whether this torch build exposes the storage reference count the pool relies on."""
    import torch

    return hasattr(torch._C, "_storage_Use_Count")


class HeldBuffers:
    """A worker's side: the last :data:`HELD` pool buffers it filled stay referenced, so torch
    finds their mapping in its cache when the same buffer comes back instead of mapping it again."""

    def __init__(self) -> None:
        self._held: collections.OrderedDict[int, Any] = collections.OrderedDict()

    def hold(self, buffer: Any) -> Any:
        key = buffer.untyped_storage().data_ptr()
        self._held[key] = buffer
        self._held.move_to_end(key)
        while len(self._held) > HELD:
            self._held.popitem(last=False)
        return buffer


class InSlot:
    """A worker's tensor that lives in slot ``slot`` of the pool: ``numel`` elements from
    ``offset``, viewed as ``shape`` (what crosses the process boundary instead of a descriptor)."""

    __slots__ = ("slot", "offset", "shape")

    def __init__(self, slot: int, offset: int, shape: tuple[int, ...]) -> None:
        self.slot, self.offset, self.shape = slot, offset, shape


def to_slots(item: Any, slot: int, buffer: Any) -> Any:
    """``item`` (a tensor, or tuples and lists of them and other things) with every tensor that is
    a contiguous view of ``buffer`` (slot ``slot``) replaced by an :class:`InSlot`."""
    import torch

    if isinstance(item, torch.Tensor):
        if item.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr() and item.is_contiguous():
            return InSlot(slot, item.storage_offset(), tuple(item.shape))
        return item
    if isinstance(item, (tuple, list)) and not _plain(item):
        return type(item)(to_slots(x, slot, buffer) for x in item)
    return item


def from_slots(item: Any, slots: list[Any]) -> Any:
    """The inverse of :func:`to_slots` in the main process: each :class:`InSlot` becomes a view of
    ``slots[slot]``."""
    if isinstance(item, InSlot):
        numel = math.prod(item.shape)
        return slots[item.slot][item.offset : item.offset + numel].view(item.shape)
    if isinstance(item, (tuple, list)) and not _plain(item):
        return type(item)(from_slots(x, slots) for x in item)
    return item


def _plain(items: tuple[Any, ...] | list[Any]) -> bool:
    """Whether ``items`` holds strings and numbers only (a batch's utterance ids): nothing to visit."""
    return _SCALARS.issuperset(map(type, items))


_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))


class BufferPool:
    """Shared-memory batch buffers of ``numel`` float32 elements owned by the main process (see
    the module docstring); at most ``limit`` of them, beyond which :meth:`take` gives None (the
    worker allocates as it would without a pool).  ``numel`` 0: sized by the first batches back.
    ``slots``: buffers the workers already have (:meth:`make_slots`), handed out by number."""

    def __init__(self, numel: int, limit: int, slots: list[Any] | None = None) -> None:
        self.numel, self.limit = numel, limit
        # (buffer, storage use count when free, its slot number or None)
        self.buffers: list[tuple[Any, int, int | None]] = []
        self.sent: collections.deque[tuple[int, int] | None] = collections.deque()  # (pointer, numel)
        self.enabled = can_pool()
        if slots and self.enabled and all(t.numel() >= numel > 0 for t in slots):
            self.buffers = [(t, self._uses(t), k) for k, t in enumerate(slots)]

    @property
    def slots(self) -> list[Any]:
        """The slots this pool hands out by number (none once it grew or stopped reusing)."""
        return [t for t, _, k in self.buffers if k is not None]

    @staticmethod
    def make_slots(numel: int, count: int) -> list[Any]:
        """``count`` buffers of ``numel`` elements to give the workers before they start (with the
        dataset) and then to a pool of that size (``slots=``); none when the size is unknown."""
        return [shared_empty((numel,)) for _ in range(count)] if numel > 0 and can_pool() else []

    @staticmethod
    def _uses(t: Any) -> int:
        import torch

        # references to the storage from any tensor, view or storage object (a private torch function)
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata)

    def take(self) -> Any:
        """A free buffer to send with the next index: its slot number when it is a slot, else the
        buffer (None: the worker allocates its own)."""
        found = self._free() if self.enabled and self.numel > 0 else None
        if found is None:
            self.sent.append(None)
            return None
        t, slot = found
        self.sent.append((t.untyped_storage().data_ptr(), t.numel()))
        return t if slot is None else slot

    def _free(self) -> tuple[Any, int | None] | None:
        busy = {s[0] for s in self.sent if s is not None}
        for t, free_uses, slot in self.buffers:
            if t.untyped_storage().data_ptr() not in busy and self._uses(t) == free_uses:
                return t, slot
        if len(self.buffers) >= self.limit:  # the caller keeps many batches: allocate as usual
            return None
        t = shared_empty((self.numel,))
        self.buffers.append((t, self._uses(t), None))
        return t, None

    def arrived(self, x: Any, needed: int = 0) -> None:
        """The next batch is back, in tensor ``x`` (None: it used no buffer), having needed
        ``needed`` elements (0: it fitted)."""
        sent = self.sent.popleft() if self.sent else None
        if needed > self.numel and not self.slots:  # too small for the batches: larger ones, with room to spare
            self.numel, self.buffers = needed + needed // 4, []
        if sent is None or x is None or needed > sent[1]:
            return
        if sent[0] != x.untyped_storage().data_ptr():
            self.enabled = False
            self.buffers = []


class IndexSampler:
    """Batch indices ``start..stop-1`` in order, each with a free buffer of ``pool`` when one is
    set (``(index, buffer)``, the buffer as :meth:`BufferPool.take` gives it: a tensor, a slot
    number or None); the bare index otherwise."""

    def __init__(self, start: int, stop: int, pool: BufferPool | None = None) -> None:
        self.start, self.stop, self.pool = start, stop, pool

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[Any]:
        for b in range(self.start, self.stop):
            yield b if self.pool is None else (b, self.pool.take())


class PageLocks:
    """Slots registered with CUDA as page-locked memory, so a copy to the device reads them
    directly and asynchronously (see the module docstring); released by :meth:`release`, which
    first waits for the device (a copy from a slot may still be queued).

    :meth:`lock` registers the slots in a thread of its own (torch's binding releases the
    interpreter lock during ``cudaHostRegister``), so the first batches do not wait for it: a
    batch whose slot is not registered yet is copied as ordinary memory, the same bytes, and the
    copies become asynchronous slot by slot.  ``background=False`` registers them all before
    :meth:`lock` returns.

    ``cudart``: torch's ``torch.cuda.cudart()`` (its ``cudaHostRegister`` / ``cudaHostUnregister``),
    ``synchronize``: ``torch.cuda.synchronize`` of the device, ``event``: a CUDA event recorded on
    the device's current stream; all three given only by tests, which have no GPU.  A slot the
    driver refuses leaves it and the rest as they are, with a warning: their copies are then
    ordinary ones, the same bytes."""

    def __init__(
        self,
        device: str,
        cudart: Any = None,
        synchronize: Callable[[], None] | None = None,
        event: Callable[[], Any] | None = None,
        background: bool = True,
    ) -> None:
        import torch

        self.cudart = cudart if cudart is not None else torch.cuda.cudart()
        # registered in the device's own context (a thread's current device is 0 until set: a job
        # on cuda:1 would otherwise lock its slots for device 0, and make device 0 a context)
        self._on_device = (lambda: torch.cuda.device(device)) if cudart is None else contextlib.nullcontext
        self.synchronize = synchronize if synchronize is not None else (lambda: torch.cuda.synchronize(device))
        self.event = event if event is not None else (lambda: _recorded(device))
        self.background = background
        self.locked: list[int] = []  # data pointers registered, in order (appended by the registering thread)
        self.held: collections.deque[tuple[Any, Any]] = collections.deque()  # (event, batch)
        #: what :meth:`lock` did: slots and bytes registered, seconds it took
        self.report: dict[str, float] = {}
        self._registering: threading.Thread | None = None
        self._stop = threading.Event()

    def lock(self, slots: list[Any]) -> None:
        """Register every slot of ``slots`` (stopping at the first the driver refuses, or at
        :meth:`release`), in the background unless ``background`` is off, and say in the job's
        log how much and how long."""
        self._stop.clear()
        if not self.background:
            self._register(list(slots))
            return
        self._registering = threading.Thread(
            target=self._register, args=(list(slots),), name="spkflow-page-lock", daemon=True
        )
        self._registering.start()

    def _register(self, slots: list[Any]) -> None:
        with self._on_device():
            self._register_on_device(slots)

    def _register_on_device(self, slots: list[Any]) -> None:
        t, nbytes = time.perf_counter(), 0
        for slot in slots:
            if self._stop.is_set():
                break
            storage = slot.untyped_storage()
            rc = self.cudart.cudaHostRegister(storage.data_ptr(), storage.nbytes(), 0)
            if int(rc) != 0:
                log.warning(
                    "page-locking batch slot %d of %d for the copies to the GPU failed (CUDA error %d); "
                    "the rest are copied as ordinary memory",
                    len(self.locked) + 1,
                    len(slots),
                    int(rc),
                )
                break
            self.locked.append(storage.data_ptr())
            nbytes += storage.nbytes()
        self.report = {"slots": len(self.locked), "bytes": nbytes, "seconds": round(time.perf_counter() - t, 3)}
        if self.locked:
            log.info(
                "page-locked %d of %d batch slots (%.2f GB) for the copies to the GPU in %.2f s%s",
                len(self.locked),
                len(slots),
                nbytes / 1e9,
                self.report["seconds"],
                " (in the background)" if self.background else "",
            )

    def _active(self) -> bool:
        """Whether a copy from a slot may be asynchronous: a slot is registered, or may be soon."""
        return bool(self.locked) or (self._registering is not None and self._registering.is_alive())

    def feeding(self, batches: Iterable[T], slots: list[Any]) -> Iterator[T]:
        """``batches`` (from a loader whose workers have started) with ``slots`` page-locked
        from before the first (:meth:`lock`), each batch held once its caller asks for the next
        (:meth:`hold`), and everything released when the loop ends, by an error or by the caller
        closing it."""
        try:
            self.lock(slots)
            for batch in batches:
                yield batch
                self.hold(batch)
        finally:
            self.release()

    def hold(self, batch: Any) -> None:
        """Keep ``batch``, handed over and now done with by its caller (who asks for the next),
        until the device has done all it was given so far, the copy from the batch's slot
        included: the pool hands a slot out only when nothing refers to it.  Batches the device
        is past are let go."""
        if not self._active():
            return
        self.held.append((self.event(), batch))
        while self.held and self.held[0][0].query():
            self.held.popleft()

    def release(self) -> None:
        """Stop the registration, wait for the device, then let go of the batches held and
        unregister every slot locked (once)."""
        self._stop.set()
        if self._registering is not None:
            self._registering.join()
            self._registering = None
        if self.locked:  # else every copy was an ordinary one, done when it returned
            self.synchronize()
            with self._on_device():
                for ptr in self.locked:
                    self.cudart.cudaHostUnregister(ptr)
            self.locked = []
        self.held.clear()


def _recorded(device: str) -> Any:
    """A CUDA event recorded now on ``device``'s current stream."""
    import torch

    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
