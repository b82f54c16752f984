"""Shared fixtures: small real audio made on the fly, and the real corpora from db.sh.

Unit tests make their own audio (``make_speakers``) so they run anywhere.  Tests on the
shipped corpora ask ``corpus(NAME)``: the path comes from the recipe's ``db.sh``; when the
directory is missing the test is skipped, except under CI (``CI=true``) where it fails.

Fixtures live here (pytest finds them here for every folder below); the functions and constants
test files share live in the ``helpers`` package beside this file (``from helpers.audio import
make_speakers``), so that no test file imports another.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import threadpoolctl
import torch

from helpers.audio import make_speakers
from helpers.compat import settle_speechbrain_redirects
from helpers.paths import db_var

# The real Slurm / Grid Engine fixtures, once per session for every test module (a module that
# imported them itself would start a second cluster beside the first).
from helpers.schedulers import sge_cluster, slurm_cluster  # noqa: F401
from helpers.suite import SCHEDULERS, unit_of_work
from spkflow.core.heap import keep_freed_memory
from spkflow.core.threads import THREAD_ENV

# Every job's process keeps its freed heap memory (spkflow.core.heap); a command's main called in a
# test process would set it there halfway through the session, so it is set from the start and
# every test runs on the same heap (the tests of the setting itself start fresh interpreters).
keep_freed_memory()


@pytest.fixture(scope="session", autouse=True)
def _pack_cache(tmp_path_factory: pytest.TempPathFactory):
    """Packs opened by the tests (and the scripts they start) unpack into a cache of the session,
    not the user's ~/.cache/spkflow (spkflow.embed.packed.cache_root)."""
    old = os.environ.get("SPKFLOW_CACHE")
    os.environ["SPKFLOW_CACHE"] = str(tmp_path_factory.mktemp("spkflow_cache"))
    yield
    if old is None:
        os.environ.pop("SPKFLOW_CACHE", None)
    else:
        os.environ["SPKFLOW_CACHE"] = old


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without xdist (a GPU machine's pytest) it is not called
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n N`` (tools/test.sh): units of :func:`unit_of_work`, handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    if config.getvalue("dist") not in ("load", "loadscope", "loadfile"):
        return None  # --dist each / worksteal / loadgroup: xdist's own
    config.option.loadscopereorder = False
    return UnitScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Before hypothesis' own hook scans sys.modules (helpers.compat says why); then the order in
    which ``pytest -n N`` hands the units of work out: test/schedulers first, then the files holding
    the most slow tests, so that no worker is left with a long one at the end while the other idles."""
    settle_speechbrain_redirects()
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of_work(item.nodeid), []).append(item)

    def slow_first(unit: str) -> tuple[bool, int]:
        return unit != SCHEDULERS, -sum(1 for t in units[unit] if t.get_closest_marker("slow"))

    items[:] = [item for unit in sorted(units, key=slow_first) for item in units[unit]]


@pytest.fixture(autouse=True)
def _speechbrain_redirects():
    """After a test that imported SpeechBrain, before the next property test (helpers.compat)."""
    yield
    settle_speechbrain_redirects()


@pytest.fixture(autouse=True)
def _thread_pools():
    """A test leaves the thread settings as it found them: a command's main called in the test
    process pins its pools to the job's share (spkflow.core.threads, the environment included),
    and a later test's bit-exactness must not depend on which tests ran before it.  Taken after
    the module's own fixtures, so a module that pins one thread for all its tests keeps it."""
    env = {name: os.environ.get(name) for name in THREAD_ENV}
    pools = {i["prefix"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}
    threads = torch.get_num_threads()
    yield
    if any(os.environ.get(name) != value for name, value in env.items()):
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if {i["prefix"]: i["num_threads"] for i in threadpoolctl.threadpool_info()} != pools:
        threadpoolctl.threadpool_limits(limits=pools)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture
def speakers(tmp_path: Path) -> Path:
    """A small synthetic data dir: 4 speakers x 3 utterances, 16 kHz wav."""
    return make_speakers(tmp_path)


@pytest.fixture(scope="session")
def corpus():
    """``corpus("SPEECHOCEAN762")`` -> Path from db.sh; skip if absent (fail under CI=true)."""

    def get(name: str) -> Path:
        path = Path(db_var(name))
        if not path.is_dir():
            msg = f"corpus {name} not found at {path} (set {name} or see db.sh)"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(msg)
            pytest.skip(msg)
        return path

    return get


@pytest.fixture(scope="session")
def accel() -> str:
    """The device of the CUDA-marked tests (``pytest -m cuda``, run first by test/bench/gpu_check.sh):
    ``cuda`` when torch sees a GPU; ``cpu`` under ``GPU_CHECK_DEVICE=cpu`` (the check rehearsed on a
    machine without one: the same tests, CPU bounds where precision differs); else the test is skipped."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("GPU_CHECK_DEVICE") == "cpu":
        return "cpu"
    pytest.skip("no CUDA device here (GPU_CHECK_DEVICE=cpu runs the CUDA-marked tests on the CPU)")
