"""test/bench/bench_gpu.py runs on the CPU with small sizes, so that the GPU benchmark cannot rot:
audio made here (--data; the benchmark itself cuts real speech into 6 s clips), ECAPA with random
weights (few channels), stage 5's extraction job end to end and the model alone with the fbank in the
workers and on the device, the VoxCeleb config's training fed by the ark and raw loaders and the model
alone.  No GPU on the test machines: the GPU utilisation columns are checked to be empty on the CPU.
DataLoader workers are off (--num-workers 0: the same code in-process, no worker start-up).  The
parity part needs the corpora and runs in test/test_gpu_check.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.audio import decaying_rirs, make_speakers
from helpers.cudart import TimedEvents
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "test" / "bench"))
import bench_gpu  # noqa: E402


@pytest.mark.slow
def test_bench_gpu_runs_on_cpu(tmp_path: Path, capsys) -> None:
    data = make_speakers(tmp_path / "audio", num_spk=3, num_utt=2, min_sec=2.5, max_sec=3.0)
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    # the model dir of a "trained" model: the random ECAPA of another width stands in for it
    demo = bench_gpu.ecapa_model_dir(tmp_path / "demo", 8)
    rirs = decaying_rirs(tmp_path / "rirs")
    result = bench_gpu.main(
        [
            "--device", "cpu", "--data", str(data), "--parts", "extraction,train", "--utt-sec", "2",
            "--num-utts", "6", "--num-clips", "3", "--batch-sizes", "1,4", "--dtypes", "bfloat16,float32",
            "--channels", "16", "--num-workers", "0", "--threads", "1", "--model-dir", str(demo),
            "--train-steps", "2", "--train-warmup", "1", "--num-spk", "2", "--num-utt", "2", "--crop", "40",
            "--data-spk", "3", "--rirs", str(rirs), "--workdir", str(tmp_path / "work"), "--json", str(out),
            "--markdown", str(md),
        ]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["machine"]["device"] == result["device"] == "cpu" and result["tests"] is None
    rows = result["extraction"]  # float32 first: the reference of the bfloat16 parity
    assert [(r["model"], r["dtype"], r["fbank_on"], r["batch_size"]) for r in rows] == [
        (m, dt, f, b) for m in ("ecapa16", str(demo)) for dt in ("float32", "bfloat16")
        for f in ("workers", "device") for b in (1, 4)
    ]  # fmt: skip
    for r in rows:
        assert r["utts"] == 6 and r["e2e_utt_per_s"] > 0 and r["model_utt_per_s"] > 0 and r["audio_format"] == "flac"
        assert list(r["gpu_util_e2e"]) == [None, None] and r["limit"] in ("loader", "model", "job loop")
        # the job's own account of its waits for batches decides between the loader and its loop
        assert 0 <= r["e2e_data_wait_share"] <= 1
        assert r["limit"] == bench_gpu.extraction_limit(r["e2e_over_model"], r["e2e_data_wait_share"])
        # the device's stream is CUDA's: nothing to account for on the CPU
        assert r["device_busy_share"] is None and r["device_ms_per_batch"] is None and r["model_ms_per_batch"] > 0
        assert r["page_locked"] is None  # CUDA's: nothing is page-locked on the CPU
        if r["dtype"] == "float32":
            assert r["min_cosine_vs_float32"] is None
        else:  # bf16 autocast on the CPU, against float32, on the same clips
            assert 0.99 <= r["min_cosine_vs_float32"] < 1.0
    tr = result["train"]
    assert tr["config"] == "egs/voxceleb/spk1/conf/train_ecapa_c512_aam.yaml" and tr["amp"] is False
    assert [r["path"] for r in tr["paths"]] == ["ark", "raw", "raw-device", "trainer"]  # the trainer itself last
    for r in tr["paths"]:
        assert r["loader_steps_per_s"] > 0 and r["over_model"] > 0 and 0 <= r["data_wait_share"] <= 1
        assert r["limit"] == bench_gpu.training_limit(r["over_model"], r["data_wait_share"])
    assert (tmp_path / "work" / "trainer" / "exp" / "checkpoint.pth").is_file()  # it trained, and stopped
    assert len(result["limits"]) == 5 and result["limits"][0].startswith("extraction: best end to end")
    assert "the benchmark's own step on the same loader path (raw) " in result["limits"][-1]  # fbank in the workers
    printed = capsys.readouterr().out
    assert "| model | dtype | batch | fbank |" in printed and "| path | steps/s fed by the loader |" in printed
    assert md.read_text() in printed


def test_extraction_limit_follows_the_jobs_waits() -> None:
    """Under 90 % of the model alone, the job's waits for batches say which side held it back: the
    loader when it waited more than a quarter of its loop (or did not say), else its own loop."""
    assert bench_gpu.extraction_limit(0.95, 0.6) == "model"
    assert bench_gpu.extraction_limit(0.4, 0.6) == "loader" and bench_gpu.extraction_limit(0.4, None) == "loader"
    assert bench_gpu.extraction_limit(0.4, 0.11) == "job loop"
    row = {"e2e_utt_per_s": 2523.0, "dtype": "bfloat16", "batch_size": 256, "fbank_on": "device",
           "audio_format": "wav", "e2e_over_model": 0.31, "model_utt_per_s": 8130.0,
           "e2e_data_wait_share": 0.11, "limit": "job loop"}  # fmt: skip
    said = bench_gpu.limits({"extraction": [row]})[0]
    assert "the limit is the job's own loop, not the loader (it waited for batches 11% of the time)" in said
    # a loader-bound run says its share; a run that did not count its waits says none
    row.update(e2e_data_wait_share=0.6, limit="loader")
    assert bench_gpu.limits({"extraction": [row]})[0].endswith("padding; the job waited for batches 60% of its loop)")
    row.update(e2e_data_wait_share=None)
    assert bench_gpu.limits({"extraction": [row]})[0].endswith("the loader (CPU workers: decode, fbank, padding)")


def test_a_device_busy_through_the_loop_is_the_limit_said_with_its_milliseconds() -> None:
    """With CUDA's account of the device's stream: inside a batch 90 % of the loop or more, the
    batches' own work on the GPU is the limit whatever the waits say; less, the waits decide."""
    assert bench_gpu.extraction_limit(0.6, 0.05, busy=0.97) == "device work"
    assert bench_gpu.extraction_limit(0.6, 0.6, busy=0.95) == "device work"
    assert bench_gpu.extraction_limit(0.6, 0.05, busy=0.5) == "job loop"
    assert bench_gpu.extraction_limit(0.95, 0.05, busy=0.99) == "model"
    row = {"e2e_utt_per_s": 4800.0, "dtype": "bfloat16", "batch_size": 256, "fbank_on": "device",
           "audio_format": "wav", "e2e_over_model": 0.58, "model_utt_per_s": 8296.0,
           "e2e_data_wait_share": 0.04, "device_ms_per_batch": 52.1, "model_ms_per_batch": 30.86,
           "device_busy_share": 0.96, "limit": "device work"}  # fmt: skip
    said = bench_gpu.limits({"extraction": [row]})[0]
    assert "the limit is the work of each batch on the GPU (52.1 ms a batch on the device against 30.9" in said
    assert "the device busy 96% of the loop" in said and "waited for batches 4%" in said
    row.update(device_busy_share=0.55, limit="job loop")
    said = bench_gpu.limits({"extraction": [row]})[0]
    assert "job's own loop" in said and "the device busy 55% of the loop" in said


def test_the_device_account_is_the_median_batch_and_the_share_of_the_loop_inside_one(monkeypatch) -> None:
    """Three batches on the device's clock: 10, 12 and 30 ms long, the stream idle 8 ms between the
    first two and none after: median 12 ms, busy 52 / 60 of the loop."""

    class Inner:
        device = "cuda:0"

        def launch_padded(self, feats, lengths):
            return feats

    monkeypatch.setattr(bench_gpu, "_timing_event", TimedEvents([0, 10, 18, 30, 30, 60]))
    timed = bench_gpu.TimedEmbedder(Inner())
    for k in range(3):
        timed.launch_padded(k, None)
    assert timed.device_account() == (12.0, round(52 / 60, 3))
    assert bench_gpu.TimedEmbedder(Inner()).device_account() == (None, None)


def test_training_limit_follows_the_step_loops_waits() -> None:
    """Training fed by a loader under 90 % of the model alone: the step loop's waits for batches
    say whether the loader or the loop's own main thread held it back."""
    assert bench_gpu.training_limit(0.95, 0.5) == "model"
    assert bench_gpu.training_limit(0.8, 0.4) == "loader" and bench_gpu.training_limit(0.8, None) == "loader"
    assert bench_gpu.training_limit(0.8, 0.03) == "step loop"
    tr = {"model_steps_per_s": 33.98, "paths": [
        {"path": "raw-device", "loader_steps_per_s": 27.2, "over_model": 0.8, "data_wait_share": 0.03,
         "limit": "step loop"},
        {"path": "raw", "loader_steps_per_s": 19.7, "over_model": 0.58, "data_wait_share": 0.41, "limit": "loader"},
        {"path": "trainer", "loader_steps_per_s": 23.8, "over_model": 0.7, "data_wait_share": 0.02,
         "limit": "step loop"},
    ], "fbank_device": True}  # fmt: skip
    said = bench_gpu.limits({"train": tr})
    assert "the limit is the step loop, not the loader (it waited for batches 3% of the time)" in said[0]
    assert (
        "the limit is the loader (CPU workers: reading, augmentation, fbank; the step loop waited for batches 41%"
        in said[1]
    )
    # the trainer beside the benchmark's loop on its own loader path (the fbank on the device here)
    assert said[2].endswith(
        "the benchmark's own step on the same loader path (raw-device) 80%: the difference is the trainer's own "
        "work in a step (labels, re-seeding, the loss and gradient norm read back for its checks, the monitor)"
    )
