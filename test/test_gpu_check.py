"""test/bench/gpu_check.sh, rehearsed on the CPU (GPU_CHECK_DEVICE=cpu) as CI runs it: the CUDA-marked
tests and bench_gpu.py at small sizes, on the real corpora from db.sh, and the report they leave
(gpu_check.json with device, fbank_max_abs_diff, extraction, train and the tests' counts;
gpu_check.md).  Without a GPU, ``GPU_CHECK_DEVICE=cuda`` must stop at once with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT

CHECK = ROOT / "test" / "bench" / "gpu_check.sh"


def run_check(out: Path, device: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPU_CHECK_DEVICE=device, PYTHON=sys.executable, TMPDIR=str(tmp_path))
    env["GPU_BUNDLE"] = str(tmp_path / "no_bundle")  # the corpora through db.sh, RIRs made here
    return subprocess.run(["bash", str(CHECK), str(out)], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.corpus
def test_gpu_check_rehearsed_on_the_cpu(tmp_path, corpus):
    for name in ("SPEECHOCEAN762", "LIBRISPEECH", "DSPSPEECH20", "FSDD"):
        corpus(name)  # skip (or fail under CI) when a corpus is missing
    out = tmp_path / "out"
    p = run_check(out, "cpu", tmp_path)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    r = json.loads((out / "gpu_check.json").read_text())
    assert r["device"] == "cpu" and r["check"] == {**r["check"], "device": "cpu", "tests_exit": 0, "bench_exit": 0}
    assert r["tests"]["failed"] == 0 and r["tests"]["passed"] >= 6  # the CUDA-marked tests ran, on the CPU
    assert 0 <= r["fbank_max_abs_diff"] < 1e-3
    assert set(r["parity"]["sets"]) == {"SPEECHOCEAN762", "LIBRISPEECH", "DSPSPEECH20", "FSDD", "dsp20_8k"}
    rows = r["extraction"]
    assert {(x["dtype"], x["fbank_on"]) for x in rows} == {
        (d, f) for d in ("float32", "bfloat16") for f in ("workers", "device")
    }
    assert all(x["e2e_utt_per_s"] > 0 and x["model_utt_per_s"] > 0 for x in rows)
    assert all(x["min_cosine_vs_float32"] >= 0.999 for x in rows if x["dtype"] == "bfloat16")
    assert [x["path"] for x in r["train"]["paths"]] == ["ark", "raw", "raw-device"]
    assert len(r["limits"]) == 4 and all("the limit is the" in s for s in r["limits"])
    md = (out / "gpu_check.md").read_text()
    assert md.startswith("# GPU check: cpu") and "| dsp20_8k |" in md and "| raw-device |" in md
    assert "limit is the" in p.stdout and (out / "junit.xml").is_file() and (out / "bench.log").is_file()


def test_gpu_check_without_a_gpu_stops_with_a_clear_message(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    p = run_check(tmp_path / "out", "cuda", tmp_path)
    assert p.returncode == 1 and "torch sees no CUDA device (GPU_CHECK_DEVICE=cpu rehearses" in p.stderr
    bad = subprocess.run(["bash", str(CHECK)], capture_output=True, text=True)
    assert bad.returncode == 1 and "Usage:" in bad.stderr
