"""JSON that every reader parses: a float that is not finite (NaN, +-inf) is written as ``null``.

Python's ``json.dumps`` writes ``NaN`` and ``Infinity`` by default, which the JSON standard
(RFC 8259) and most readers (``jq``, JavaScript's ``JSON.parse``, Go, Rust's serde_json) reject;
one NaN score would make a whole JSON-lines output unreadable.  :func:`dumps` maps them to
``null`` (the value is unknown) and then serialises with ``allow_nan=False``, so nothing
non-standard can slip through.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite"]


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (in dicts, lists, tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` with non-finite floats as ``null`` (standard JSON always)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
