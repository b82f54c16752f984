"""test/bench/bench_gpu.py runs on the CPU with small sizes, so that the GPU benchmark cannot rot:
real audio made here (2-3 s), ECAPA with random weights (few channels), stage 5's extraction job
end to end and the model alone, stage 4's loader feeding training steps and the model alone.
No GPU on the test machines: the GPU utilisation columns are checked to be empty on the CPU.
DataLoader workers are off (--num-workers 0: the same code in-process, no worker start-up)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.audio import make_speakers
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "test" / "bench"))
import bench_gpu  # noqa: E402


@pytest.mark.slow
def test_bench_gpu_runs_on_cpu(tmp_path: Path, capsys) -> None:
    data = make_speakers(tmp_path / "audio", num_spk=3, num_utt=4, min_sec=2.0, max_sec=3.0)
    out = tmp_path / "bench.json"
    # the model dir of a "trained" model: the random ECAPA of another width stands in for it
    demo = bench_gpu.ecapa_model_dir(tmp_path / "demo", 8)
    result = bench_gpu.main(
        [
            "--device", "cpu", "--data", str(data), "--batch-sizes", "1,4", "--num-utts", "6",
            "--channels", "16", "--num-workers", "0", "--threads", "1", "--model-dir", str(demo),
            "--train-steps", "2", "--train-warmup", "1", "--num-spk", "2", "--num-utt", "2", "--crop", "40",
            "--workdir", str(tmp_path / "work"), "--json", str(out), "--dtypes", "bfloat16,float32",
        ]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["machine"]["device"] == "cpu" and result["machine"]["utts"] == 6
    lo, hi = result["machine"]["utt_s_range"]
    assert 2.0 <= lo <= hi <= 12.0
    rows = result["extraction"]  # float32 first: the reference of the bfloat16 parity
    assert [(r["dtype"], r["batch_size"], r["model"].split()[0]) for r in rows] == [
        (dt, b, m) for m in ("ecapa16", str(demo)) for dt in ("float32", "bfloat16") for b in (1, 4)
    ]  # fmt: skip
    for r in rows:
        assert r["utts"] == 6 and r["e2e_utt_per_s"] > 0 and r["model_utt_per_s"] > 0
        assert r["gpu_util_e2e"] == [None, None] or r["gpu_util_e2e"] == (None, None)
        assert r["limit"] in ("loader", "model")
        if r["dtype"] == "float32":
            assert r["min_cosine_vs_float32"] is None
        else:  # bf16 autocast on the CPU, against float32, on the same utterances
            assert 0.99 <= r["min_cosine_vs_float32"] < 1.0
    assert rows[0]["batches"] == 6 and rows[1]["batches"] == 2  # batch size B: ceil(6 / B) batches
    tr = result["training"]
    assert tr["loader_steps_per_s"] > 0 and tr["model_steps_per_s"] > 0 and tr["limit"] in ("loader", "model")
    assert tr["amp"] is False and tr["amp_dtype"] is None  # AMP is for CUDA only
    printed = capsys.readouterr().out
    assert "## extraction" in printed and "## training" in printed
