"""utils/run.pl: JOB substitution, per-job logs, failure reporting, --max-jobs-run, quoting,
signal forwarding and --gpu device assignment, all by running the real script."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.schedulers import log_body as body

RUN_PL = ROOT / "utils" / "run.pl"


def run_pl(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(RUN_PL), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def intervals(paths: list[Path]) -> list[tuple[float, float]]:
    """(start, end) written by jobs as two lines of `date +%s.%N`."""
    out = []
    for p in paths:
        start, end = (float(x) for x in p.read_text().split())
        out.append((start, end))
    return out


def max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def test_job_substitution_logs_and_header(tmp_path: Path) -> None:
    r = run_pl(["JOB=1:4", "exp/log/x.JOB.log", "echo", "task JOB of x.JOB"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == r.stderr == ""
    for i in range(1, 5):
        log = tmp_path / "exp" / "log" / f"x.{i}.log"
        text = log.read_text().splitlines()
        assert text[0] == f'# echo "task {i} of x.{i}"'
        assert re.match(r"# Started at \S+", text[1])
        assert body(log) == [f"task {i} of x.{i}"]
        assert re.fullmatch(r"# Accounting: time=\d+ threads=1", text[-2])
        assert re.match(r"# Ended \(code 0\) at .*, elapsed time \d+ seconds", text[-1])
    assert not (tmp_path / "exp" / "log" / "x.5.log").exists()
    assert not (tmp_path / "exp" / "log" / "x.JOB.log").exists()


def test_job_range_not_starting_at_one_and_other_name(tmp_path: Path) -> None:
    r = run_pl(["SPLIT=3:5", "log/a.SPLIT.log", "echo", "SPLIT"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "log").glob("*.log")) == ["a.3.log", "a.4.log", "a.5.log"]
    assert body(tmp_path / "log" / "a.4.log") == ["4"]


def test_one_failure_among_four_is_reported_with_its_log(tmp_path: Path) -> None:
    # job 3 writes to stderr and exits 3; the others succeed
    r = run_pl(
        ["JOB=1:4", "log/x.JOB.log", "bash", "-c", "echo out JOB; [ JOB -ne 3 ] || { echo broken JOB >&2; exit 3; }"],
        tmp_path,
    )
    assert r.returncode == 1
    assert "run.pl: 1 / 4 failed, log is in log/x.*.log" in r.stderr
    assert "failed (code 3): log/x.3.log" in r.stderr
    assert "log/x.1.log" not in r.stderr and "log/x.4.log" not in r.stderr
    assert "broken 3" in r.stderr  # the failed job's last lines are shown
    log3 = (tmp_path / "log" / "x.3.log").read_text()
    assert "broken 3" in log3 and "# Ended (code 3)" in log3  # stderr went to the log
    for i in (1, 2, 4):
        assert "# Ended (code 0)" in (tmp_path / "log" / f"x.{i}.log").read_text()


def test_every_failed_log_is_listed(tmp_path: Path) -> None:
    r = run_pl(["JOB=1:5", "log/x.JOB.log", "bash", "-c", "exit $(( JOB % 2 ))"], tmp_path)
    assert r.returncode == 1
    assert "3 / 5 failed" in r.stderr
    listed = re.findall(r"failed \(code 1\): (\S+)", r.stderr)
    assert listed == ["log/x.1.log", "log/x.3.log", "log/x.5.log"]


@pytest.mark.parametrize("limit", [1, 2])
def test_max_jobs_run_bounds_concurrency(tmp_path: Path, limit: int) -> None:
    cmd = "date +%s.%N > t/JOB; sleep 0.4; date +%s.%N >> t/JOB"
    (tmp_path / "t").mkdir()
    t0 = time.monotonic()
    r = run_pl(["--max-jobs-run", str(limit), "JOB=1:4", "log/m.JOB.log", "bash", "-c", cmd], tmp_path)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    spans = intervals(sorted((tmp_path / "t").iterdir()))
    assert max_overlap(spans) <= limit
    assert elapsed >= 0.4 * 4 / limit - 0.05


def test_jobs_run_in_parallel_up_to_the_limit(tmp_path: Path) -> None:
    # 4 sleeping jobs with --max-jobs-run 4 overlap (sleep needs no CPU)
    (tmp_path / "t").mkdir()
    cmd = "date +%s.%N > t/JOB; sleep 1; date +%s.%N >> t/JOB"
    r = run_pl(["--max-jobs-run", "4", "JOB=1:4", "log/m.JOB.log", "bash", "-c", cmd], tmp_path)
    assert r.returncode == 0, r.stderr
    assert max_overlap(intervals(sorted((tmp_path / "t").iterdir()))) == 4


def test_pipes_redirections_and_quoting_like_kaldi(tmp_path: Path) -> None:
    script = tmp_path / "args.py"
    script.write_text("import sys\nprint(repr(sys.argv[1:]))\n")
    r = run_pl(
        [
            "JOB=1:2",
            "log/p.JOB.log",
            sys.executable,
            str(script),
            "ark:gunzip -c foo.JOB.gz|",
            'say "hi"',
            'it\'s "both"',
            "JOB",
            "|",
            "tr",
            "a-z",
            "A-Z",
            ">",
            "out.JOB.txt",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    for i in (1, 2):
        got = (tmp_path / f"out.{i}.txt").read_text().strip()
        assert got == repr([f"ark:gunzip -c foo.{i}.gz|", 'say "hi"', 'it\'s "both"', str(i)]).upper()
    # the header shows the command as bash ran it
    assert (tmp_path / "log" / "p.1.log").read_text().splitlines()[0].endswith("| tr a-z A-Z > out.1.txt")


def test_single_job_form_and_its_failure_message(tmp_path: Path) -> None:
    r = run_pl(["log/one.log", "echo", "alone"], tmp_path)
    assert r.returncode == 0
    assert body(tmp_path / "log" / "one.log") == ["alone"]
    r = run_pl(["log/two.log", "false"], tmp_path)
    assert r.returncode == 1
    assert "run.pl: job failed with code 1, log is in log/two.log" in r.stderr


def test_scheduler_options_are_accepted_and_num_threads_recorded(tmp_path: Path) -> None:
    r = run_pl(
        [
            "--mem",
            "2G",
            "--time",
            "1:00:00",
            "--config",
            "conf/none.conf",
            "--gpu",
            "0",
            "--num-threads",
            "3",
            "-q",
            "all.q",
            "JOB=1:2",
            "log/o.JOB.log",
            "true",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    # the seconds it took are the clock's (a second boundary can fall inside `true`), the threads ours
    assert re.search(r"^# Accounting: time=\d+ threads=3$", (tmp_path / "log" / "o.1.log").read_text(), re.M)


@pytest.mark.parametrize(
    "args, message",
    [
        (["JOB=1:3", "log/one.log", "true"], "one log file"),
        (["JOB=0:3", "log/x.JOB.log", "true"], ">= 1"),
        (["JOB=3:1", "log/x.JOB.log", "true"], "start > end"),
        (["--max-jobs-run", "0", "JOB=1:2", "log/x.JOB.log", "true"], "--max-jobs-run"),
        (["log/x.log"], "usage"),
    ],
)
def test_bad_arguments_fail_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    r = run_pl(args, tmp_path)
    assert r.returncode != 0
    assert message in r.stderr


def test_jobs_get_no_stdin_and_see_the_caller_environment(tmp_path: Path) -> None:
    r = subprocess.run(
        [str(RUN_PL), "log/e.log", "bash", "-c", "cat; echo VAR=$SPKFLOW_TEST_VAR; pwd"],
        cwd=tmp_path,
        input="should not be read\n",
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SPKFLOW_TEST_VAR": "seen"},
    )
    assert r.returncode == 0, r.stderr
    assert body(tmp_path / "log" / "e.log") == ["VAR=seen", str(tmp_path)]


def test_sigterm_is_forwarded_to_running_jobs(tmp_path: Path) -> None:
    (tmp_path / "pids").mkdir()
    proc = subprocess.Popen(
        [
            str(RUN_PL),
            "--max-jobs-run",
            "2",
            "JOB=1:3",
            "log/k.JOB.log",
            "bash",
            "-c",
            "echo $$ > pids/JOB; exec sleep 60",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while len(list((tmp_path / "pids").iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in (tmp_path / "pids").iterdir() if p.read_text().strip()]
    assert len(pids) == 2
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 143
    assert "interrupted by SIGTERM" in err
    for pid in pids:  # the sleeps are gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not (tmp_path / "log" / "k.3.log").exists()  # job 3 was never started
    assert "signal 15" in (tmp_path / "log" / "k.1.log").read_text().splitlines()[-1]


def test_gpu_jobs_get_their_own_devices(tmp_path: Path) -> None:
    # No GPU here: the device pool comes from CUDA_VISIBLE_DEVICES, which is what run.pl
    # reads first; the jobs only report what they were given.
    (tmp_path / "t").mkdir()
    cmd = "echo $CUDA_VISIBLE_DEVICES > t/dev.JOB; date +%s.%N > t/JOB; sleep 0.3; date +%s.%N >> t/JOB"
    r = run_pl(
        ["--gpu", "1", "JOB=1:4", "log/g.JOB.log", "bash", "-c", cmd], tmp_path, env={"CUDA_VISIBLE_DEVICES": "3,5"}
    )
    assert r.returncode == 0, r.stderr
    devs = [(tmp_path / "t" / f"dev.{i}").read_text().strip() for i in range(1, 5)]
    assert set(devs) == {"3", "5"}
    spans = intervals([tmp_path / "t" / str(i) for i in range(1, 5)])
    assert max_overlap(spans) <= 2  # one job per device
    # jobs running at the same time never share a device
    for i in range(4):
        for j in range(i + 1, 4):
            if spans[i][0] < spans[j][1] and spans[j][0] < spans[i][1]:
                assert devs[i] != devs[j]
    r = run_pl(
        ["--gpu", "2", "JOB=1:2", "log/h.JOB.log", "bash", "-c", "echo $CUDA_VISIBLE_DEVICES"],
        tmp_path,
        env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
    )
    assert r.returncode == 0
    assert {body(tmp_path / "log" / f"h.{i}.log")[0] for i in (1, 2)} == {"0,1", "2,3"}


def test_gpu_without_devices_runs_serially_with_a_warning(tmp_path: Path) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}  # no nvidia-smi on this PATH
    r = run_pl(["--gpu", "1", "JOB=1:2", "log/n.JOB.log", "true"], tmp_path, env=env)
    assert r.returncode == 0
    assert "WARNING: --gpu 1 but 0 GPU(s) visible" in r.stderr
