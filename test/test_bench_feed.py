"""test/bench/bench_feed.py runs tiny, so that the loader benchmark cannot rot: synthetic speech
(--data), two decaying impulses for rooms, 1 s utterances, 4 x 2 crops of 40 frames, two DataLoader
workers on every path.  The figures are not checked (a loaded machine), only that each path ran
through its loader and its parts and that the JSON has the shape docs/gpu.md and the issue read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.audio import decaying_rirs, make_speakers
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "test" / "bench"))
import bench_feed  # noqa: E402

PARTS = {
    "extract_fbank_workers": {"decode", "frontend", "pad"},
    "extract_fbank_device": {"decode", "pad"},
    "train_arks": {"read", "normalise"},
    "train_raw_aug": {"crop_read", "augment", "fbank"},
    "train_shards": {"read", "normalise", "shard_read"},
}


@pytest.mark.slow
def test_bench_feed_runs_tiny(tmp_path: Path) -> None:
    data = make_speakers(tmp_path / "audio", num_spk=3, num_utt=2, min_sec=2.5, max_sec=3.0)
    rirs = decaying_rirs(tmp_path / "rirs")
    out = tmp_path / "feed.json"
    result = bench_feed.main(
        [
            "--json", str(out), "--workers", "2", "--data", str(data), "--rirs", str(rirs), "--utt-sec", "1",
            "--clips", "6", "--extract-utts", "24", "--extract-batch", "4", "--num-spk", "4", "--num-utt", "2",
            "--crop", "40", "--train-batches", "4", "--ark-batches", "6", "--part-items", "4", "--runs", "2",
            "--workdir", str(tmp_path / "work"),
            "--audio-format", "wav",  # FLAC, the default, is what bench_gpu.py's clips are (test_bench_gpu.py)
        ]
    )  # fmt: skip
    assert (
        result["audio_format"] == "wav"
        and sorted(p.suffix for p in (tmp_path / "work" / "clips_wav").iterdir()) == [".wav"] * 6
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert set(bench_feed.PATHS) == set(PARTS) <= set(result)
    assert result["machine"]["cpus"] >= 1 and result["command"].startswith("python test/bench/bench_feed.py")
    for path, parts in PARTS.items():
        r = result[path]
        assert r["workers"] == 2 and r["reads"] == ("features" if path in ("train_arks", "train_shards") else "audio")
        assert r["items_per_s"] > 0 and r["ideal_items_per_s"] > 0 and r["cpu_ms_per_item"] > 0, (path, r)
        assert set(r["parts_cpu_ms_per_item"]) == parts and all(v > 0 for v in r["parts_cpu_ms_per_item"].values())
        # the ideal is the parts' per-core sum x workers, the share the measured rate over it
        ideal = 2 / (sum(r["parts_cpu_ms_per_item"].values()) / 1e3)
        assert r["ideal_items_per_s"] == pytest.approx(ideal, rel=0.02), (path, r)
        assert r["share"] == pytest.approx(r["items_per_s"] / r["ideal_items_per_s"], rel=0.02, abs=1e-3)
        # the items after each worker's first batch: the extraction's utterances, the N x M crops
        per_batch = 4 * 2 if path.startswith("train") else None
        assert r["batches"] > 2 and r["items_timed"] > 0
        # two fresh loaders timed: the figure is the slower run's (the lower middle), both listed
        assert len(r["runs_items_per_s"]) == 2 and r["items_per_s"] == min(r["runs_items_per_s"]), (path, r)
        if per_batch is not None:
            assert r["items_timed"] == per_batch * (r["batches"] - 2), (path, r)
    # the arks' path times its own count of batches (cheap ones: a few would time start-up), and
    # so does the loader with nothing in its batches, beside it
    assert result["train_arks"]["batches"] == 6 + 2 and result["train_raw_aug"]["batches"] == 4 + 2
    floor = result["loader_floor"]
    assert floor["batches"] == 6 + 2 and floor["batch"] == "8x40x80" and floor["workers"] == 2
    assert floor["cpu_ms_per_batch"] > 0 and floor["batches_per_s"] == min(floor["runs_batches_per_s"]) > 0
    # shards as a trainer reads them: the timed batches within one epoch (a loader over several
    # epochs of a small set keeps shards across their seams and reads fewer than training does)
    assert result["train_shards"]["batches"] <= result["train_shards"]["epoch_batches"]
    raw = result["train_raw_aug"]  # beside the parts, not among them
    assert raw["whole_decode_cpu_ms_per_item"] > 0 and raw["cached_crop_read_cpu_ms_per_item"] > 0
    extracted = result["extract_fbank_workers"]["items_timed"], result["extract_fbank_device"]["items_timed"]
    assert extracted[0] == extracted[1] and 0 < extracted[0] < 24
