"""spkflow.core.shared_batches: the pool of shared-memory batch buffers the main process sends
with each index (used by the trainer's loader and stage 5's): sized by the first batches back, a
buffer handed out only when it is back and nothing else holds it, reuse stopped at a batch that
came back in a storage other than its buffer's; slots page-locked for the copies to a GPU
(:class:`PageLocks`, through a stand-in for CUDA's runtime: there is no GPU here)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from helpers.cudart import FakeCudart, FakeEvents
from spkflow.core.shared_batches import (
    BufferPool,
    HeldBuffers,
    IndexSampler,
    InSlot,
    PageLocks,
    can_pool,
    from_slots,
    shared_empty,
    to_slots,
)

pytestmark = pytest.mark.skipif(not can_pool(), reason="this torch lacks the storage use count")


def test_shared_empty_is_shared_float32():
    t = shared_empty((3, 4))
    assert t.shape == (3, 4) and t.dtype == torch.float32 and t.is_shared()


def test_the_pool_sizes_itself_from_the_first_batch_back():
    pool = BufferPool(0, limit=4)
    assert pool.take() is None  # no size yet: the worker allocates its own
    pool.arrived(shared_empty((100,)), needed=100)
    b = pool.take()
    assert b is not None and b.numel() >= 100 and b.is_shared()


def test_a_buffer_goes_out_again_only_when_back_and_free():
    pool = BufferPool(10, limit=4)
    a = pool.take()
    b = pool.take()
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()  # a is on its way
    batch_a = a[:6].view(2, 3)  # the batch as it comes back: a view of its buffer
    pool.arrived(batch_a, needed=6)
    a = b = None  # the caller keeps batch a only
    c = pool.take()
    assert c.untyped_storage().data_ptr() != batch_a.untyped_storage().data_ptr()  # kept: not handed out
    pool.arrived(pool.buffers[1][0][:6], needed=6)
    pool.arrived(c[:6], needed=6)
    del batch_a, c
    d = pool.take()
    assert d.untyped_storage().data_ptr() == pool.buffers[0][0].untyped_storage().data_ptr()  # back and free
    assert len(pool.buffers) == 3


def test_a_batch_back_in_another_storage_stops_the_reuse():
    pool = BufferPool(10, limit=4)
    pool.take()
    pool.arrived(shared_empty((6,)), needed=6)  # fitted its buffer, yet came back elsewhere
    assert not pool.enabled and pool.take() is None


def test_a_batch_larger_than_its_buffer_grows_the_pool_without_stopping_it():
    pool = BufferPool(10, limit=4)
    pool.take()
    pool.arrived(shared_empty((30,)), needed=30)  # did not fit: made in a fresh segment
    assert pool.enabled and pool.take().numel() >= 30


def test_a_worker_keeps_its_last_buffers_mapped():
    held = HeldBuffers()
    bufs = [shared_empty((4,)) for _ in range(20)]
    for b in bufs:
        assert held.hold(b) is b
    kept = {t.untyped_storage().data_ptr() for t in held._held.values()}
    assert kept == {b.untyped_storage().data_ptr() for b in bufs[-16:]}


def test_the_index_sampler_sends_a_buffer_with_each_index_when_pooled():
    assert list(IndexSampler(2, 5)) == [2, 3, 4] and len(IndexSampler(2, 5)) == 3
    pool = BufferPool(8, limit=4)
    sent = list(IndexSampler(0, 3, pool))
    assert [b for b, _ in sent] == [0, 1, 2] and all(t is not None and t.numel() == 8 for _, t in sent)
    assert len({t.untyped_storage().data_ptr() for _, t in sent}) == 3 and len(pool.sent) == 3  # all on their way


def test_slots_go_out_by_number_and_come_back_as_views_of_the_main_processes_buffers():
    slots = BufferPool.make_slots(10, 2)
    pool = BufferPool(10, limit=4, slots=slots)
    assert [pool.take(), pool.take()] == [0, 1]  # the workers have them: numbers travel
    extra = pool.take()  # both on their way: a buffer of its own, sent as a tensor
    assert isinstance(extra, torch.Tensor) and len(pool.buffers) == 3
    # the first batch back, made in slot 0 (the worker's mapping of it): the view crosses as an
    # InSlot, the rest as it is
    lengths = torch.tensor([3, 2])
    item = (slots[0][4:10].view(2, 3), ["a", "b"], [lengths, slots[0][::2]])
    sent = to_slots(item, 0, slots[0])
    assert isinstance(sent[0], InSlot) and (sent[0].slot, sent[0].offset, sent[0].shape) == (0, 4, (2, 3))
    assert sent[2][0] is lengths and isinstance(sent[2][1], torch.Tensor)  # not in the slot / not contiguous
    got = from_slots(sent, slots)
    assert got[0].untyped_storage().data_ptr() == slots[0].untyped_storage().data_ptr()
    assert got[0].storage_offset() == 4 and got[0].shape == (2, 3) and got[1] == ["a", "b"]
    pool.arrived(got[0])
    assert pool.enabled and isinstance(pool.take(), torch.Tensor)  # slot 0 is back but still held
    del got, sent, item
    assert pool.take() == 0  # dropped: out again, by number


def test_slots_smaller_than_the_batches_are_not_used():
    pool = BufferPool(10, limit=4, slots=BufferPool.make_slots(6, 2))
    assert pool.slots == [] and isinstance(pool.take(), torch.Tensor)
    assert BufferPool.make_slots(0, 3) == []  # size unknown (stage 5): no slots


def test_page_locks_register_every_slot_whole_and_release_them_after_the_device_is_done(caplog):
    slots = BufferPool.make_slots(1000, 3)
    cudart = FakeCudart()
    locks = PageLocks(
        "cuda:0", cudart=cudart, synchronize=lambda: cudart.calls.append(("synchronize",)), background=False
    )
    with caplog.at_level("INFO"):
        locks.lock(slots)
    ptrs = [t.untyped_storage().data_ptr() for t in slots]
    assert cudart.calls == [("register", p, 4000, 0) for p in ptrs]
    assert "page-locked 3 of 3 batch slots" in caplog.text
    locks.release()
    locks.release()  # once only
    assert cudart.calls[3:] == [("synchronize",)] + [("unregister", p) for p in ptrs]


def test_a_slot_the_driver_refuses_leaves_the_rest_unlocked_with_a_warning(caplog):
    slots = BufferPool.make_slots(1000, 4)
    cudart = FakeCudart(refuse_after=2)
    locks = PageLocks("cuda:0", cudart=cudart, synchronize=lambda: None, background=False)
    with caplog.at_level("INFO"):
        locks.lock(slots)
    assert [c[0] for c in cudart.calls] == ["register"] * 3  # the third refused: no fourth try
    assert "slot 3 of 4" in caplog.text and "CUDA error 2" in caplog.text
    locks.release()
    ptrs = [t.untyped_storage().data_ptr() for t in slots[:2]]
    assert cudart.calls[3:] == [("unregister", p) for p in ptrs]  # only those locked


def test_a_batch_handed_over_is_held_until_the_device_is_past_it():
    """A caller that runs ahead of the device (the copy from a batch's slot still queued when it
    asks for the next batch) does not get that slot refilled under the copy."""
    slots = BufferPool.make_slots(10, 3)
    pool = BufferPool(10, limit=4, slots=slots)
    events = FakeEvents()
    locks = PageLocks("cuda:0", cudart=FakeCudart(), synchronize=lambda: None, event=events, background=False)
    locks.lock(slots)
    assert pool.take() == 0
    batch = slots[0][:6].view(2, 3)
    pool.arrived(batch)
    locks.hold(batch)  # the caller queued its copy and asks for the next batch
    del batch
    assert pool.take() == 1  # slot 0: the device has not copied it yet
    pool.arrived(slots[1][:6])
    events.made[0].done = True
    locks.hold(slots[1][:6])  # the next one handed over; the device is past the first
    assert pool.take() == 0 and len(locks.held) == 1
    pool.arrived(slots[0][:6])
    locks.release()  # the device waited for: nothing held
    assert not locks.held and [pool.take(), pool.take()] == [0, 1]


def test_feeding_locks_before_the_first_batch_holds_each_and_releases_when_left_or_failed():
    """The loaders' loop (stage 5's and the trainer's): the slots are locked before a batch is
    asked of the workers, each batch is held once the caller asks for the next, and the slots are
    released (the device waited for) whether the caller stops early or the batches fail."""
    slots = BufferPool.make_slots(10, 2)
    cudart, events = FakeCudart(), FakeEvents()

    def batches(fail: bool):
        assert [c[0] for c in cudart.calls][-2:] == ["register"] * 2  # locked before the first
        yield "b0"
        yield "b1"
        if fail:
            raise RuntimeError("a worker failed")
        yield "b2"

    for fail in (False, True):
        cudart.calls.clear()
        locks = PageLocks(
            "cuda:0",
            cudart=cudart,
            synchronize=lambda: cudart.calls.append(("synchronize",)),
            event=events,
            background=False,
        )
        fed = locks.feeding(batches(fail), slots)
        assert next(fed) == "b0" and not locks.held
        assert next(fed) == "b1" and [b for _, b in locks.held] == ["b0"]
        if fail:
            with pytest.raises(RuntimeError, match="a worker failed"):
                next(fed)
        else:
            fed.close()  # the caller leaves the loop
        assert [c[0] for c in cudart.calls[2:]] == ["synchronize", "unregister", "unregister"]
        assert not locks.held and not locks.locked


def until(condition, what: str) -> None:
    """Wait for ``condition`` (another thread's doing), not for a time; a minute at most."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.001)


def test_the_first_batches_do_not_wait_for_the_registration_and_a_release_stops_it():
    """Registering in the background: batches are handed over while the driver is still
    registering the first slot (each registration here waits for the test's permit), held from
    the first, since a slot may be registered under its copy at any moment; a release stops the
    registration after the slot in hand and unregisters just the slots registered, after a
    synchronise."""
    slots = BufferPool.make_slots(10, 4)
    permits = threading.Semaphore(0)

    class Gated(FakeCudart):
        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 (CUDA's name)
            permits.acquire()
            return super().cudaHostRegister(ptr, size, flags)

    cudart, events = Gated(), FakeEvents()
    locks = PageLocks("cuda:0", cudart=cudart, synchronize=lambda: cudart.calls.append(("sync",)), event=events)
    fed = locks.feeding(iter(["b0", "b1", "b2"]), slots)
    closing = threading.Thread(target=fed.close)  # the caller leaves the loop; release waits for the slot in hand
    try:
        assert next(fed) == "b0" and next(fed) == "b1"  # the first registration has not even begun
        assert not cudart.calls and [b for _, b in locks.held] == ["b0"]
        permits.release()
        until(lambda: len(locks.locked) == 1, "the first slot registered")
        closing.start()
        until(locks._stop.is_set, "the release asked the registration to stop")
        permits.release()  # the second registration ends; no third begins
        closing.join(timeout=60)
        assert not closing.is_alive(), "the release waited for a registration it had stopped"
    finally:  # a failure above must not leave the registration (and the test) waiting for ever
        for _ in slots:
            permits.release()
        if not closing.is_alive() and closing.ident is None:
            fed.close()
        closing.join(timeout=60)
    ptrs = [t.untyped_storage().data_ptr() for t in slots[:2]]
    assert cudart.calls == [("register", p, 40, 0) for p in ptrs] + [("sync",)] + [("unregister", p) for p in ptrs]
    assert locks.report["slots"] == 2 and not locks.held and not locks.locked


@pytest.mark.skipif(
    not hasattr(torch._C, "_cudart") or torch.cuda.is_available(), reason="needs torch's CUDA runtime without a GPU"
)
def test_the_real_cuda_runtime_without_a_gpu_refuses_and_the_slots_stay_ordinary_memory(caplog):
    """torch's own binding of ``cudaHostRegister`` (its return value is a pybind enum), on a machine
    with the CUDA runtime and no driver: the refusal is read, said with CUDA's code, and nothing
    is left registered (a job then copies its batches as ordinary memory)."""
    slots = BufferPool.make_slots(1000, 2)
    locks = PageLocks("cuda:0", cudart=torch._C._cudart, synchronize=lambda: None, background=False)
    with caplog.at_level("INFO"):
        locks.lock(slots)
    assert locks.locked == [] and "slot 1 of 2" in caplog.text and "CUDA error" in caplog.text
    locks.hold(slots[0])  # nothing locked: nothing held, no event asked of the absent device
    assert not locks.held
    locks.release()
