"""The C heap of a process that runs work: memory freed after one item kept for the next.

What it guarantees
------------------
:func:`keep_freed_memory` sets glibc's allocator (``mallopt``) so that the large temporaries of
one item (an utterance's fbank, a batch of decoded waves, a crop's augmentation) come from the
heap and go back to it, where the next item finds them, instead of being handed back to the
kernel and faulted in again page by page:

* ``M_MMAP_THRESHOLD`` 32 MiB: a block below it comes from the heap, not from a mapping of its
  own that ``free`` unmaps;
* ``M_TRIM_THRESHOLD`` 64 MiB: the free memory at the top of the heap is given back only beyond it.

These are the values glibc's own adaptive rule reaches at its ceiling (it raises the mmap
threshold to the size of a freed mapped block, up to 32 MiB on 64-bit, and the trim threshold to
twice that), set from the start.  Its rule starts at 128 KiB and adapts to what was freed last,
so a worker that holds a batch of items and then frees them all gives the heap's top back on
every batch: a 6 s utterance's fbank took 1,263 minor page faults and 5.0 ms on the 2-core
development VM, 0 and 2.2 ms with this setting (docs/gpu.md, "The heap of a worker").  Where the
C library is not glibc (musl, macOS) nothing is set; nor where the user set glibc's own
``MALLOC_*_`` variables or ``glibc.malloc`` tunables, which win.  A preloaded jemalloc or
tcmalloc serves the process's blocks instead of glibc and keeps freed memory by itself: the
setting then reaches only glibc's unused heap.

Every process that runs work calls it through :func:`spkflow.core.threads.limit_threads` (each
job, each DataLoader worker).  PyTorch's performance guide suggests preloading jemalloc or
tcmalloc for the same reason; this needs no library and no change to how a job is started.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
#: glibc's own variables for these settings: a user who set one has chosen
_USER_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")

_kept: bool | None = None


def keep_freed_memory() -> bool:
    """Set this process's heap as the module doc says (once); True when it is set so."""
    global _kept
    if _kept is None:
        _kept = _set()
    return _kept


def _set() -> bool:
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if not sys.platform.startswith("linux") or any(os.environ.get(k) for k in _USER_ENV):
        return False
    if any(t in tunables for t in _USER_TUNABLES):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # not glibc (musl has a mallopt that does nothing)
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
