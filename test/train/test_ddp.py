"""DDP training with 2 real CPU processes (gloo) started by torchrun: disjoint batch shares,
all batches of an epoch used once, and an interrupted DDP run resumes to the same weights."""

from __future__ import annotations

import json
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


def torchrun(
    setup: dict[str, Any], out: Path, *extra: str, nproc: int = 2, config: Path | None = None
) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node nproc`` (plain ``python`` for one process) of spkflow.bin.train."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] if nproc > 1 else []
    cmd = [
        sys.executable,
        *launch,
        "-m",
        "spkflow.bin.train",
        *cli_args(setup, out, config or setup["config_path"]),
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


def test_schedule_per_sample_is_the_same_at_1_2_4_processes(setup: dict[str, Any], tmp_path: Path) -> None:
    """Real runs of 1, 2 and 4 gloo processes on the same batch lists (8 batches of 2 x 2 per
    epoch): with optim.lr_ref_batch and scheduler.warmup_epochs, the rate per utterance of each
    step (train.log's lr / the global batch) is the same function of the samples seen, and
    train.log states the global batch and the scaled peak rate."""
    import re

    cfg = json.loads(json.dumps(setup["config"]))
    cfg["optim"] = {"name": "sgd", "lr": 0.05, "lr_ref_batch": 4}
    cfg["scheduler"] = {"name": "warmup_cosine", "warmup_epochs": 0.5, "final_lr_ratio": 0.1}
    path = tmp_path / "scaled.yaml"
    path.write_text(yaml.safe_dump(cfg))
    per_sample: dict[int, dict[int, float]] = {}
    for w in (1, 2, 4):
        r = torchrun(setup, tmp_path / f"w{w}", nproc=w, config=path)
        log = r.stderr
        peak = 0.05 * 4 * w / 4
        assert (
            f"global batch {4 * w} ({w} rank(s) x 4 utterances); peak lr {peak:.6g} = optim.lr 0.05 x {4 * w} / 4"
            in log
        )
        assert f"warm-up from 0 over {0.5 * 8 / w:g} steps (0.5 epochs of {8 // w} steps)" in log
        steps = {int(m[1]): float(m[2]) for m in re.finditer(r"step (\d+) batch \d+/\d+ loss \S+ lr (\S+)", log)}
        assert sorted(steps) == list(range(1, 16 // w + 1)), steps  # log_every 1: every step
        # step k (1-based) starts after (k - 1) x 4w samples; its rate per utterance
        per_sample[w] = {(k - 1) * 4 * w: lr / (4 * w) for k, lr in steps.items()}
    for w in (2, 4):
        for seen, rate in per_sample[w].items():
            assert rate == pytest.approx(per_sample[1][seen], rel=1e-5), (w, seen)
    assert per_sample[1][0] == 0.0 and max(per_sample[1].values()) == pytest.approx(0.05 / 4, rel=1e-5)
