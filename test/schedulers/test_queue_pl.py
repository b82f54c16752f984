"""utils/queue.pl against a real Sun Grid Engine 8.1 (Debian's gridengine packages):
sge_qmaster and sge_execd are configured for this host and started by this module
(test/helpers/schedulers.py), and stopped at the end. Skipped when not root or Grid Engine is not
installed, except under CI=true (tools/test.sh installs it as root).

The test cell has a consumable "gpu" complex with one unit on the host, so ``--gpu 1`` is
a request Grid Engine really schedules; no GPU exists here, so nothing computes on one."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.schedulers import GridEngine, run_runner  # the sge_cluster fixture: conftest.py
from helpers.schedulers import log_body as body

pytestmark = pytest.mark.sge

QUEUE_PL = ROOT / "utils" / "queue.pl"


def queue_pl(engine: GridEngine, args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_runner(QUEUE_PL, engine.env, args, cwd, timeout)


def test_array_job_of_four_with_pipes_and_venv_python(sge_cluster: GridEngine, tmp_path: Path) -> None:
    r = queue_pl(
        sge_cluster,
        [
            "JOB=1:4",
            "exp/log/x.JOB.log",
            "python",
            "-c",
            "import sys, spkflow; print(sys.prefix, JOB)",
            "|",
            "sed",
            "s/^/got: /",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    for i in range(1, 5):
        log = tmp_path / "exp" / "log" / f"x.{i}.log"
        text = log.read_text()
        assert re.search(rf"^# Running on \S+ as sge job \d+, task {i}$", text, re.M)
        assert body(log) == [f"got: {ROOT / '.venv'} {i}"]
        assert "# Ended (code 0)" in text
    script = (tmp_path / "exp" / "log" / "q" / "x.sh").read_text()
    assert "#$ -t 1-4\n" in script


def test_a_failing_task_is_reported_with_its_log(sge_cluster: GridEngine, tmp_path: Path) -> None:
    r = queue_pl(
        sge_cluster,
        [
            "JOB=1:3",
            "log/f.JOB.log",
            "bash",
            "-c",
            "echo task JOB; [ JOB -ne 3 ] || { echo 'bad line 7' >&2; exit 100; }",
        ],
        tmp_path,
    )
    # exit 100 is Grid Engine's "error state" code: queue.pl must report it, not hang
    assert r.returncode == 1
    assert "queue.pl: 1 / 3 failed, log is in log/f.*.log" in r.stderr
    assert "failed (code 100): log/f.3.log" in r.stderr
    assert "bad line 7" in r.stderr
    for i in (1, 2):
        assert body(tmp_path / "log" / f"f.{i}.log") == [f"task {i}"]


def test_mem_threads_gpu_are_translated_and_granted(sge_cluster: GridEngine, tmp_path: Path) -> None:
    r = queue_pl(
        sge_cluster,
        [
            "--mem",
            "100M",
            "--num-threads",
            "2",
            "--gpu",
            "1",
            "--time",
            "0:10:0",
            "JOB=1:2",
            "log/r.JOB.log",
            "bash",
            "-c",
            "echo slots=$NSLOTS pe=$PE",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "log" / "q" / "r.sh").read_text()
    for line in ("#$ -l mem_free=100M", "#$ -pe smp 2", "#$ -l gpu=1", "#$ -l h_rt=0:10:0"):
        assert line + "\n" in script
    for i in (1, 2):
        assert body(tmp_path / "log" / f"r.{i}.log") == ["slots=2 pe=smp"]
        assert "threads=2" in (tmp_path / "log" / f"r.{i}.log").read_text()


def test_max_jobs_run_is_a_task_throttle(sge_cluster: GridEngine, tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    r = queue_pl(
        sge_cluster,
        [
            "--max-jobs-run",
            "1",
            "JOB=1:3",
            "log/m.JOB.log",
            "bash",
            "-c",
            "date +%s.%N > t/JOB; sleep 0.3; date +%s.%N >> t/JOB",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "#$ -tc 1\n" in (tmp_path / "log" / "q" / "m.sh").read_text()
    spans = sorted(tuple(float(x) for x in (tmp_path / "t" / str(i)).read_text().split()) for i in (1, 2, 3))
    for (_, e1), (s2, _) in itertools.pairwise(spans):
        assert e1 <= s2


@pytest.mark.parametrize("array", [True, False])
def test_tasks_stuck_in_error_state_are_reported_not_waited_for(
    sge_cluster: GridEngine, tmp_path: Path, array: bool
) -> None:
    # An output path that cannot be opened puts the tasks in Grid Engine's Eqw state, where they
    # would wait for an administrator forever: queue.pl reports them and ends (queue_pl's timeout
    # bounds the wait; no duration is assumed, the box may be loaded).
    args = ["JOB=1:2", "log/e.JOB.log", "true"] if array else ["log/e.log", "true"]
    r = queue_pl(sge_cluster, ["-o", "/nonexistent/dir/q.log", *args], tmp_path, timeout=120)
    assert r.returncode == 1
    assert "error state (Eqw)" in r.stderr and "/nonexistent/dir/q.log" in r.stderr
    assert ("2 / 2 failed" if array else "job failed (ended without status") in r.stderr
    job = re.search(r"of job (\d+)", r.stderr).group(1)
    # and the job was deleted: qdel only marks it, qmaster removes it when it gets to it
    deadline = time.monotonic() + 60
    while (known := _qstat_j(sge_cluster, job)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not known, f"job {job} is still in Grid Engine 60 s after queue.pl deleted it"


def _qstat_j(cluster: GridEngine, job: str) -> bool:
    """Whether Grid Engine still knows ``job`` (``qstat -j`` succeeds)."""
    env = {**os.environ, **cluster.env}
    return subprocess.run(["qstat", "-j", job], env=env, capture_output=True, text=True).returncode == 0


def test_single_job_form_and_unknown_option(sge_cluster: GridEngine, tmp_path: Path) -> None:
    r = queue_pl(sge_cluster, ["log/one.log", "echo", "alone"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert body(tmp_path / "log" / "one.log") == ["alone"]
    assert "#$ -t" not in (tmp_path / "log" / "q" / "one.sh").read_text()
    r = queue_pl(sge_cluster, ["--colour", "red", "log/two.log", "true"], tmp_path)
    assert r.returncode != 0
    assert "--colour red is not described in the built-in default config" in r.stderr
