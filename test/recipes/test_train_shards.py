"""spk.sh --train_shards true: stage 2 writes the training set's shards, stage 3 plans batches by
windows of them, stage 4 trains reading them (train.log says so); the shard step run again on
the same features writes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from helpers.audio import make_speakers
from helpers.recipes import run, template_recipe
from helpers.train import TINY_MODEL
from spkflow.data.shards import ShardSet
from spkflow.features.fbank import FbankOptions, VadOptions


def test_stages_2_to_4_from_shards(tmp_path: Path) -> None:
    recipe = template_recipe(tmp_path / "recipe")
    data = make_speakers(tmp_path / "audio", num_spk=6, num_utt=6, min_sec=0.5, max_sec=0.9)
    shutil.copytree(data, recipe / "data" / "train")
    (recipe / "conf").mkdir()
    (recipe / "conf" / "fbank.conf").write_text(FbankOptions(num_mel_bins=20).to_kaldi_conf())
    (recipe / "conf" / "vad.conf").write_text(VadOptions().to_kaldi_conf())
    cfg = {
        "model": TINY_MODEL,
        "loss": {"name": "ge2e"},
        "optim": {"name": "adam", "lr": 0.01},
        "train": {"crop_min_frames": 20, "crop_max_frames": 30, "input_stats_utts": 10, "num_workers": 1},
    }
    (recipe / "conf" / "train.yaml").write_text(yaml.safe_dump(cfg))
    args = ["--train_shards", "true", "--shard_utts", "6", "--shard_pool", "3", "--num_spk", "3", "--num_utt", "2"]
    args += ["--num_epochs", "2", "--test_sets", "train", "--nj", "2"]
    p = run(["bash", "spk.sh", "--stage", "2", "--stop_stage", "4", *args], cwd=recipe, timeout=600)
    shards = recipe / "dump" / "fbank" / "train" / "shards"
    assert len(ShardSet(shards / "shards.list")) == 6
    assert "Succeeded writing 6 shards" in p.stdout + p.stderr
    settings = (recipe / "exp" / "spk_train" / "batches" / "settings").read_text()
    assert f"shards={shards.relative_to(recipe)}" in settings and "pool=3" in settings
    summary = (recipe / "exp" / "spk_train" / "batches" / "log" / "summary.txt").read_text()
    assert summary.count("coverage") == 2
    log = (recipe / "exp" / "spk_train" / "train.log").read_text()
    assert "features read from shards, front to back: 6 shards" in log
    assert (recipe / "exp" / "spk_train" / "model.pth").is_file()
    # the shard step again on the same features: nothing is written anew
    before = {p.name: p.stat().st_mtime_ns for p in shards.glob("shard.*.tar")}
    make_shards = ["bash", "scripts/feats/make_shards.sh", "--shard-utts", "6", "dump/fbank/train", shards]
    run(make_shards, cwd=recipe, timeout=600)
    assert {p.name: p.stat().st_mtime_ns for p in shards.glob("shard.*.tar")} == before


def test_raw_audio_training_from_audio_shards(tmp_path: Path) -> None:
    """A config training on audio alone (feats_type raw, no VAD): stage 2 makes no features of the
    training set but packs its audio files into data/train/shards, and stage 4 reads them."""
    recipe = template_recipe(tmp_path / "recipe")
    data = make_speakers(tmp_path / "audio", num_spk=6, num_utt=4, min_sec=0.5, max_sec=0.9, fmt="flac")
    shutil.copytree(data, recipe / "data" / "train")
    (recipe / "conf").mkdir()
    (recipe / "conf" / "fbank.conf").write_text(FbankOptions(num_mel_bins=20).to_kaldi_conf())
    (recipe / "conf" / "vad.conf").write_text(VadOptions().to_kaldi_conf())
    cfg = {
        "frontend": {"feats_type": "raw", "vad": False, "mean_norm": False},
        "model": {**TINY_MODEL, "input_norm": "none"},
        "loss": {"name": "ge2e"},
        "optim": {"name": "adam", "lr": 0.01},
        "train": {"crop_min_frames": 20, "crop_max_frames": 30},
    }
    (recipe / "conf" / "train.yaml").write_text(yaml.safe_dump(cfg))
    args = ["--train_shards", "true", "--shard_utts", "8", "--shard_pool", "3", "--num_spk", "3", "--num_utt", "2"]
    args += ["--num_epochs", "1", "--test_sets", "", "--valid_set", "", "--nj", "1"]
    run(["bash", "spk.sh", "--stage", "2", "--stop_stage", "4", *args], cwd=recipe, timeout=600)
    assert not (recipe / "dump" / "fbank" / "train" / "feats.scp").exists()
    shards = ShardSet(recipe / "data" / "train" / "shards" / "shards.list")
    assert len(shards) == 3
    log = (recipe / "exp" / "spk_train" / "train.log").read_text()
    assert "audio read from shards, front to back: 3 shards" in log
