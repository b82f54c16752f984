"""SIGTERM to a stage script whose jobs run on a real scheduler cancels them (utils/supervise.sh
forwards the signal to the script's process group, where slurm.pl / queue.pl act on it with
scancel / qdel), against the single-host Slurm and Grid Engine the suite starts
(test/helpers/schedulers.py).

scripts/feats/make_fbank.sh runs two array tasks on slow Kaldi pipes; when both have started,
its pid gets SIGTERM.  Checked: within 10 s the scheduler no longer lists the job, no process of
the run is left (the tasks run in the submitting directory, so every process of the run has it as
working directory), the output dir's lock is released and the script exits 143.  Before the
supervisor, the script's trap waited for slurm.pl, which waited for the tasks: the job ran on.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.audio import make_speakers
from helpers.paths import ROOT
from helpers.procs import processes_in, wait_until
from spkflow.core.lock import LOCK_NAME

MAKE_FBANK = ROOT / "scripts" / "feats" / "make_fbank.sh"
CONF = ROOT / "egs" / "TEMPLATE" / "spk1" / "conf"


def jobs_listed(kind: str, env: dict[str, str], job: str) -> bool:
    if kind == "slurm":
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=30)
        return any(i.split("_")[0] == job for i in out.stdout.split())
    out = subprocess.run(["qstat", "-j", job], env=env, capture_output=True, text=True, timeout=30)
    return out.returncode == 0


@pytest.mark.parametrize(
    "kind", [pytest.param("slurm", marks=pytest.mark.slurm), pytest.param("sge", marks=pytest.mark.sge)]
)
def test_sigterm_to_a_stage_script_cancels_its_cluster_jobs(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    cluster = request.getfixturevalue(f"{kind}_cluster")
    runner = "slurm.pl" if kind == "slurm" else "queue.pl"
    src = make_speakers(tmp_path / "src", num_spk=2, num_utt=6, seed=5)
    data = tmp_path / "work" / "data"
    data.mkdir(parents=True)
    for f in ("utt2spk", "spk2utt"):
        (data / f).write_text((src / f).read_text())
    wav = [line.split(" ", 1) for line in (src / "wav.scp").read_text().splitlines()]
    (data / "wav.scp").write_text("".join(f"{u} sleep 3; cat {p} |\n" for u, p in wav))
    work, out = tmp_path / "work", tmp_path / "work" / "fbank"
    env = {**os.environ, **cluster.env, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    cmd = [str(MAKE_FBANK), "--cmd", runner, "--nj", "2", "--fbank-conf", str(CONF / "fbank.conf")]
    cmd += ["--vad-conf", str(CONF / "vad.conf"), str(data), str(out)]
    p = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        logs = [out / "log" / f"make_fbank_data.{i}.log" for i in (1, 2)]

        def started() -> bool:
            return all(lg.exists() and "#\n" in lg.read_text() for lg in logs) or p.poll() is not None

        assert wait_until(started, 120), "the tasks did not start"
        assert p.poll() is None, p.communicate()[1][-3000:]
        job = re.search(rf"as {kind} job (\d+)", logs[0].read_text()).group(1)
        assert jobs_listed(kind, env, job) and (out / LOCK_NAME).exists()
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        stopped = wait_until(lambda: not jobs_listed(kind, env, job) and not processes_in(work), 10)
        took = time.monotonic() - t0
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert stopped, (jobs_listed(kind, env, job), processes_in(work))
    print(f"{kind} job {job} cancelled and every process gone {took:.1f} s after SIGTERM")
    assert p.returncode == 143, err
    assert f"cancelled {kind} job {job}" in err
    assert not (out / LOCK_NAME).exists()
