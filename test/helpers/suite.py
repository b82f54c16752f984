"""How the suite is spread over ``pytest -n N`` workers (the hooks in test/conftest.py use it)."""

from __future__ import annotations

SCHEDULERS = "schedulers"  # test/schedulers: one unit of work (one real Slurm and one Grid Engine per host)


def unit_of_work(nodeid: str) -> str:
    """What one worker runs together under ``pytest -n N``: a test file (its module fixtures, a
    trained model or a prepared recipe, are built once, on one worker), and every file of
    test/schedulers as one (the session's Slurm and Grid Engine are started once: two workers would
    each start their own, and Grid Engine has one cell per host)."""
    path = nodeid.split("::", 1)[0]
    return SCHEDULERS if SCHEDULERS in path.split("/")[:-1] else path  # from any rootdir
