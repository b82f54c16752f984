"""DDP training with 2 real CPU processes (gloo) started by torchrun: disjoint batch shares,
all batches of an epoch used once, and an interrupted DDP run resumes to the same weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from helpers.paths import ROOT
from helpers.train import cli_args, make_train_setup

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # 8 speakers x 4 utterances, 2 x 2 batches: 8 batches per epoch, 4 per rank
    s = make_train_setup(tmp_path_factory.mktemp("ddp"), num_spk=8, num_utt=4, N=2, M=2, epochs=2)
    s["config_path"] = s["root"] / "train.yaml"
    s["config_path"].write_text(yaml.safe_dump(s["config"]))
    return s


def torchrun(setup: dict[str, Any], out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "spkflow.bin.train",
        *cli_args(setup, out, setup["config_path"]),
        *extra,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return r


@pytest.fixture(scope="module")
def full_run(setup: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("ddp_full") / "exp"
    r = torchrun(setup, out, "--trace-batches")
    return out, r.stderr


def test_two_gloo_processes_share_each_epoch(setup: dict[str, Any], full_run: tuple[Path, str]) -> None:
    from spkflow.nnet.models import load_model_dir

    out, stderr = full_run
    assert "DDP: rank 0 of 2 (gloo)" in stderr
    traces = {
        rank: [line.split() for line in (out / f"batch_trace.rank{rank}.txt").read_text().splitlines()]
        for rank in (0, 1)
    }
    for epoch in (1, 2):
        lines = (setup["batches"] / f"epoch{epoch}.txt").read_text().splitlines()
        seen: dict[int, int] = {}
        for rank, rows in traces.items():
            mine = [row for row in rows if row[0] == str(epoch)]
            assert [int(row[1]) for row in mine] == [0, 1, 2, 3]  # 4 steps per rank, in order
            for row in mine:
                line = int(row[2])
                assert (line - 1) % 2 == rank  # rank r takes lines r, r+2, ...
                assert " ".join(row[3:]) == lines[line - 1]  # and trains on exactly that batch
                assert line not in seen
                seen[line] = rank
        assert sorted(seen) == list(range(1, len(lines) + 1))  # disjoint and complete
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert ck["world_size"] == 2 and ck["step"] == 8 and ck["epoch"] == 3
    model, cfg = load_model_dir(out)
    assert cfg["data"]["world_size"] == 2 and model.embed_dim == 8
    assert {row["epoch"] for row in yaml.safe_load((out / "history.json").read_text())["history"]} == {1, 2}


def test_ddp_resume_matches_uninterrupted(setup: dict[str, Any], full_run: tuple[Path, str], tmp_path: Path) -> None:
    full, part = full_run[0], tmp_path / "part"
    torchrun(setup, part, "--max-steps", "3")  # stops inside epoch 1 on both ranks
    ck = torch.load(part / "checkpoint.pth", weights_only=True)
    assert (ck["epoch"], ck["batch"], ck["step"]) == (1, 3, 3)
    torchrun(setup, part)
    a = torch.load(full / "model.pth", weights_only=True)
    b = torch.load(part / "model.pth", weights_only=True)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
