"""spkflow.core.shared_batches: the pool of shared-memory batch buffers the main process sends
with each index (used by the trainer's loader and stage 5's): sized by the first batches back, a
buffer handed out only when it is back and nothing else holds it, reuse stopped at a batch that
came back in a storage other than its buffer's, only the order followed under pinning."""

from __future__ import annotations

import pytest
import torch

from spkflow.core.shared_batches import BufferPool, HeldBuffers, IndexSampler, can_pool, shared_empty

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


def test_under_pinning_only_the_order_is_followed():
    pool = BufferPool(10, limit=4, pinned=True)
    pool.take()
    pool.arrived(torch.zeros(6), needed=6)  # the caller gets a pinned copy, never the buffer
    assert pool.enabled and pool.take() is not None


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
