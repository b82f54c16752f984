"""Stage 4 from shards (train.shards): a small real training reads its crops from shards,
equals the same training from the arks, and a resumed shard run equals an uninterrupted one."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.train import make_train_setup, train_options
from spkflow.data.shard_jobs import merge, prepare, write_job
from spkflow.train.batches import write_batch_list
from spkflow.train.shard_plan import plan_shard_epoch, read_utt2shard


def options(setup: dict[str, Any], out: Path, shards: bool, **kw: Any):
    cfg = json.loads(json.dumps(setup["config"]))
    cfg["train"]["shards"] = shards
    cfg["train"]["num_workers"] = kw.pop("num_workers", 0)
    return train_options(setup, out, valid=False, config=cfg, **kw)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.set_num_threads(1)
    s = make_train_setup(tmp_path_factory.mktemp("shardtrain"), num_spk=6, num_utt=6, N=3, M=2, epochs=2)
    feats = s["feats"]
    shutil.copy(s["data"] / "utt2spk", feats / "utt2spk")
    out = feats / "shards"
    prepare(feats, out, shard_utts=6, run=2, seed=0, voiced=True)  # as spk.sh writes them for frontend.vad
    write_job(feats, out, 1, 1)
    merge(out, 1)
    u2s = read_utt2shard(out / "utt2shard")
    for e in range(1, s["epochs"] + 1):  # stage 3 with --train_shards true
        write_batch_list(
            s["batches"] / f"epoch{e}.txt", plan_shard_epoch(s["data"] / "spk2utt", u2s, 3, 2, 0, e, pool=3)
        )
    return s


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pth", weights_only=True)


def test_shard_training_equals_ark_training(setup, tmp_path, caplog):
    from spkflow.train.trainer import Trainer

    with caplog.at_level(logging.INFO):
        Trainer(options(setup, tmp_path / "shards", True, num_workers=2)).run()
    assert "features read from shards, front to back" in caplog.text
    Trainer(options(setup, tmp_path / "arks", False)).run()
    a, b = _weights(tmp_path / "arks"), _weights(tmp_path / "shards")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resumed_shard_run_equals_uninterrupted(setup, tmp_path):
    from spkflow.train.trainer import Trainer

    full, part = tmp_path / "full", tmp_path / "part"
    Trainer(options(setup, full, True)).run()
    steps = len((setup["batches"] / "epoch1.txt").read_text().splitlines())
    assert steps >= 2
    Trainer(options(setup, part, True, max_steps=1)).run()  # stops inside epoch 1
    assert torch.load(part / "checkpoint.pth", weights_only=True)["batch"] == 1
    Trainer(options(setup, part, True, max_steps=steps + 1)).run()  # crosses into epoch 2
    Trainer(options(setup, part, True)).run()
    a, b = _weights(full), _weights(part)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ha = json.loads((full / "history.json").read_text())["history"]
    hb = json.loads((part / "history.json").read_text())["history"]
    assert [r["train_loss"] for r in ha] == [r["train_loss"] for r in hb]


def test_missing_shard_list_is_named_before_training(setup, tmp_path):
    from spkflow.core.errors import InputError
    from spkflow.train.trainer import Trainer

    lst = setup["feats"] / "shards" / "shards.list"
    keep = lst.read_text()
    lst.unlink()
    try:
        with pytest.raises(InputError, match="shards.list: shard list not found"):
            Trainer(options(setup, tmp_path / "x", True)).run()
    finally:
        lst.write_text(keep)
    assert not (tmp_path / "x" / "checkpoint.pth").exists()


def test_a_damaged_shard_stops_training_naming_the_shard_and_member(setup, tmp_path):
    """1,000 bytes flipped inside one voiced-feature member: spkflow.bin.train (one DataLoader
    worker) stops with one error line naming the shard and the member, exit status 1, before the
    batch that needs it is trained on, and writes no model."""
    import subprocess
    import sys

    import yaml

    from helpers.train import cli_args
    from spkflow.data.shards import ShardSet

    feats = tmp_path / "feats"
    shutil.copytree(setup["feats"], feats)  # the scps still name the arks, the shards are copies
    shards = ShardSet(feats / "shards" / "shards.list")
    first = (setup["batches"] / "epoch1.txt").read_text().split()[0]
    i = shards.utt2shard[first]
    shard = shards.load(i)
    off, size = shard.offsets["feats_voiced"][first], shard.sizes["feats_voiced"][first]
    path = Path(shards.path(i))
    raw = bytearray(path.read_bytes())
    n = min(1000, size - 64)
    raw[off + 64 : off + 64 + n] = bytes(b ^ 0xA5 for b in raw[off + 64 : off + 64 + n])
    path.write_bytes(bytes(raw))
    cfg = json.loads(json.dumps(setup["config"]))
    cfg["train"].update(shards=True, num_workers=1)
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    args = cli_args({**setup, "feats": feats}, tmp_path / "exp", tmp_path / "train.yaml")
    p = subprocess.run([sys.executable, "-m", "spkflow.bin.train", *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert any(f"{path.name}: member '{first}.feats_voiced' fails its checksum" in line for line in errors), p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "exp" / "model.pth").exists()
