"""The heap of a process that runs work (spkflow.core.heap): memory freed after one batch of large
temporaries is found again by the next, where glibc's adaptive default hands it back to the
kernel and every batch faults its pages in again.

Each case runs in a fresh Python (the allocator's settings are per process and cannot be undone)
and counts the minor page faults of a batch: 16 blocks of 1 MiB held at once, then freed, as a
worker holds a batch of decoded utterances.  Mutant checked by hand: with only one of the two
``mallopt`` calls the "kept" case faults as the default does."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from helpers.heap import HEAP_PROBE, PAGES
from helpers.paths import ROOT

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's allocator only"
)

SCRIPT = (
    HEAP_PROBE
    + """
import sys

how = sys.argv[1]
if how == "kept":
    from spkflow.core.heap import keep_freed_memory
    print(keep_freed_memory())
elif how == "job":  # as every job and DataLoader worker sets itself up
    from spkflow.core.threads import limit_threads
    limit_threads(1)
    print(True)
else:
    print(False)

print(heap_faults())
"""
)


def _faults(how: str, **env: str) -> tuple[bool, float]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    e.update(PYTHONPATH=str(ROOT), **env)
    r = subprocess.run([sys.executable, "-c", SCRIPT, how], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    kept, faults = r.stdout.split()
    return kept == "True", float(faults)


def test_a_batch_finds_the_memory_the_last_one_freed():
    _, default = _faults("default")
    assert default > PAGES / 2  # the premise: glibc's default hands a freed batch back
    for how in ("kept", "job"):
        kept, faults = _faults(how)
        assert kept, how
        assert faults < PAGES / 20, (how, faults, default)


def test_the_users_own_malloc_settings_win():
    kept, faults = _faults("kept", MALLOC_TRIM_THRESHOLD_="131072")
    assert not kept
    assert faults > PAGES / 2  # the user's trim threshold (glibc's default value) is what applies
    kept, _ = _faults("kept", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")
    assert not kept
