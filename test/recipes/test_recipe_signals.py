"""SIGTERM to a recipe's run.sh stops the whole pipeline it started, and the rerun resumes.

A recipe made by egs/TEMPLATE/spk1/setup.sh, as a new user makes one, in training: its run.sh is
supervised like the demo's, the trainer writes the checkpoint of the last completed step at the
signal although the step in progress would take an hour (test/helpers/slow_step.py), ends by
itself, and the same command resumes to the model of an uninterrupted run.

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
import torch
import yaml

from helpers.audio import make_speakers
from helpers.models import l2, make_spkflow_model_dir
from helpers.paths import ROOT, TEMPLATE
from helpers.procs import processes_in, start_from_a_terminal, wait_until
from helpers.recipes import env, mirror_recipe, run
from helpers.slow_step import Slow, slow_env
from helpers.spread import within
from helpers.train import TINY_MODEL
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


TINY_CONFIG = {
    "frontend": {"vad": True, "mean_norm": False},
    "model": TINY_MODEL,
    "loss": {"name": "ge2e"},
    "optim": {"name": "adam", "lr": 0.01},
    "scheduler": {"name": "warmup_cosine", "warmup_steps": 2},
    "train": {"crop_min_frames": 20, "crop_max_frames": 30, "select": "average", "average_last": 2,
              "log_every": 1, "input_stats_utts": 10, "num_workers": 1},
}  # fmt: skip


def test_every_recipe_run_sh_is_supervised(tmp_path: Path) -> None:
    """The run.sh of every recipe, and the one setup.sh writes, put themselves under utils/supervise.sh."""
    recipe = tmp_path / "egs" / "mine" / "spk1"
    run(["bash", TEMPLATE / "setup.sh", recipe], cwd=tmp_path)
    for script in [recipe / "run.sh", *ROOT.glob("egs/*/*/run.sh")]:
        lines = [ln.split("#")[0].strip() for ln in script.read_text().splitlines()]
        assert ". utils/supervise.sh" in lines, script


def test_sigterm_to_a_new_recipe_in_training_checkpoints_and_stops_everything(tmp_path: Path) -> None:
    """A recipe made by setup.sh trains a tiny model on a folder of recordings (stages 1-4, a
    DataLoader worker); SIGTERM to its run.sh's pid comes while step 3 is under way and would take an
    hour, and writing the checkpoint takes 6 s, longer than the grace (SPKFLOW_STOP_GRACE=2).
    Before, the generated run.sh was not supervised: run.sh ended and training went on under PID 1;
    with the supervisor alone, the trainer, which had announced a checkpoint after the step, was
    killed at the grace without it.  Checked: the supervisors wait for the checkpoint being written,
    every process of the run then ends by itself (none killed), run.sh exits 143, the lock is
    released, checkpoint.pth holds the 2 steps taken, and the same command resumes to the model of an
    uninterrupted run (another tag)."""
    audio = make_speakers(tmp_path / "corpus", num_spk=6, num_utt=4, seed=11, min_sec=0.8, max_sec=1.2).parent
    recipe = tmp_path / "egs" / "mine" / "spk1"
    run(["bash", TEMPLATE / "setup.sh", recipe], cwd=tmp_path)
    (recipe / "conf" / "tiny.yaml").write_text(yaml.safe_dump(TINY_CONFIG))
    opts = ["--num_spk", "3", "--num_utt", "2", "--num_epochs", "2", "--train_config", "conf/tiny.yaml", "--nj", "1"]
    data = f"--train_dir {audio / 'audio'} --test_dir {audio / 'audio'}"
    run(["./run.sh", "--stage", "1", "--stop_stage", "3", "--local_data_opts", data, *opts], cwd=recipe)
    exp, marker = recipe / "exp" / "spk_tiny", tmp_path / "in_step_3"
    stage4 = ["./run.sh", "--stage", "4", "--stop_stage", "4", *opts]
    # step 3 would take an hour; the checkpoint at the signal takes 6 s more than the grace of 2 s
    in_step = Slow("spkflow.train.build", "Objective.forward", 3, marker)
    writing = Slow("spkflow.train.trainer", "save_checkpoint", 1, tmp_path / "writing", 6.0, "before")
    slow = slow_env(tmp_path, [in_step, writing], env())
    slow["SPKFLOW_STOP_GRACE"] = "2"
    p = start_from_a_terminal(stage4, slow, cwd=recipe, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: marker.exists() or p.poll() is not None, 600), "step 3 was not reached"
        assert p.poll() is None, p.communicate()[0][-3000:]
        running = processes_in(recipe)
        assert len(running) >= 8  # run.sh, spk.sh, train.sh (each with its supervisor), run.pl, trainer, worker
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        gone = wait_until(lambda: not processes_in(recipe), 120)
        left = [Path(f"/proc/{q}/cmdline").read_text().replace("\0", " ") for q in processes_in(recipe)]
        took = time.monotonic() - t0
        log = p.communicate(timeout=60)[0]
    finally:
        for q in processes_in(recipe):
            subprocess.run(["kill", "-KILL", str(q)], check=False)
        p.kill()
    assert gone, left
    print(f"{len(running)} processes of the run, all gone {took:.1f} s after SIGTERM")
    assert p.returncode == 143, log[-3000:]
    assert "still running" not in log, log[-3000:]  # no supervisor had to kill anything
    assert "waiting for 1 process(es) writing a checkpoint" in log, log[-3000:]
    assert not (exp / LOCK_NAME).exists()
    train_log = (exp / "train.log").read_text()
    assert "writing the checkpoint of the last completed step now" in train_log
    ck = torch.load(exp / "checkpoint.pth", weights_only=True)
    assert (ck["epoch"], ck["batch"], ck["step"]) == (1, 2, 2) and not (exp / "model.pth").exists()

    r = run(stage4, cwd=recipe)
    assert "Resuming from" in r.stdout + r.stderr
    run(["./run.sh", "--stage", "3", "--stop_stage", "4", "--tag", "ref", *opts], cwd=recipe)
    a = torch.load(recipe / "exp" / "spk_ref" / "model.pth", weights_only=True)
    b = torch.load(exp / "model.pth", weights_only=True)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
