"""A probe of a process's heap (spkflow.core.heap), as source text for the fresh interpreters the
tests start (their ``PYTHONPATH`` holds the repository, not ``test/``)."""

from __future__ import annotations

import os

#: pages of one probe batch: what it faults when its freed memory was handed back to the kernel
PAGES = 16 * (1 << 20) // os.sysconf("SC_PAGESIZE")

#: ``heap_faults()``: the minor page faults of a batch of 16 x 1 MiB held at once then freed (as a
#: worker holds a batch of decoded utterances), after three such batches; about PAGES under glibc's
#: default, none where freed memory is kept
HEAP_PROBE = """
def heap_faults():
    import resource
    import numpy

    def batch():
        held = [numpy.ones(1 << 17) for _ in range(16)]  # written: every page touched
        del held

    for _ in range(3):
        batch()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        batch()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 5
"""
