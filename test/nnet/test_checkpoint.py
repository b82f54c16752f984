"""Checkpoint files: atomic save, safe load, and one clear line for a truncated or code-holding file.

The damaged files are real: checkpoints written by a real (tiny) training run, then cut short
or replaced by a ``torch.save`` of an object whose unpickling would run a shell command.  The
training and extraction command lines are run as the stage scripts run them.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from helpers.paths import ROOT
from helpers.train import make_train_setup  # the trainer tests' data dir + features + batch lists
from spkflow.core.errors import InputError
from spkflow.nnet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


class RunsAShellCommand:
    """What a malicious checkpoint holds: unpickling it (weights_only=False) runs ``touch``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def plant_code(path: Path, marker: Path) -> None:
    """Replace ``path`` by a checkpoint that keeps its tensors but also holds code."""
    state = torch.load(path, weights_only=True)
    state["evil"] = RunsAShellCommand(marker)
    torch.save(state, path)


def assert_clear(stderr: str, path: Path, *words: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "weights_only" not in stderr, stderr[-3000:]
    for w in (str(path), *words):
        assert w in stderr, stderr[-3000:]


# ---------------------------------------------------------------- library


def test_save_load_round_trip_is_atomic(tmp_path: Path) -> None:
    p = tmp_path / "checkpoint.pth"
    state = {"model": {"w": torch.arange(4.0)}, "epoch": 3, "history": [{"loss": 1.5}]}
    save_checkpoint(p, state)
    got = load_checkpoint(p)
    assert got["epoch"] == 3 and got["history"] == [{"loss": 1.5}]
    torch.testing.assert_close(got["model"]["w"], torch.arange(4.0))
    # a failed write leaves the previous file, and no temporary file beside it
    with pytest.raises(AttributeError):
        save_checkpoint(p, {"bad": lambda: 0})  # torch.save cannot pickle a local lambda
    assert load_checkpoint(p)["epoch"] == 3
    assert sorted(x.name for x in tmp_path.iterdir()) == ["checkpoint.pth"]
    # a state dict keeps its type (and its _metadata)
    sd = torch.nn.BatchNorm1d(2).state_dict()
    save_checkpoint(tmp_path / "epoch1.pth", sd)
    assert type(load_checkpoint(tmp_path / "epoch1.pth")) is type(sd)


@pytest.mark.parametrize("name", ["checkpoint.pth", "epoch2.pth", "model.pth"])
def test_truncated_file_names_file_and_remedy(tmp_path: Path, name: str) -> None:
    p = tmp_path / name
    save_checkpoint(p, {"w": torch.randn(64, 64)})
    truncate(p)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: unreadable or truncated checkpoint") and "stage 4" in msg
    assert "--resume false" in msg or "rebuilds model.pth" in msg
    assert isinstance(e.value, InputError) and e.value.path == str(p)
    p.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty file"):
        load_checkpoint(p)
    p.write_bytes(b"not a checkpoint at all\n" * 8)
    with pytest.raises(CheckpointError, match=r"unreadable or truncated"):
        load_checkpoint(p)
    with pytest.raises(CheckpointError, match=r"no such file"):
        load_checkpoint(tmp_path / "nowhere.pth")


def test_pickled_code_is_refused_and_not_run(tmp_path: Path) -> None:
    p, marker = tmp_path / "model.pth", tmp_path / "pwned"
    torch.save({"w": torch.zeros(2), "x": RunsAShellCommand(marker)}, p)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(p)
    assert str(e.value) == (f"{p}: holds pickled Python objects (code), refused; spkflow checkpoints hold tensors only")
    assert not marker.exists()
    # numpy arrays are pickled objects too (torch.save of np.ndarray): refused the same way
    import numpy as np

    torch.save({"w": np.zeros(3)}, p)
    with pytest.raises(CheckpointError, match="holds pickled Python objects"):
        load_checkpoint(p)
    torch.save(torch.zeros(3), p)
    with pytest.raises(CheckpointError, match="holds a Tensor, not a dict"):
        load_checkpoint(p)


def test_check_checkpoint_cli(tmp_path: Path) -> None:
    good, bad = tmp_path / "model.pth", tmp_path / "epoch1.pth"
    save_checkpoint(good, {"w": torch.ones(3)})
    save_checkpoint(bad, {"w": torch.ones(300)})
    truncate(bad)
    cmd = [sys.executable, "-m", "spkflow.bin.check_checkpoint"]
    assert subprocess.run([*cmd, str(good)], env=ENV, capture_output=True).returncode == 0
    r = subprocess.run([*cmd, str(good), str(bad)], env=ENV, capture_output=True, text=True)
    assert r.returncode == 1
    assert_clear(r.stderr, bad, "unreadable or truncated checkpoint", "--resume false")
    assert str(good) not in r.stderr


# ---------------------------------------------------------------- training and extraction


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A finished one-epoch training run through the command line."""
    torch.set_num_threads(1)
    setup = make_train_setup(tmp_path_factory.mktemp("ckpt"), epochs=1)
    setup["config_path"] = setup["root"] / "train.yaml"
    setup["config_path"].write_text(yaml.safe_dump(setup["config"]))
    setup["out"] = setup["root"] / "exp_done"
    r = train(setup, setup["out"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert {"checkpoint.pth", "epoch1.pth", "model.pth"} <= {p.name for p in setup["out"].iterdir()}
    return setup


def train(setup: dict[str, Any], out: Path) -> subprocess.CompletedProcess[str]:
    args = [
        *("--config", setup["config_path"], "--train-data", setup["data"], "--train-feats", setup["feats"]),
        *("--batches-dir", setup["batches"], "--num-epochs", 1, "--out-dir", out),
        *("--device", "cpu", "--num-threads", 1),
    ]
    cmd = [sys.executable, "-m", "spkflow.bin.train", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)


def copy_run(trained: dict[str, Any], tmp_path: Path) -> Path:
    out = tmp_path / "exp"
    shutil.copytree(trained["out"], out)
    return out


def test_train_refuses_truncated_checkpoint(trained: dict[str, Any], tmp_path: Path) -> None:
    out = copy_run(trained, tmp_path)
    truncate(out / "checkpoint.pth")
    r = train(trained, out)
    assert r.returncode == 1
    assert_clear(r.stderr, out / "checkpoint.pth", "unreadable or truncated checkpoint", "--resume false")


def test_train_refuses_checkpoint_with_code(trained: dict[str, Any], tmp_path: Path) -> None:
    out, marker = copy_run(trained, tmp_path), tmp_path / "pwned"
    plant_code(out / "checkpoint.pth", marker)
    r = train(trained, out)
    assert r.returncode == 1
    assert_clear(r.stderr, out / "checkpoint.pth", "holds pickled Python objects (code), refused")
    assert not marker.exists()


def test_train_resume_with_a_changed_config_names_checkpoint(trained: dict[str, Any], tmp_path: Path) -> None:
    """A config changed since the checkpoint was written: refused naming the checkpoint, the key
    and both values (spkflow.train.resume); where the checkpoint records no config and no
    config.yaml is beside it, torch's bare size-mismatch RuntimeError becomes one line naming the
    checkpoint and the remedy."""
    out = copy_run(trained, tmp_path)
    config = yaml.safe_load(trained["config_path"].read_text())
    config["model"]["channels"] = 24
    changed = dict(trained, config_path=tmp_path / "changed.yaml")
    changed["config_path"].write_text(yaml.safe_dump(config))
    r = train(changed, out)
    assert r.returncode == 1
    assert_clear(r.stderr, out / "checkpoint.pth", "model.channels 16 -> 24", "cannot change", "--resume false")
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    del ck["config"]
    torch.save(ck, out / "checkpoint.pth")
    (out / "config.yaml").unlink()
    r = train(changed, out)
    assert r.returncode == 1
    assert_clear(r.stderr, out / "checkpoint.pth", "its 'model' does not fit", "size mismatch", "--resume false")
    # an entry missing altogether
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    del ck["optimizer"]
    torch.save(ck, out / "checkpoint.pth")
    r = train(trained, out)
    assert r.returncode == 1
    assert_clear(r.stderr, out / "checkpoint.pth", "no 'optimizer' in it")


@pytest.mark.parametrize("damage", ["truncate", "code"])
def test_train_refuses_bad_epoch_snapshot(trained: dict[str, Any], tmp_path: Path, damage: str) -> None:
    """Re-running a finished training rebuilds model.pth from epoch<E>.pth: a bad one is named."""
    out, marker = copy_run(trained, tmp_path), tmp_path / "pwned"
    (out / "model.pth").unlink()
    truncate(out / "epoch1.pth") if damage == "truncate" else plant_code(out / "epoch1.pth", marker)
    r = train(trained, out)
    assert r.returncode == 1
    what = "unreadable or truncated checkpoint" if damage == "truncate" else "holds pickled Python objects"
    assert_clear(r.stderr, out / "epoch1.pth", what)
    assert not (out / "model.pth").exists() and not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "code"])
def test_extraction_refuses_bad_model(trained: dict[str, Any], tmp_path: Path, damage: str) -> None:
    from spkflow.embed import open_embedder

    out, marker = copy_run(trained, tmp_path), tmp_path / "pwned"
    truncate(out / "model.pth") if damage == "truncate" else plant_code(out / "model.pth", marker)
    what = "unreadable or truncated checkpoint" if damage == "truncate" else "holds pickled Python objects"
    with pytest.raises(CheckpointError, match=what):
        open_embedder(out, "spkflow", "cpu")
    cmd = [sys.executable, "-m", "spkflow.bin.extract_embeddings", "--model-dir", str(out)]
    r = subprocess.run(
        [*cmd, str(trained["data"]), str(tmp_path / "jobs")], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert r.returncode == 1
    assert_clear(r.stderr, out / "model.pth", what)
    assert not marker.exists()


def test_a_full_disk_at_a_checkpoint_is_one_line_naming_it(tmp_path: Path) -> None:
    """The disk fills while epoch 2's checkpoint is written (a tmpfs just too small; without root,
    a file-size limit that the checkpoint exceeds): one error line naming checkpoint.pth, with the
    sizes, no traceback; the previous checkpoint is intact, and once there is room the same
    command resumes from it to the model of an uninterrupted run."""
    from helpers.procs import small_disk

    setup = make_train_setup(tmp_path / "setup", epochs=2)
    setup["config_path"] = tmp_path / "train.yaml"
    setup["config_path"].write_text(yaml.safe_dump(setup["config"]))

    def run(out: Path, preexec: Any = None) -> subprocess.CompletedProcess[str]:
        args = [
            *("--config", setup["config_path"], "--train-data", setup["data"], "--train-feats", setup["feats"]),
            *("--batches-dir", setup["batches"], "--num-epochs", 2, "--out-dir", out),
            *("--device", "cpu", "--num-threads", 1, "--progress", "false"),
        ]
        cmd = [sys.executable, "-m", "spkflow.bin.train", *map(str, args)]
        return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600, preexec_fn=preexec)

    ref = tmp_path / "ref"
    assert run(ref).returncode == 0
    pages = {n: -(-(ref / n).stat().st_size // 4096) for n in ("config.yaml", "epoch1.pth", "checkpoint.pth")}
    # epoch 1's files, epoch2.pth, and half a second checkpoint.pth beside the first
    kib = 4 * (pages["config.yaml"] + 2 * pages["epoch1.pth"] + pages["checkpoint.pth"] * 3 // 2)
    disk = tmp_path / "disk"
    with small_disk(disk, kib) as limit:
        if limit is not None:  # no tmpfs: every file at most 1.5 epoch snapshots (checkpoint.pth is larger)
            size = (ref / "epoch1.pth").stat().st_size * 3 // 2

            def limit() -> None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

        out = disk / "exp"
        r = run(out, limit)
        assert r.returncode == 1, r.stderr[-3000:]
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        (line,) = [x for x in r.stderr.splitlines() if x.startswith("python -m spkflow.bin.train: error:")]
        assert f"{out / 'checkpoint.pth'}: cannot write it (" in line and "MiB to write" in line
        assert "free some space and run again" in line
        assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]  # no partial file left
        if (out / "checkpoint.pth").exists():  # the end of epoch 1's: intact
            assert load_checkpoint(out / "checkpoint.pth")["epoch"] == 2
        if limit is None:
            subprocess.run(["mount", "-o", f"remount,size={8 * kib}k", str(disk)], check=True)
        r = run(out)
        assert r.returncode == 0, r.stderr[-3000:]
        a = torch.load(ref / "model.pth", weights_only=True)
        b = torch.load(out / "model.pth", weights_only=True)
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
