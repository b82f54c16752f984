"""End-to-end tests of scripts/spk/extract_embeddings.sh (spkflow toolkit) through run.pl,
stage 5 of spk.sh, resume after SIGKILL, bad input, and scripts/spk/align_embed_scp.sh.

Real audio files (wav/flac at 8, 16 and 22.05 kHz, and Kaldi ``cmd |`` pipes), a tiny real
spkflow model with random weights, real processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from helpers.audio import make_mixed_data, make_speakers, write_data_dir_by_prefix
from helpers.models import l2, make_spkflow_model_dir
from helpers.paths import ROOT
from helpers.procs import process_alive, process_children, process_tree, run_py, small_disk
from helpers.recipes import PY, SCRIPT, env, template_recipe
from helpers.spread import within

ALIGN = ROOT / "scripts" / "spk" / "align_embed_scp.sh"


def run(args: list[str], cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["bash", *map(str, args)], cwd=cwd, env=env(), capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_spkflow_model_dir(tmp_path_factory.mktemp("model") / "spk_tiny")


def alone_embeddings(model_dir: Path, data: Path) -> dict[str, np.ndarray]:
    """Batch-1 reference, one utterance at a time, in this process."""
    from spkflow.embed.native import SpkflowEmbedder

    emb = SpkflowEmbedder(model_dir)
    prep = emb.preparer(data)
    utts = (data / "utt2spk").read_text().split()[::2]
    return {u: emb.embed([prep(u)])[0] for u in utts}


def test_stage5_nj2_batched_equals_batch1_on_mixed_rates(model_dir, tmp_path, monkeypatch):
    """Stage 5 of spk.sh in a recipe dir: nj=2 jobs, batches of 4 over mixed rates and lengths."""
    recipe = template_recipe(tmp_path / "egs" / "demo" / "spk1")
    data = make_mixed_data(recipe / "corpus")
    (recipe / "data").mkdir()
    os.rename(data, recipe / "data" / "test")
    exp = recipe / "exp" / "spk_tiny"
    exp.mkdir(parents=True)
    for f in ("config.yaml", "model.pth"):
        (exp / f).write_bytes((model_dir / f).read_bytes())
    p = run(
        [
            "spk.sh",
            "--stage",
            "5",
            "--stop_stage",
            "5",
            "--tag",
            "tiny",
            "--test_sets",
            "test",
            "--nj",
            "2",
            "--embed_batch_size",
            "4",
        ],
        cwd=recipe,
    )
    assert "Stage 5: embedding extraction for test" in p.stdout + p.stderr
    out = exp / "embed" / "test"
    monkeypatch.chdir(recipe)  # scp paths are relative to the recipe dir, as in Kaldi and ESPnet
    assert (out / "xvector.scp").read_text().startswith("s0-u0 exp/spk_tiny/embed/test/xvector.ark:")
    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    utts = (recipe / "data" / "test" / "utt2spk").read_text().split()[::2]
    assert list(xv) == utts  # one per utterance, data-dir (LC_ALL=C) order
    ref = alone_embeddings(model_dir, recipe / "data" / "test")
    diff = max(float(np.abs(l2(xv[u]) - l2(ref[u])).max()) for u in utts)
    # measured <= 9.7e-7 (1 and 2 threads)
    within("stage 5 vs alone (L2-normalised)", diff, 1e-4)
    # the jobs really were parallel and batched, with progress in their logs
    logs = sorted((out / "log").glob("extract_test.*.log"))
    assert len(logs) == 2
    for lg in logs:
        text = lg.read_text()
        assert "utt/s" in text and "batches (at most 4 utterances" in text
    # speaker means: the mean of the speaker's utterance vectors
    sp = kaldiio.load_scp(str(out / "spk_xvector.scp"))
    for line in (recipe / "data" / "test" / "spk2utt").read_text().splitlines():
        spk, *members = line.split()
        np.testing.assert_allclose(sp[spk], np.mean([xv[u] for u in members], axis=0), rtol=1e-5, atol=1e-6)


def _commit_lines(jobs: Path) -> list[str]:
    lines = []
    for p in sorted(jobs.glob("xvector.*.scp")):
        lines += [ln.split()[0] for ln in p.read_text().splitlines() if ln]
    return lines


def test_resume_after_sigkill_computes_only_the_missing(model_dir, tmp_path):
    data = make_speakers(tmp_path, num_spk=3, num_utt=4, seed=7)
    # Kaldi pipes that take a while: the job is slow enough to be killed mid-way
    wav = "".join(
        f"{u} sleep 0.25; cat {p} |\n" for u, p in (ln.split() for ln in (data / "wav.scp").read_text().splitlines())
    )
    (data / "wav.scp").write_text(wav)
    utts = (data / "utt2spk").read_text().split()[::2]
    out = tmp_path / "out"
    jobs = out / "jobs"
    job = subprocess.Popen(
        [
            str(PY),
            "-m",
            "spkflow.bin.extract_embeddings",
            "--model-dir",
            str(model_dir),
            "--batch-size",
            "1",
            "--num-workers",
            "0",
            "--no-progress",
            str(data),
            str(jobs),
        ],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(_commit_lines(jobs) if jobs.is_dir() else []) < 3:
            time.sleep(0.05)
        os.kill(job.pid, signal.SIGKILL)
    finally:
        job.wait()
    done_before = _commit_lines(jobs)
    assert 3 <= len(done_before) < len(utts), "the job should have been killed mid-way"
    assert not (out / "xvector.scp").exists()
    p = run([SCRIPT, "--nj", "2", "--batch-size", "3", "--model-dir", model_dir, data, out])
    logs = "".join(lg.read_text() for lg in sorted((out / "log").glob("extract_out.*.log")))
    resumed = [int(x) for x in re.findall(r"(\d+) already done by an earlier run", logs)]
    assert len(resumed) == 2 and sum(resumed) == len(done_before)
    assert "resuming after" in p.stderr
    lines = _commit_lines(jobs)
    assert sorted(lines) == sorted(utts), "every utterance computed exactly once over both runs"
    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    assert list(xv) == utts
    ref = alone_embeddings(model_dir, data)
    # measured <= 9.7e-7 (1 and 2 threads)
    within("stage 5 vs alone (L2-normalised)", max(float(np.abs(l2(xv[u]) - l2(ref[u])).max()) for u in utts), 1e-4)


def test_bad_utterance_fails_naming_it_then_skip_bad(model_dir, tmp_path):
    data = make_speakers(tmp_path, num_spk=3, num_utt=2, seed=9)
    wav = dict(ln.split(" ", 1) for ln in (data / "wav.scp").read_text().splitlines())
    Path(wav["spk000-utt01"]).write_bytes(b"RIFF\x00\x00not really a wav file")
    wav["spk002-utt00"] = "/nonexistent/a.wav"
    wav["spk002-utt01"] = "/nonexistent/b.wav"
    (data / "wav.scp").write_text("".join(f"{k} {v}\n" for k, v in sorted(wav.items())))
    out = tmp_path / "out"
    p = run([SCRIPT, "--nj", "2", "--model-dir", model_dir, data, out], check=False)
    assert p.returncode != 0
    assert "spk000-utt01" in p.stderr or "spk002-utt0" in p.stderr
    assert "--skip-bad true" in p.stderr
    assert not (out / "xvector.scp").exists()
    run([SCRIPT, "--nj", "1", "--skip-bad", "true", "--model-dir", model_dir, data, out])
    bad = dict(ln.split(" ", 1) for ln in (out / "bad_utts").read_text().splitlines())
    assert sorted(bad) == ["spk000-utt01", "spk002-utt00", "spk002-utt01"]
    assert "not found" in bad["spk002-utt00"]
    assert (out / "bad_spks").read_text().split()[0] == "spk002"
    assert list(kaldiio.load_scp(str(out / "xvector.scp"))) == ["spk000-utt00", "spk001-utt00", "spk001-utt01"]
    assert list(kaldiio.load_scp(str(out / "spk_xvector.scp"))) == ["spk000", "spk001"]


def test_model_dir_is_checked_before_any_job(tmp_path, speakers):
    p = run([SCRIPT, "--model-dir", tmp_path / "missing", speakers, tmp_path / "out"], check=False)
    assert p.returncode == 1 and "missing: model not found" in p.stderr
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.pth").write_bytes(b"")
    p = run([SCRIPT, "--model-dir", tmp_path / "m", speakers, tmp_path / "out"], check=False)
    assert p.returncode == 1 and "m: no config.yaml: not a model dir" in p.stderr
    p = run([SCRIPT, speakers, tmp_path / "out"], check=False)
    assert p.returncode == 1 and "--model-dir is required" in p.stderr
    assert not (tmp_path / "out").exists()


def test_align_embed_scp_script(tmp_path, speakers):
    utts = (speakers / "utt2spk").read_text().split()[::2]
    scp = tmp_path / "xvector.scp"
    lines = [f"{u} x.ark:{i}\n" for i, u in enumerate(utts)]
    scp.write_text("".join(reversed(lines)) + "other-utt x.ark:99\n")
    spk = tmp_path / "spk_xvector.scp"
    spk.write_text("spk003 y.ark:3\nspk000 y.ark:0\nspk002 y.ark:2\nspk001 y.ark:1\n")
    p = run([ALIGN, speakers, scp, spk])
    assert scp.read_text() == "".join(lines)
    assert spk.read_text().split()[::2] == ["spk000", "spk001", "spk002", "spk003"]
    assert "aligned with utt2spk, 1 dropped" in p.stderr
    broken = tmp_path / "broken.scp"
    broken.write_text("".join(lines[:4] + lines[5:]))
    p = run([ALIGN, speakers, broken], check=False)
    assert p.returncode == 1
    assert f"line 5 should be '{utts[4]}'" in p.stderr
    assert broken.read_text() == "".join(lines[:4] + lines[5:])


@pytest.mark.corpus
def test_real_heldout_audio_nj2_batched_equals_batch1(model_dir, tmp_path, corpus):
    """Real recordings this code was not written against — LibriSpeech (16 kHz, 6-20 s) and FSDD
    (8 kHz digits, under 1 s) — through extract_embeddings.sh with nj=2 and batches of 8: one
    vector per utterance in data-dir order, equal to batch-1 within 1e-4, speaker means, and
    ESPnet's own dataset reader loads both scps."""
    from espnet2.train.dataset import ESPnetDataset

    libri = sorted(corpus("LIBRISPEECH").rglob("*.flac"))[:8]
    fsdd = sorted((corpus("FSDD") / "recordings").glob("*"))[::50][:8]
    entries = {f"{p.stem.split('-')[0]}-{p.stem}": str(p) for p in libri}
    entries.update({f"{p.stem.split('_')[1]}-{p.stem}": str(p) for p in fsdd})
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, entries)
    utts = sorted(entries, key=str.encode)
    spk2utt: dict[str, list[str]] = {}
    for u in utts:
        spk2utt.setdefault(u.split("-")[0], []).append(u)
    out = tmp_path / "out"
    run([SCRIPT, "--nj", "2", "--batch-size", "8", "--model-dir", model_dir, data, out])
    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    assert list(xv) == utts
    ref = alone_embeddings(model_dir, data)
    diff = max(float(np.abs(l2(xv[u]) - l2(ref[u])).max()) for u in utts)
    # measured <= 9.7e-7 (1 and 2 threads)
    within("stage 5 vs alone (L2-normalised)", diff, 1e-4)
    sp = kaldiio.load_scp(str(out / "spk_xvector.scp"))
    assert list(sp) == sorted(spk2utt, key=str.encode)
    for spk, members in spk2utt.items():
        np.testing.assert_allclose(sp[spk], np.mean([xv[u] for u in members], axis=0), rtol=1e-5, atol=1e-6)
    last_spk = utts[-1].split("-")[0]
    for scp, key, vecs in ((out / "xvector.scp", utts[-1], xv), (out / "spk_xvector.scp", last_spk, sp)):
        _, item = ESPnetDataset([(str(scp), "spembs", "kaldi_ark")])[key]
        np.testing.assert_allclose(item["spembs"], vecs[key])


# ----------------------------------------------------------------------------- reliability (issue 16)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_spkflow_model_dir(tmp_path_factory.mktemp("model2") / "spk_other", seed=1)


@pytest.mark.parametrize("same_model", [False, True])
def test_two_extractions_into_one_dir_at_once(model_dir, other_model_dir, tmp_path, same_model):
    """Before: with different models both said Succeeded and xvector.scp held the second model's
    vectors; with the same model one could fail with a bare "mv: cannot stat ... model.stamp.tmp".
    Now one run is refused, naming the other, and the result is the other's model's."""
    data = make_speakers(tmp_path, num_spk=2, num_utt=3, seed=11)
    out = tmp_path / "out"
    models = [model_dir, model_dir if same_model else other_model_dir]
    runs = [
        subprocess.Popen(
            ["bash", str(SCRIPT), "--nj", "2", "--model-dir", str(m), str(data), str(out)],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for m in models
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in runs]
    ok = [i for i, (code, _) in enumerate(results) if code == 0]
    assert len(ok) == 1, results
    winner, loser = ok[0], 1 - ok[0]
    assert results[loser][0] == 1
    assert f"{out} is in use by another run: pid {runs[winner].pid} on " in results[loser][1]
    assert "cannot stat" not in results[loser][1] and "Succeeded" not in results[loser][1]
    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    ref = alone_embeddings(models[winner], data)
    assert list(xv) == list(ref)
    # measured <= 9.7e-7 (1 and 2 threads)
    within("stage 5 vs alone (L2-normalised)", max(float(np.abs(l2(xv[u]) - l2(ref[u])).max()) for u in ref), 1e-4)
    assert not (out / ".spkflow.core.lock").exists()


def test_jobs_and_merge_refuse_to_mix_models(model_dir, other_model_dir, tmp_path):
    """Whatever bypasses the lock: a job refuses a job dir stamped with another model, and the
    merge refuses embeddings of two models (before: silently mixed, same dimension)."""
    from spkflow.core.errors import InputError
    from spkflow.embed.native import SpkflowEmbedder
    from spkflow.embed.run import MergeError, merge_embeddings, run_job

    data = make_speakers(tmp_path, num_spk=2, num_utt=2, seed=12)
    utts = (data / "utt2spk").read_text().split()[::2]
    a, b = SpkflowEmbedder(model_dir), SpkflowEmbedder(other_model_dir)
    assert a.stamp != b.stamp and a.stamp.startswith("toolkit=spkflow ")
    jobs = tmp_path / "jobs"
    run_job(a, data, utts[:2], jobs, 1, num_workers=0, progress=False)
    run_job(b, data, utts[2:], jobs, 2, num_workers=0, progress=False)
    with pytest.raises(MergeError, match=r"different models: 1 of 2 part\(s\) differ\n  .*xvector\.2\.1\.stamp: "):
        merge_embeddings(data, jobs, tmp_path / "out")
    (jobs / "model.stamp").write_text(a.stamp + "\n")
    with pytest.raises(MergeError, match=r"expected: toolkit=spkflow "):
        merge_embeddings(data, jobs, tmp_path / "out")
    assert not (tmp_path / "out" / "xvector.scp").exists()
    with pytest.raises(InputError, match=r"model.stamp: the job dir holds embeddings of another model"):
        run_job(b, data, utts, jobs, 3, num_workers=0, progress=False)


def test_sigkilled_job_leaves_no_dataloader_worker(model_dir, tmp_path):
    """What the OOM killer does: SIGKILL of the job while its worker is stuck in a read (here a
    ``cmd |`` of the wav.scp that takes an hour; a hung network file system does the same).
    torch's own watchdog is only asked between items, so before the worker stayed, holding the
    job's files; and the read's command stayed too (its shell and the ``sleep``), until the
    command's own end.  The test waits for the stuck read itself, not for a time."""
    data = make_speakers(tmp_path, num_spk=2, num_utt=2, seed=13)
    utts = (data / "utt2spk").read_text().split()[::2]
    (data / "wav.scp").write_text("".join(f"{u} sleep 3600 |\n" for u in utts))
    (data / "utt2dur").unlink(missing_ok=True)
    jobs = tmp_path / "jobs"
    job = subprocess.Popen(
        [str(PY), "-m", "spkflow.bin.extract_embeddings", "--model-dir", str(model_dir), "--batch-size", "4",
         "--num-workers", "1", "--no-progress", str(data), str(jobs)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    workers: list[int] = []
    stuck: list[int] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not stuck and job.poll() is None:
            children = process_children()
            workers = children.get(job.pid, [])
            stuck = [c for w in workers for c in children.get(w, [])]  # the worker's `sleep 3600`
            time.sleep(0.05)
        assert len(workers) == 1 and stuck, "the job's worker never started its read"
        stuck = process_tree(workers[0])[1:]  # the read's shells and its `sleep`
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(map(process_alive, workers + stuck)):
            time.sleep(0.05)
        assert not process_alive(workers[0]), "the DataLoader worker outlived its job"
        assert not any(map(process_alive, stuck)), "the worker's wav.scp command outlived its job"
    finally:
        job.kill()
        children = process_children()
        left = workers + stuck
        for p in left:  # and what they started (the shell's `sleep`)
            left.extend(children.get(p, []))
        for p in left:
            if process_alive(p):
                os.kill(p, signal.SIGKILL)


def test_disk_full_in_the_merge_leaves_no_output(model_dir, tmp_path):
    """Before: spk_xvector.{ark,scp} stayed behind when xvector.ark did not fit, with a traceback."""
    import resource

    from spkflow.embed.native import SpkflowEmbedder
    from spkflow.embed.run import run_job

    data = make_speakers(tmp_path, num_spk=3, num_utt=4, seed=14)
    utts = (data / "utt2spk").read_text().split()[::2]
    jobs = tmp_path / "jobs"
    run_job(SpkflowEmbedder(model_dir), data, utts, jobs, 1, num_workers=0, progress=False)
    out = tmp_path / "out"
    with small_disk(out, 12) as preexec:  # 3 pages: spk_xvector.{ark,scp} fit, xvector.{ark,scp} do not
        if preexec is not None:  # RLIMIT_FSIZE: speaker files fit, the utterance ark does not

            def preexec() -> None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (400, 400))

        p = run_py(["-m", "spkflow.bin.merge_embeddings", data, jobs, out], preexec)
        assert p.returncode == 1
        assert "Traceback" not in p.stderr
        err = [ln for ln in p.stderr.splitlines() if "ERROR" in ln]
        assert len(err) == 1 and f"{out}/" in err[0] and "cannot write" in err[0]
        assert os.listdir(out) == []
    assert run_py(["-m", "spkflow.bin.merge_embeddings", data, jobs, out]).returncode == 0
    assert list(kaldiio.load_scp(str(out / "xvector.scp"))) == utts


@pytest.mark.parametrize("damage", ["truncated", "code"])
def test_unusable_model_file_is_named_and_no_resume_is_suggested(model_dir, tmp_path, speakers, damage):
    """Before: torch's traceback (naming no file, for code even suggesting weights_only=False),
    then "Re-run the same command to resume"."""
    import torch

    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.yaml").write_bytes((model_dir / "config.yaml").read_bytes())
    weights = (model_dir / "model.pth").read_bytes()
    if damage == "truncated":
        (bad / "model.pth").write_bytes(weights[: len(weights) // 2])
    else:
        torch.save({"model": torch.load(model_dir / "model.pth"), "hook": os.system}, bad / "model.pth")
    out = tmp_path / "out"
    p = run([SCRIPT, "--nj", "2", "--model-dir", bad, speakers, out], check=False)
    assert p.returncode == 1
    logs = "".join(lg.read_text() for lg in sorted((out / "log").glob("extract_out.*.log")))
    assert "Traceback" not in logs and "weights_only=False" not in logs + p.stderr
    # (spkflow.nnet.checkpoint's CheckpointError, once merged, words it alike: these fragments hold for both)
    want = "unreadable or truncated" if damage == "truncated" else r"holds pickled Python objects \(code\)"
    assert re.search(rf"cannot load the model: {re.escape(str(bad / 'model.pth'))}: {want}", p.stderr), p.stderr
    assert "Re-run the same command to resume" not in p.stderr
    assert "re-running with the same model will fail again" in p.stderr
