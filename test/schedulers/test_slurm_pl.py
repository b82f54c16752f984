"""utils/slurm.pl against a real single-node Slurm (slurmctld + slurmd + munged) that this
module starts and stops (test/helpers/schedulers.py). Skipped when not root or Slurm is not
installed, except under CI=true (tools/test.sh installs it as root).

No GPU exists on this machine: the test cluster declares one GPU backed by /dev/null, so
``--gpu 1`` is checked in the generated sbatch script and by Slurm really granting the
generic resource (it sets CUDA_VISIBLE_DEVICES), but no job can compute on a GPU here."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.schedulers import SlurmCluster, run_runner  # the slurm_cluster fixture: conftest.py
from helpers.schedulers import log_body as body

pytestmark = pytest.mark.slurm

SLURM_PL = ROOT / "utils" / "slurm.pl"


def slurm_pl(cluster: SlurmCluster, args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_runner(SLURM_PL, cluster.env, args, cwd, timeout)


def squeue_ids(cluster: SlurmCluster) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env={**os.environ, **cluster.env}, capture_output=True, text=True, timeout=30
    )
    return out.stdout.split()


def test_array_job_of_four_runs_with_pipes_and_venv_python(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    r = slurm_pl(
        slurm_cluster,
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
        assert re.search(rf"^# Running on \S+ as slurm job \d+, task {i}$", text, re.M)
        assert body(log) == [f"got: {ROOT / '.venv'} {i}"]
        assert "# Ended (code 0)" in text
        assert re.search(r"^# Accounting: time=\d+ threads=1$", text, re.M)
    script = (tmp_path / "exp" / "log" / "q" / "x.sh").read_text()
    assert "#SBATCH --array=1-4\n" in script
    assert f"#SBATCH --chdir={tmp_path}\n" in script


def test_a_failing_task_is_reported_with_its_log(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    r = slurm_pl(
        slurm_cluster,
        [
            "JOB=1:4",
            "log/f.JOB.log",
            "bash",
            "-c",
            "echo task JOB; [ JOB -ne 2 ] || { echo 'cannot read foo.scp' >&2; exit 7; }",
        ],
        tmp_path,
    )
    assert r.returncode == 1
    assert "slurm.pl: 1 / 4 failed, log is in log/f.*.log" in r.stderr
    assert "failed (code 7): log/f.2.log" in r.stderr
    assert "cannot read foo.scp" in r.stderr
    assert "cannot read foo.scp" in (tmp_path / "log" / "f.2.log").read_text()
    for i in (1, 3, 4):
        assert body(tmp_path / "log" / f"f.{i}.log") == [f"task {i}"]


def test_mem_threads_time_are_translated_and_granted(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    r = slurm_pl(
        slurm_cluster,
        [
            "--mem",
            "100M",
            "--num-threads",
            "2",
            "--time",
            "5",
            "JOB=1:2",
            "log/r.JOB.log",
            "bash",
            "-c",
            "echo cpus=$SLURM_CPUS_PER_TASK mem=$SLURM_MEM_PER_NODE",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "log" / "q" / "r.sh").read_text()
    for line in ("#SBATCH --mem=100M", "#SBATCH --cpus-per-task=2", "#SBATCH --time=5"):
        assert line + "\n" in script
    for i in (1, 2):
        assert body(tmp_path / "log" / f"r.{i}.log") == ["cpus=2 mem=100"]
        assert "threads=2" in (tmp_path / "log" / f"r.{i}.log").read_text()


def test_gpu_option_becomes_gres(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # The script must ask for the generic resource; the test node's "GPU" is /dev/null, so
    # Slurm grants it and exports CUDA_VISIBLE_DEVICES, but nothing runs on a GPU here.
    r = slurm_pl(slurm_cluster, ["--gpu", "1", "log/g.log", "bash", "-c", "echo gpus=$CUDA_VISIBLE_DEVICES"], tmp_path)
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "log" / "q" / "g.sh").read_text()
    assert "#SBATCH --gres=gpu:1\n" in script
    assert "--array" not in script
    assert body(tmp_path / "log" / "g.log") == ["gpus=0"]
    # more GPUs than the node has: refused at submission, with Slurm's reason
    r = slurm_pl(slurm_cluster, ["--gpu", "2", "log/g2.log", "true"], tmp_path)
    assert r.returncode == 1
    assert "error submitting the job" in r.stderr
    assert "#SBATCH --gres=gpu:2\n" in (tmp_path / "log" / "q" / "g2.sh").read_text()


def test_max_jobs_run_is_an_array_throttle(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    r = slurm_pl(
        slurm_cluster,
        [
            "--max-jobs-run",
            "1",
            "JOB=1:3",
            "log/m.JOB.log",
            "bash",
            "-c",
            "date +%s.%N > t/JOB; sleep 0.5; date +%s.%N >> t/JOB",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --array=1-3%1\n" in (tmp_path / "log" / "q" / "m.sh").read_text()
    spans = sorted(tuple(float(x) for x in (tmp_path / "t" / str(i)).read_text().split()) for i in (1, 2, 3))
    for (_, e1), (s2, _) in itertools.pairwise(spans):
        assert e1 <= s2  # never two at once


def test_recipe_config_file_is_used(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    conf = (ROOT / "egs" / "TEMPLATE" / "spk1" / "conf" / "slurm.conf").read_text()
    # a site option in the command line, and one translated option of our own
    conf = conf.replace("command sbatch --export=ALL", "command sbatch --export=ALL --nice=5")
    (tmp_path / "conf" / "slurm.conf").write_text(conf + "option tag=* --comment=$0\n")
    r = slurm_pl(slurm_cluster, ["--tag", "spkflow", "JOB=1:2", "log/c.JOB.log", "true"], tmp_path)
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "log" / "q" / "c.sh").read_text()
    assert "#SBATCH --nice=5\n" in script and "#SBATCH --comment=spkflow\n" in script
    # an option the config does not describe is an error naming the config
    r = slurm_pl(slurm_cluster, ["--colour", "red", "log/d.log", "true"], tmp_path)
    assert r.returncode != 0
    assert "--colour red is not described in conf/slurm.conf" in r.stderr
    r = slurm_pl(slurm_cluster, ["--config", "conf/missing.conf", "log/d.log", "true"], tmp_path)
    assert r.returncode != 0 and "conf/missing.conf" in r.stderr


def _wait_for_running_logs(logs: list[Path], timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() and "#\n" in p.read_text() for p in logs):
            m = re.search(r"as slurm job (\d+)", logs[0].read_text())
            assert m
            return int(m.group(1))
        time.sleep(0.1)
    raise AssertionError("the tasks did not start")


def test_a_task_cancelled_behind_our_back_is_reported(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = {**os.environ, **slurm_cluster.env}
    proc = subprocess.Popen(
        [str(SLURM_PL), "JOB=1:2", "log/l.JOB.log", "sleep", "120"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job = _wait_for_running_logs([tmp_path / "log" / f"l.{i}.log" for i in (1, 2)])
        subprocess.run(["scancel", str(job)], env=env, check=True, timeout=30)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "2 / 2 failed" in err
    assert "ended without status: slurm state CANCELLED" in err
    assert "log/l.1.log" in err and "log/l.2.log" in err
    assert waited < 20  # noticed within seconds, not after a long timeout
    print(f"cancelled job noticed after {waited:.1f} s")


def test_sigterm_cancels_the_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = {**os.environ, **slurm_cluster.env}
    proc = subprocess.Popen(
        [str(SLURM_PL), "JOB=1:2", "log/s.JOB.log", "sleep", "120"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job = _wait_for_running_logs([tmp_path / "log" / f"s.{i}.log" for i in (1, 2)])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
    assert f"cancelled slurm job {job}" in err
    deadline = time.monotonic() + 30
    while any(i.startswith(str(job)) for i in squeue_ids(slurm_cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(i.startswith(str(job)) for i in squeue_ids(slurm_cluster))


def test_single_job_form(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    r = slurm_pl(slurm_cluster, ["log/one.log", "echo", "it's done"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert body(tmp_path / "log" / "one.log") == ["it's done"]
    r = slurm_pl(slurm_cluster, ["log/bad.log", "exit", "4"], tmp_path)
    assert r.returncode == 1
    assert "slurm.pl: job failed (code 4), log is in log/bad.log" in r.stderr


def test_num_nodes_default_translation_is_one_task_per_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # The built-in (and recipe) translation asks for K nodes with one task each. The one-node
    # test cluster cannot grant two: Slurm accepts the job and leaves it pending for ever
    # (reason PartitionNodeLimit); slurm.pl must say so and cancel it rather than wait.
    r = slurm_pl(slurm_cluster, ["--num-nodes", "2", "log/n.log", "hostname"], tmp_path, timeout=60)
    assert r.returncode == 1
    assert "will not run: pending for ever (slurm reason PartitionNodeLimit" in r.stderr
    assert "log is in log/n.log" in r.stderr  # said and cancelled, not waited for (the timeout bounds it)
    script = (tmp_path / "log" / "q" / "n.sh").read_text()
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in script
    assert "srun --kill-on-bad-exit=1 ${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK} bash -c" in script
    # one node is what this cluster has: it runs, under srun, with the run.pl log conventions
    # (and the job's CPUs: srun is told --cpus-per-task, which it no longer inherits)
    r = slurm_pl(
        slurm_cluster,
        ["--num-nodes", "1", "--num-threads", "2", "log/one.log", "echo", "task $SLURM_PROCID of $SLURM_NTASKS",
         "cpus $SLURM_CPUS_PER_TASK step $SLURM_STEP_ID"],
        tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    log = tmp_path / "log" / "one.log"
    assert re.search(r"^# Running on \S+ as slurm job \d+, 1 tasks on \S+$", log.read_text(), re.M)
    assert body(log) == ["task 0 of 1 cpus 2 step 0"]


def test_num_nodes_tasks_share_one_log_and_a_failing_task_ends_the_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # The K tasks share the one test node (--ntasks=K instead of --nodes=K, see test_multinode.py).
    conf = (ROOT / "egs" / "TEMPLATE" / "spk1" / "conf" / "slurm.conf").read_text()
    conf = conf.replace("option num_nodes=* --nodes=$0 --ntasks-per-node=1", "option num_nodes=* --ntasks=$0")
    (tmp_path / "slurm.conf").write_text(conf)
    cfg = ["--config", "slurm.conf"]
    r = slurm_pl(
        slurm_cluster, [*cfg, "--num-nodes", "2", "log/t.log", "echo", "task $SLURM_PROCID of $SLURM_NTASKS"], tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert sorted(body(tmp_path / "log" / "t.log")) == ["task 0 of 2", "task 1 of 2"]
    assert "#SBATCH --ntasks=2\n" in (tmp_path / "log" / "q" / "t.sh").read_text()
    # task 1 fails at once, task 0 would sleep for 5 minutes: srun ends it, the job fails now
    t0 = time.monotonic()
    r = slurm_pl(
        slurm_cluster,
        [
            *cfg,
            "--num-nodes",
            "2",
            "log/f.log",
            "bash",
            "-c",
            "[ $SLURM_PROCID = 1 ] && { echo rank 1 fails; exit 3; }; exec sleep 300",
        ],
        tmp_path,
        timeout=120,
    )
    waited = time.monotonic() - t0
    assert r.returncode == 1
    assert "slurm.pl: job failed (code 1" in r.stderr and "log is in log/f.log" in r.stderr
    assert "rank 1 fails" in (tmp_path / "log" / "f.log").read_text()
    assert waited < 60, waited
    print(f"two-task job with a failing task ended after {waited:.1f} s")


def test_num_nodes_is_refused_where_it_cannot_work(tmp_path: Path) -> None:
    # Argument checks: no scheduler is reached (nothing is submitted).
    r = subprocess.run(
        [str(SLURM_PL), "--num-nodes", "2", "JOB=1:2", "log/a.JOB.log", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "cannot be combined with an array job" in r.stderr
    r = subprocess.run(
        [str(SLURM_PL), "--num-nodes", "0", "log/a.log", "true"], cwd=tmp_path, capture_output=True, text=True
    )
    assert r.returncode != 0 and "invalid --num-nodes '0'" in r.stderr
    queue_pl = ROOT / "utils" / "queue.pl"
    r = subprocess.run(
        [str(queue_pl), "--num-nodes", "2", "log/a.log", "true"], cwd=tmp_path, capture_output=True, text=True
    )
    assert r.returncode != 0 and "supported by slurm.pl only" in r.stderr
    assert not (tmp_path / "log").exists()
