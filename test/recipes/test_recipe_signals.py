"""SIGTERM to a recipe's run.sh stops the whole pipeline it started, and the rerun resumes.

The speechocean762 recipe (its real run.sh, spk.sh and stage scripts, in a mirror of the project)
runs stage 5 with two run.pl jobs on synthetic speech whose wav.scp entries are slow Kaldi pipes,
so the extraction is under way when run.sh's pid gets SIGTERM, as an operator or a batch system
sends it.  Before utils/supervise.sh, run.sh exited at once and spk.sh, run.pl, the extraction
jobs and their DataLoader workers went on under PID 1 (issue 35).  Checked: no process of the
run (every one has the recipe dir as its working directory) is left 10 s after the signal, the
output dir's lock is released, and running the same command again resumes (the jobs report the
utterances an earlier run did) to embeddings equal to a batch-1 reference.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from helpers.audio import make_speakers
from helpers.models import l2, make_spkflow_model_dir
from helpers.procs import processes_in, start_from_a_terminal, wait_until
from helpers.recipes import env, mirror_recipe
from helpers.spread import within
from spkflow.core.lock import LOCK_NAME

ARGS = ["--stage", "5", "--stop_stage", "5", "--test_sets", "test", "--score_backend", "cosine"]
ARGS += ["--score_norm", "false", "--calibrate", "false", "--nj", "2", "--embed_batch_size", "4"]


def committed(out: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in (out / "jobs").glob("xvector.*.scp"))


def test_sigterm_to_run_sh_in_stage5_stops_everything_and_the_rerun_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = mirror_recipe(tmp_path)
    src = make_speakers(tmp_path / "src", num_spk=4, num_utt=10, seed=3)
    data = recipe / "data" / "test"
    shutil.copytree(src, data)
    wav = [line.split(" ", 1) for line in (src / "wav.scp").read_text().splitlines()]
    (data / "wav.scp").write_text("".join(f"{u} sleep 0.3; cat {p} |\n" for u, p in wav))
    model_dir = make_spkflow_model_dir(recipe / "exp" / "spk_train")
    out = model_dir / "embed" / "test"

    p = start_from_a_terminal(["./run.sh", *ARGS], env(), cwd=recipe, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: committed(out) >= 3 or p.poll() is not None, 300), "extraction did not start"
        assert p.poll() is None, p.communicate()[0][-3000:]
        assert (out / LOCK_NAME).exists()
        running = processes_in(recipe)
        assert len(running) >= 8  # run.sh, spk.sh, extract_embeddings.sh (each with its supervisor), run.pl, 2 jobs
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        gone = wait_until(lambda: not processes_in(recipe), 10)
        left = [Path(f"/proc/{q}/cmdline").read_text().replace("\0", " ") for q in processes_in(recipe)]
        took = time.monotonic() - t0
        log = p.communicate(timeout=30)[0]
    finally:
        for q in processes_in(recipe):
            subprocess.run(["kill", "-KILL", str(q)], check=False)
        p.kill()
    assert gone, left
    print(f"{len(running)} processes of the run, all gone {took:.1f} s after SIGTERM")
    assert p.returncode == 143, log[-3000:]
    assert "Successfully finished" not in log
    assert not (out / LOCK_NAME).exists()
    done_before = committed(out)
    assert 3 <= done_before < 40 and not (out / "xvector.scp").exists()

    r = subprocess.run(["./run.sh", *ARGS], cwd=recipe, env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    logs = "".join(lg.read_text() for lg in sorted((out / "log").glob("extract_*.log")))
    assert "already done by an earlier run" in logs
    monkeypatch.chdir(recipe)  # the scp names its ark relative to the recipe dir, as Kaldi's do
    xv = dict(kaldiio.load_scp(str(out / "xvector.scp")))
    assert sorted(xv) == sorted(u for u, _ in wav)

    from spkflow.embed.native import SpkflowEmbedder

    emb = SpkflowEmbedder(model_dir)
    prep = emb.preparer(src)
    worst = max(float(np.abs(l2(xv[u]) - l2(emb.embed([prep(u)])[0])).max()) for u, _ in wav)
    within("resumed stage 5 vs alone (L2-normalised)", worst, 1e-4)  # measured <= 7.3e-7 (1 and 2 threads)
