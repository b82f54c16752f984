"""The suite's own scheduling under ``pytest -n N`` (test/conftest.py): a test file is one unit of
work, every file of a ``schedulers`` folder together is one, and the schedulers go first.  Run for
real: a pytest with two xdist workers over a small tree that loads this suite's conftest hooks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.suite import SCHEDULERS, unit_of_work

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

TEST = """
import os, pathlib
def _log(name):
    with open(pathlib.Path(__file__).resolve().parents[{up}] / "ran.txt", "a") as f:
        f.write(f"{{__name__}}.{{name}} {{os.environ.get('PYTEST_XDIST_WORKER', 'main')}}\\n")
{tests}
"""


def test_unit_of_work_from_any_rootdir():
    assert unit_of_work("test/train/test_shards.py::test_x[float]") == "test/train/test_shards.py"
    assert unit_of_work("train/test_shards.py::test_x") == "train/test_shards.py"
    for nodeid in ("test/schedulers/test_slurm.py::t", "schedulers/test_sge.py::t[a]"):
        assert unit_of_work(nodeid) == SCHEDULERS
    assert unit_of_work("test/test_schedulers.py::t") == "test/test_schedulers.py"  # a file, not the folder


def test_files_and_the_schedulers_folder_each_run_on_one_worker(tmp_path):
    # the hooks of this suite's conftest, without its fixtures' imports of the project's helpers
    (tmp_path / "conftest.py").write_text(
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(CONFTEST.parent)!r})\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(CONFTEST)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "pytest_xdist_make_scheduler = m.pytest_xdist_make_scheduler\n"
        "pytest_collection_modifyitems = m.pytest_collection_modifyitems\n"
    )
    files = {"test_a.py": 0, "test_b.py": 0, "schedulers/test_slurm.py": 1, "schedulers/test_sge.py": 1}
    for name, up in files.items():
        p = tmp_path / name
        p.parent.mkdir(exist_ok=True)
        tests = "".join(f"def test_{i}():\n    _log({i})\n" for i in range(6))
        p.write_text(TEST.format(up=up, tests=tests))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:randomly", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ran = [ln.split() for ln in (tmp_path / "ran.txt").read_text().splitlines()]
    assert len(ran) == 24
    worker: dict[str, set[str]] = {}
    for test, w in ran:
        module = test.rsplit(".", 1)[0]
        worker.setdefault(SCHEDULERS if module in ("test_slurm", "test_sge") else module, set()).add(w)
    assert all(len(ws) == 1 for ws in worker.values()) and len(set.union(*worker.values())) == 2, worker
    # the order units are handed out in: the schedulers first (collection order, which xdist keeps)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:randomly", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    order = [ln.split("::")[0] for ln in r.stdout.splitlines() if "::" in ln]
    assert len(order) == 24 and all(p.startswith("schedulers/") for p in order[:12]), order
