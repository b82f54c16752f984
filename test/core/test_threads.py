"""Thread discipline (spkflow.core.threads): each DataLoader worker and each job runs its torch,
OpenMP and BLAS pools at its share, whatever pools the process it came from had.

Each case runs in a fresh Python with no thread variable in its environment; the process first
sets its pools to :data:`WIDE` threads, as a machine with more CPUs than a worker's share leaves
them (numpy's OpenBLAS takes one thread per CPU when it loads), then reads the pools from inside
a real DataLoader worker (the training loader, an extraction job's loader) or from inside a
command's ``main`` at the point its work starts.  The same probe checks that the process keeps
its freed heap memory (:mod:`spkflow.core.heap`, set by the same call; glibc only): the premise is
a process that does not.  Mutant checked by hand: without the
``worker_threads`` line of ``procs.worker_init`` (or ``embed/loader.py:_worker_init``) the workers'
BLAS pool stays at WIDE and the loader cases fail; without a command's ``limit_threads`` line its
case fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.audio import make_speakers
from helpers.heap import HEAP_PROBE, PAGES
from helpers.models import make_spkflow_model_dir
from helpers.paths import ROOT
from spkflow.core.threads import SCHEDULER_ENV, THREAD_ENV, job_threads, limit_threads

WIDE = 4  # more threads than any share asked for below

PRELUDE = f"""
import json, os, sys
import numpy, threadpoolctl, torch
WIDE = {WIDE}
threadpoolctl.threadpool_limits(WIDE)
torch.set_num_threads(WIDE)

{HEAP_PROBE}
def pools():
    info = threadpoolctl.threadpool_info()
    assert any(i["user_api"] == "blas" for i in info), info
    return {{"pools": {{i["prefix"]: i["num_threads"] for i in info}}, "torch": torch.get_num_threads(),
            "heap_faults": heap_faults()}}

assert set(pools()["pools"].values()) == {{WIDE}}, pools()  # the test's premise: every pool wide
assert heap_faults() > {PAGES} / 2, heap_faults()  # and the heap handed back (glibc's default)
"""

TRAIN_WORKERS = """
from spkflow.train.loader import make_loader

class Probe(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return dict(pools(), pid=os.getpid())

seen = list(make_loader(Probe(), num_workers=2, prefetch_factor=2))
assert len({s["pid"] for s in seen} - {os.getpid()}) == 2, seen
json.dump(seen, open(sys.argv[1], "w"))
"""

EXTRACT_WORKERS = """
from spkflow.embed.open import open_embedder
from spkflow.embed.run import run_job

out, model, data, jobs = sys.argv[1:5]
emb = open_embedder(model, "spkflow", "cpu", jobs=True)
real = emb.preparer
seen = []

def preparer(d):
    prepare = real(d)
    def probe(utt):
        with open(os.path.join(jobs, f"pools.{os.getpid()}.{utt}"), "w") as f:
            json.dump(dict(pools(), pid=os.getpid()), f)
        return prepare(utt)
    return probe

emb.preparer = preparer
utts = [line.split()[0] for line in open(os.path.join(data, "wav.scp"))]
run_job(emb, data, utts, jobs, 1, batch_size=2, num_workers=2, progress=False)
seen = [json.load(open(os.path.join(jobs, n))) for n in sorted(os.listdir(jobs)) if n.startswith("pools.")]
assert len(seen) == len(utts) and os.getpid() not in {s["pid"] for s in seen}, seen
json.dump(seen, open(out, "w"))
"""

# each command's main with its first work call replaced by a probe that reports the pools and ends it;
# one process for them all (torch loads once), its pools and environment wide again before each
COMMANDS_SCRIPT = """
import importlib
out, cases = sys.argv[1], json.loads(sys.argv[2])
clean = dict(os.environ)
seen = {}
for command, target, argv in cases:
    os.environ.clear()
    os.environ.update(clean)
    threadpoolctl.threadpool_limits(WIDE)
    torch.set_num_threads(WIDE)
    owner, _, name = target.rpartition(".")

    def probe(*args, **kwargs):
        seen[command] = pools()
        raise SystemExit(0)

    setattr(importlib.import_module(owner), name, probe)
    try:
        importlib.import_module(f"spkflow.bin.{command}").main(argv)
    except SystemExit as stop:
        assert stop.code == 0, (command, stop.code)
json.dump(seen, open(out, "w"))
"""


def _run(script: str, *args: str | Path, **env: str):
    e = {k: v for k, v in os.environ.items() if k not in THREAD_ENV + SCHEDULER_ENV}
    e.update(PYTHONPATH=str(ROOT), **env)
    out = Path(str(args[0]))
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, *map(str, args)], env=e, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def _assert_share(seen: list[dict], share: int, what: str = "") -> None:
    for s in seen:
        assert set(s["pools"].values()) == {share}, (what, s)
        assert s["torch"] == share, (what, s)
        assert s["heap_faults"] < PAGES / 20, (what, s)  # its freed heap kept (spkflow.core.threads)


def test_training_loader_workers_run_one_thread_per_pool(tmp_path):
    _assert_share(_run(TRAIN_WORKERS, tmp_path / "seen.json"), 1)


def test_extraction_workers_run_one_thread_per_pool(tmp_path):
    data = make_speakers(tmp_path / "a", num_spk=2, num_utt=2)
    model = make_spkflow_model_dir(tmp_path / "model")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    _assert_share(_run(EXTRACT_WORKERS, tmp_path / "seen.json", model, data, jobs), 1)


# command: (the first call of its work, its arguments); the share: 1 from the scheduler (NSLOTS, as
# Grid Engine's -pe smp 1 gives it), or the command's --num-threads
COMMANDS = {
    "compute_fbank": ("spkflow.bin.compute_fbank.extract_job", ["d", "u", "a", "n", "1"]),
    "make_shards": ("spkflow.bin.make_shards.write_job", ["job", "f", "s", "1", "2"]),
    "diar_windows": ("spkflow.bin.diar_windows.make_windows", ["r", "o"]),
    "diar_cluster": ("spkflow.bin.diar_cluster.Scoring", ["--work-dir", "w", "--out", "o"]),
    "diarize": ("spkflow.bin.diarize.Settings", ["--model", "m", "--out", "o", "f.wav"]),
    "extract_embeddings": ("spkflow.bin.extract_embeddings.job_utterances", [
        "--num-threads", "1", "--model-dir", "m", "d", "j"]),
    "train": ("spkflow.train.config.load_train_config", [
        "--num-threads", "1", "--config", "c", "--train-data", "d", "--train-feats", "f", "--batches-dir", "b",
        "--num-epochs", "1", "--out-dir", "OUT"]),
}  # fmt: skip


def test_every_job_runs_its_share(tmp_path):
    """Stage 2's fbank and shard jobs, stage 5's extraction job, the trainer and the diarization
    commands each pin their pools before their work starts."""
    cases = [(c, t, [str(tmp_path / "out") if a == "OUT" else a for a in argv]) for c, (t, argv) in COMMANDS.items()]
    seen = _run(COMMANDS_SCRIPT, tmp_path / "seen.json", json.dumps(cases), NSLOTS="1")
    assert sorted(seen) == sorted(COMMANDS)
    for command, s in seen.items():
        _assert_share([s], 1, command)


def test_job_threads_reads_what_the_job_was_given(monkeypatch):
    for name in THREAD_ENV + SCHEDULER_ENV:
        monkeypatch.delenv(name, raising=False)
    assert job_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("NSLOTS", "3")
    assert job_threads() == 3
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "5")
    assert job_threads() == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # what a stage script or path.sh set wins
    assert job_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "zero")
    assert job_threads() == 5


def test_limit_threads_refuses_zero():
    with pytest.raises(ValueError, match="threads must be >= 1"):
        limit_threads(0)
