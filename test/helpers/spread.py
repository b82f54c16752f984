"""Float bounds between two computation paths (batched vs alone, API vs command, audio vs stored
embeddings, device vs workers, ONNX vs PyTorch), and a record of the spreads measured against them.

A test compares the two paths with :func:`within` (the bound, and the spread measured beside it in
a comment); docs/design.md ("Float equalities") says which comparisons are exact, which bounded,
and why each bound.  ``test/bench/bench_float_spread.py`` re-measures the spreads: it runs the
tests with the variables below set and prints each check's worst spread against its bound.

SPKFLOW_SPREAD_LOG      append one JSON line per :func:`within` call (check, spread, bound) here
SPKFLOW_TEST_THREADS    intra-op threads of the compared computations (default 1: what CI runs)
SPKFLOW_TEST_PERMUTE    a seed: :func:`permuted` shuffles the order of a batch (default: as given)
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

#: the thread count of the compared computations, in the test process and in its commands
THREADS = int(os.environ.get("SPKFLOW_TEST_THREADS", "1"))


def permuted(items: Sequence[T]) -> list[T]:
    """``items`` in the order a batch is built from: as given, or shuffled by SPKFLOW_TEST_PERMUTE."""
    seed = os.environ.get("SPKFLOW_TEST_PERMUTE")
    out = list(items)
    if seed:
        random.Random(int(seed)).shuffle(out)
    return out


def within(check: str, spread: float, bound: float) -> None:
    """Assert ``spread <= bound`` for the comparison named ``check``, logging it when measuring."""
    path = os.environ.get("SPKFLOW_SPREAD_LOG")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        row = {"test": test, "check": check, "spread": float(spread), "bound": bound, "threads": THREADS}
        row["permute"] = os.environ.get("SPKFLOW_TEST_PERMUTE") or None
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    assert spread <= bound, f"{check}: spread {spread:.3g} > bound {bound:.3g}"
