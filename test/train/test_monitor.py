"""The step loop's waits for batches (spkflow.core.batch_wait.BatchWait): a loader slower than the
steps shows as a high share, a model slower than the loader as a low one, the first batch (workers
starting) is kept apart, and closing the loop closes the loader's iterator.  Real generators that
sleep stand in for a loader and a step.  A sleep is a lower bound, and a busy machine can only add
scheduling delays to either side: each bound below holds until those add up to 0.2 s or more."""

from __future__ import annotations

import time
from collections.abc import Iterator

from spkflow.core.batch_wait import LOADER_BOUND, BatchWait
from spkflow.train.monitor import Monitor, loader_bound


def batches(n: int, first: float = 0.0, each: float = 0.0, closed: list[bool] | None = None) -> Iterator[int]:
    try:
        for i in range(n):
            time.sleep(first if i == 0 else each)
            yield i
    finally:
        if closed is not None:
            closed.append(True)


def test_a_loader_slower_than_the_steps_shows_as_waiting() -> None:
    wait = BatchWait()
    assert list(wait.over(batches(6, first=1.0, each=0.2))) == list(range(6))
    s = wait.stats()
    # the share is of the loop after the first batch: its 1 s is neither waited nor looped there
    # (counted in the loop, it would bring the share down to 0.5)
    assert s["data_wait_share"] > 0.8 and s["data_wait_seconds"] >= 1.0 + 5 * 0.2


def test_a_model_slower_than_the_loader_shows_almost_no_waiting_and_the_first_batch_apart() -> None:
    wait = BatchWait()
    for _ in wait.over(batches(6, first=0.3)):
        time.sleep(0.2)  # the step
    s = wait.stats()
    assert s["first_batch_seconds"] >= 0.3 and s["data_wait_seconds"] >= s["first_batch_seconds"]
    assert s["data_wait_share"] < 0.2  # the first batch's 0.3 s is not in the share


def test_one_batch_has_no_share_and_none_has_no_figures() -> None:
    one = BatchWait()
    list(one.over(batches(1)))
    assert set(one.stats()) == {"first_batch_seconds", "data_wait_seconds"}
    none = BatchWait()
    list(none.over(batches(0)))
    assert none.stats() == {}


def test_leaving_the_loop_closes_the_loader_iterator() -> None:
    closed: list[bool] = []
    wait = BatchWait()
    loader = batches(10, closed=closed)  # held here, as a caller may: only an explicit close ends it
    for i in wait.over(loader):
        if i == 2:
            break
    assert closed == [True] and wait.count == 3


def test_the_monitor_puts_the_waits_in_the_epoch_row_and_starts_each_epoch_afresh(tmp_path) -> None:
    m = Monitor(tmp_path, main=True, log_every=1, tensorboard=False, purge_step=None)
    m.start_epoch([])
    for _ in m.batches(batches(3, each=0.2)):
        pass
    first = m.epoch_stats()
    assert first["data_wait_share"] > 0.5 and first["grad_norm_nonfinite"] == 0
    m.start_epoch([])
    assert "data_wait_seconds" not in m.epoch_stats()


def test_loader_bound_speaks_above_a_quarter_only() -> None:
    assert loader_bound({"epoch": 3}) is None
    assert loader_bound({"epoch": 3, "data_wait_share": LOADER_BOUND}) is None
    said = loader_bound({"epoch": 3, "data_wait_share": 0.6})
    assert said is not None and said.startswith("epoch 3:") and "60%" in said and "train.num_workers" in said
