"""How long a loop waits for its batches: whether the loader or the model sets the pace.

Training's step loop (:mod:`spkflow.train.monitor`) and stage 5's jobs (:func:`spkflow.embed.run.run_job`)
take their batches through :meth:`BatchWait.over`, which times each wait for the next batch.
:meth:`BatchWait.stats` then gives ``first_batch_seconds`` (the first batch: workers starting,
first reads), ``data_wait_seconds`` (every wait, the first included) and, with two batches or
more, ``data_wait_share``: the share of the loop after the first batch spent waiting.  Near 0 the
model is the limit (the loader's workers keep batches ready); otherwise it is how much of the
time the device was left without a batch.  The loop's end is the last time it asked for a batch,
so the loader's shutting down after the last one is not counted, nor is a step interrupted by a
stop.  Above :data:`LOADER_BOUND` on a GPU each caller warns, naming its own settings.

ESPnet's trainer measures the same wait per iteration (``iter_time`` in its reporter); WeSpeaker's
and SpeechBrain's trainers and extraction scripts measure none.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["LOADER_BOUND", "BatchWait"]

T = TypeVar("T")

#: the share of a loop spent waiting for batches above which the loader, not the model, is said
#: to set the pace: a quarter of the time on a GPU left idle
LOADER_BOUND = 0.25


class BatchWait:
    """How long a step loop waits for its batches (the module doc): :meth:`over` hands them on,
    timing each wait; :meth:`stats` gives the epoch's figures."""

    def __init__(self) -> None:
        self.first: float | None = None  # the first batch's wait
        self.rest = 0.0  # the waits after it
        self.count = 0  # batches handed on
        self._since = 0.0  # when the first batch arrived
        self._end = 0.0  # when the loop last asked for a batch (after its last step)

    def over(self, loader: Iterable[T]) -> Iterator[T]:
        """``loader``'s batches, in order; closing this closes ``loader``'s iterator (its workers)."""
        it = iter(loader)
        try:
            while True:
                asked = self._end = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    return
                got = time.perf_counter()
                if self.first is None:
                    self.first, self._since = got - asked, got
                else:
                    self.rest += got - asked
                self.count += 1
                yield item
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def stats(self) -> dict[str, float]:
        """``first_batch_seconds``, ``data_wait_seconds`` and (two batches or more) ``data_wait_share``."""
        if self.first is None:
            return {}
        out = {"first_batch_seconds": round(self.first, 3), "data_wait_seconds": round(self.first + self.rest, 3)}
        loop = self._end - self._since
        if self.count >= 2 and loop > 0:
            out["data_wait_share"] = round(min(1.0, self.rest / loop), 4)
        return out
