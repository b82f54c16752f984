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
and such a batch, a lone utterance over stage 5's frame bound, keeps a segment of its own); under
pinning (the caller gets a pinned copy, never the buffer) only the order is followed.  PyTorch's
DataLoader, ESPnet's, WeSpeaker's and SpeechBrain's loaders allocate a new segment per batch.

Slots: a buffer sent with an index travels as a file descriptor (torch's sharing: a connection to
the sender's resource sharer, both ways, per batch).  When the buffers' size is known before the
workers start, the pool makes its first ones then (:meth:`BufferPool.make_slots`); the workers get
them once, with the dataset, and a batch in a slot goes out as the slot's number and comes back as
a :class:`InSlot` the main process turns into a view of its own buffer (:func:`from_slots`): no
descriptor either way (the trainer's loader on arks, with the loader's torch subtraction of the
means: -21 % CPU per crop, +54 % crops/s; docs/gpu.md "Slots", with its command).  Stage 5 sizes
its slots by its planner's frame bound (not under pinning, where the caller gets pinned copies).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from typing import Any

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

    def __init__(self, numel: int, limit: int, pinned: bool = False, slots: list[Any] | None = None) -> None:
        self.numel, self.limit, self.pinned = numel, limit, pinned
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
        if sent is None or x is None or self.pinned or needed > sent[1]:
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
