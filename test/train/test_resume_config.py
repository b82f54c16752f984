"""Resuming stage 4 with another training config (spkflow.train.resume), with the command-line
trainer as stage 4 runs it, on real files made here.

A run stops inside epoch 2 (``--max-steps``: a mid-epoch checkpoint, as a signal leaves), then
the same command runs again with a changed config.  Checked: a changed learning rate is refused
naming ``optim.lr`` with both values, and nothing is written (config.yaml and the checkpoint keep
their bytes); with ``--resume-new-schedule true`` it goes on from the checkpoint with the new
rate from the next step, and config.yaml and the log say so; a changed model is refused even
then, and the message never suggests running the same command again; fewer epochs than the
checkpoint has trained are refused; settings that cannot change the weights need no option; a
checkpoint written before checkpoints recorded their config is compared with config.yaml.
"""

from __future__ import annotations

import copy
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
from spkflow.train.config import TRAIN_DEFAULTS
from spkflow.train.resume import RECORD_KEY, config_changes

ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    s = make_train_setup(tmp_path_factory.mktemp("resume_config"))  # 4 batches per epoch, 2 epochs
    s["config"]["optim"]["lr"] = 0.002
    s["config"]["scheduler"] = {"name": "constant"}  # the learning rate of each epoch is the config's
    return s


def train(setup: dict[str, Any], out: Path, config: dict[str, Any], *extra: str) -> subprocess.CompletedProcess:
    path = out.parent / f"train.{abs(hash(yaml.safe_dump(config))) % 10**8}.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "spkflow.bin.train", *cli_args(setup, out, path), "--trace-batches", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)


def stopped_in_epoch_2(setup: dict[str, Any], tmp_path: Path) -> Path:
    out = tmp_path / "exp"
    r = train(setup, out, setup["config"], "--max-steps", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert (ck["epoch"], ck["batch"], ck["step"]) == (2, 2, 6)
    return out


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.suffix in (".yaml", ".pth")}


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("python -m spkflow.bin.train: error:")]


def test_a_changed_lr_is_refused_naming_it_then_taken_with_the_option(setup: dict[str, Any], tmp_path: Path) -> None:
    out = stopped_in_epoch_2(setup, tmp_path)
    before = files(out)
    changed = copy.deepcopy(setup["config"])
    changed["optim"]["lr"] = 0.02
    r = train(setup, out, changed)
    assert r.returncode == 1, r.stderr[-3000:]
    (line,) = error_lines(r.stderr)
    assert f"{out / 'checkpoint.pth'}: refusing to resume" in line
    assert "optim.lr 0.002 -> 0.02" in line and "--resume_new_schedule true" in line
    assert "same command" not in line and "Traceback" not in r.stderr
    assert files(out) == before  # config.yaml says lr 0.002, as the checkpoint

    r = train(setup, out, changed, "--resume-new-schedule", "true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "resuming with a changed schedule (--resume-new-schedule), applied from step 7 (epoch 2, batch 3)" in r.stderr
    )
    assert "optim.lr 0.002 -> 0.02" in r.stderr
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["optim"]["lr"] == 0.02
    assert cfg[RECORD_KEY] == [
        {"epoch": 2, "batch": 2, "step": 6, "changes": {"optim.lr": {"from": 0.002, "to": 0.02}}}
    ]
    # the steps after the checkpoint (and only those) ran with the new rate
    trace = [line.split()[:2] for line in (out / "batch_trace.rank0.txt").read_text().splitlines()]
    assert trace[6:] == [["2", "2"], ["2", "3"]]
    lr_logged = [float(w.split()[0]) for w in r.stderr.split(" lr ")[1:]]
    assert lr_logged and all(v == pytest.approx(0.02) for v in lr_logged)
    history = yaml.safe_load((out / "history.json").read_text())["history"]
    assert [(h["epoch"], h["lr"]) for h in history] == [(1, pytest.approx(0.002)), (2, pytest.approx(0.02))]
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert ck["config"]["optim"]["lr"] == 0.02 and ck["config"][RECORD_KEY] == cfg[RECORD_KEY]
    # an uninterrupted run at lr 0.002 ends elsewhere (the issue: model.pth was bit-identical to it)
    ref = tmp_path / "ref"
    assert train(setup, ref, setup["config"]).returncode == 0
    a, b = torch.load(ref / "model.pth", weights_only=True), torch.load(out / "model.pth", weights_only=True)
    assert any(not torch.equal(a[k], b[k]) for k in a if torch.is_floating_point(a[k]))


def test_a_changed_model_is_refused_even_with_the_option(setup: dict[str, Any], tmp_path: Path) -> None:
    out = stopped_in_epoch_2(setup, tmp_path)
    before = files(out)
    changed = copy.deepcopy(setup["config"])
    changed["model"]["channels"] = 24
    changed["optim"]["lr"] = 0.004
    for option in ([], ["--resume-new-schedule", "true"]):
        r = train(setup, out, changed, *option)
        assert r.returncode == 1, r.stderr[-3000:]
        (line,) = error_lines(r.stderr)
        assert "model.channels 16 -> 24" in line and "optim.lr 0.002 -> 0.004" in line
        assert "model.channels cannot change in a resumed run" in line
        assert "another --tag, or --resume false" in line and "same command" not in line
        assert ("would also need --resume_new_schedule true" in line) == (not option)
        assert files(out) == before


def test_fewer_epochs_than_trained_are_refused(setup: dict[str, Any], tmp_path: Path) -> None:
    out = stopped_in_epoch_2(setup, tmp_path)
    args = cli_args(setup, out, tmp_path / "c.yaml")
    args[args.index("--num-epochs") + 1] = "1"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(setup["config"]))
    cmd = [sys.executable, "-m", "spkflow.bin.train", *args, "--resume-new-schedule", "true"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    (line,) = error_lines(r.stderr)
    assert "data.num_epochs 2 -> 1" in line and "it has trained 2 epochs, more than data.num_epochs 1" in line


def test_settings_that_do_not_change_the_weights_need_no_option(setup: dict[str, Any], tmp_path: Path) -> None:
    out = stopped_in_epoch_2(setup, tmp_path)
    changed = copy.deepcopy(setup["config"])
    changed["train"].update(log_every=2, num_workers=1, valid_every=2)
    r = train(setup, out, changed)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stderr.splitlines() if "resuming with settings that do not change the weights" in x]
    for change in ("train.log_every 1 -> 2", "train.num_workers 0 -> 1", "train.valid_every 1 -> 2"):
        assert change in line, line
    assert RECORD_KEY not in yaml.safe_load((out / "config.yaml").read_text())
    ref = tmp_path / "ref"
    assert train(setup, ref, setup["config"]).returncode == 0
    a, b = torch.load(ref / "model.pth", weights_only=True), torch.load(out / "model.pth", weights_only=True)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


def test_a_checkpoint_without_a_recorded_config_is_compared_with_config_yaml(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    out = stopped_in_epoch_2(setup, tmp_path)
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    del ck["config"]  # as spkflow wrote them before
    torch.save(ck, out / "checkpoint.pth")
    changed = copy.deepcopy(setup["config"])
    changed["optim"]["lr"] = 0.02
    r = train(setup, out, changed)
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"comparing with {out / 'config.yaml'}" in r.stderr
    assert "optim.lr 0.002 -> 0.02" in error_lines(r.stderr)[0]


def test_config_changes_names_dotted_keys_and_ignores_new_defaults() -> None:
    old = {"optim": {"name": "adam", "lr": 0.1}, "model": {"name": "x", "channels": 8}, "data": {"num_epochs": 2}}
    new = {
        "optim": {"name": "adam", "lr": 0.2, "decay_1d": TRAIN_DEFAULTS["optim"]["decay_1d"]},  # added since, default
        "model": {"name": "x", "channels": 8, "dropout": 0.1},  # a new key off its default: a change
        "data": {"num_epochs": 3},
        RECORD_KEY: [{"epoch": 1}],  # the record is not compared
    }
    got = [(c.key, c.old, c.new, c.kind) for c in config_changes(old, new, TRAIN_DEFAULTS)]
    assert got == [
        ("optim.lr", 0.1, 0.2, "schedule"),
        ("model.dropout", "<absent>", 0.1, "fixed"),
        ("data.num_epochs", 2, 3, "schedule"),
    ]


def test_the_lr_scaling_and_tensorboard_keys_are_schedule_and_free() -> None:
    """Issue 34's keys: the lr's scaling and Nesterov are part of the schedule, TensorBoard changes no weight."""
    old = {"optim": {"lr_ref_batch": 64, "nesterov": False}, "train": {"tensorboard": True}}
    new = {"optim": {"lr_ref_batch": 128, "nesterov": True}, "train": {"tensorboard": False}}
    got = {c.key: c.kind for c in config_changes(old, new, TRAIN_DEFAULTS)}
    assert got == {"optim.lr_ref_batch": "schedule", "optim.nesterov": "schedule", "train.tensorboard": "free"}


def test_keys_three_and_more_levels_deep_are_compared_and_named() -> None:
    """A change of ``model.specaug.freq_width`` (the demo's SpecAugment, three levels) or of a key one
    level further refuses the resume naming that key, with the option or without."""
    from spkflow.train.resume import ResumeRefused, check_resume

    old = {
        "model": {"name": "ecapa_tdnn", "specaug": {"freq_width": 8, "time_width": 10}},
        "frontend": {"fbank": {"num_mel_bins": 80}, "extra": {"deep": {"x": 1}}},
        "optim": {"lr": 0.002},
    }
    for key, value in (("model.specaug.freq_width", 0), ("frontend.extra.deep.x", 2)):
        new = copy.deepcopy(old)
        *path, last = key.split(".")
        d = new
        for k in path:
            d = d[k]
        d[last] = value
        assert [(c.key, c.new) for c in config_changes(old, new, TRAIN_DEFAULTS)] == [(key, value)]
        for allow in (False, True):
            with pytest.raises(ResumeRefused, match=rf"{key.replace('.', '[.]')} \S+ -> {value} .*{key} cannot change"):
                check_resume(old, new, checkpoint="ck.pth", source="t.yaml", position=(2, 1, 5), allow_schedule=allow)
