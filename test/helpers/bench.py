"""What the benchmarks under test/bench share: the best-of-N wall time (a benchmark imports it
after putting test/ on sys.path; the corpora come from :func:`helpers.paths.db_var`)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best(fn: Callable[[], object], repeat: int) -> float:
    """The lowest wall time of ``repeat`` calls of ``fn`` (seconds): the least disturbed by the
    rest of a shared machine."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
