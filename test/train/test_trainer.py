"""Trainer (stage 4): outputs, weights_only checkpoints, exact resume, NaN handling, config errors.

Everything runs on real files made here: synthetic voiced audio (``make_speakers``), Kaldi
arks written by the stage-2 job code (:func:`spkflow.features.jobs.extract_job`), batch lists
from the stage-3 planner, a trials list; a tiny ECAPA-TDNN trains for a few steps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from helpers.paths import ROOT
from helpers.spread import permuted, within
from helpers.train import TINY_MODEL, cli_args, make_train_setup, train_options


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.set_num_threads(1)
    return make_train_setup(tmp_path_factory.mktemp("train"))


def params_of(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if torch.is_floating_point(v)}


def test_full_run_outputs_and_weights_only(setup: dict[str, Any], tmp_path: Path) -> None:
    from spkflow.nnet.models import load_model_dir
    from spkflow.train.trainer import Trainer, average_state_dicts

    out = tmp_path / "exp"
    history = Trainer(train_options(setup, out)).run()
    assert [r["epoch"] for r in history] == [1, 2]
    for r in history:
        assert np.isfinite(r["train_loss"]) and 0.0 <= r["valid_eer"] <= 100.0
    for name in (
        "config.yaml",
        "model.pth",
        "checkpoint.pth",
        "epoch1.pth",
        "epoch2.pth",
        "history.json",
        "curves.png",
    ):
        assert (out / name).is_file(), name
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert ck["epoch"] == 3 and ck["batch"] == 0 and ck["step"] == 8
    assert {"model", "loss", "optimizer", "scheduler", "rng", "history", "sampler"} <= set(ck)
    assert "w_raw" in ck["loss"] and "b" in ck["loss"]  # GE2E's learnable w, b are saved
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["frontend"]["fbank"]["num_mel_bins"] == 20 and cfg["frontend"]["vad"] is True
    assert cfg["frontend"]["vad_conf"]["vad_energy_threshold"] == 5.5
    assert cfg["model"]["input_dim"] == 20 and cfg["data"]["num_spk"] == 3 and cfg["data"]["num_utt"] == 2
    # model.pth = mean of the last two epoch snapshots (select: average, average_last: 2)
    e1, e2 = (torch.load(out / f"epoch{e}.pth", weights_only=True) for e in (1, 2))
    final = torch.load(out / "model.pth", weights_only=True)
    avg = average_state_dicts([e1, e2])
    for k, v in params_of(final).items():
        torch.testing.assert_close(v, avg[k])
    assert not torch.equal(e1["projector.fc.weight"], e2["projector.fc.weight"])  # it did train
    model, config = load_model_dir(out)
    x = torch.randn(2, 40, 20) + 5
    assert model(x, torch.tensor([40, 33])).shape == (2, 8)
    assert json.loads((out / "history.json").read_text())["epochs"] == [1, 2]


def test_valid_every_skips_validation_without_changing_the_weights(setup: dict[str, Any], tmp_path: Path) -> None:
    """``train.valid_every: 2`` validates epoch 2 (and always the last) only; validation draws no
    random numbers, so the weights are those of a run validating every epoch, bit for bit."""
    from spkflow.train.trainer import Trainer

    runs = {}
    for every in (1, 2, 5):
        cfg = json.loads(json.dumps(setup["config"]))
        cfg["train"]["valid_every"] = every
        out = tmp_path / f"every{every}"
        history = Trainer(train_options(setup, out, config=cfg)).run()
        runs[every] = (history, torch.load(out / "model.pth", weights_only=True))
    assert all("valid_eer" in r for r in runs[1][0])
    for every in (2, 5):  # epoch 1 not validated; epoch 2 is (2 % 2 == 0, and it is the last)
        history, state = runs[every]
        assert ["valid_eer" in r for r in history] == [False, True]
        assert history[1]["valid_eer"] == runs[1][0][1]["valid_eer"]
        for k, v in state.items():
            assert torch.equal(v, runs[1][1][k]), k


def test_resume_mid_epoch_equals_uninterrupted(setup: dict[str, Any], tmp_path: Path) -> None:
    """With the fbank-domain augmentations on (speed, channel and narrow-band draws come from the
    per-batch seed), a run stopped twice and resumed ends at the weights of an uninterrupted one."""
    from spkflow.train.trainer import Trainer

    setup = {**setup, "config": json.loads(json.dumps(setup["config"]))}
    setup["config"]["train"]["speed_perturb"] = [0.9, 1.0, 1.1]
    setup["config"]["train"]["channel_perturb"] = {
        "gain_db": 4.0,
        "shape_db": 2.0,
        "band_prob": 0.5,
        "band_per": "crop",
    }
    full = tmp_path / "full"
    Trainer(train_options(setup, full)).run()
    part = tmp_path / "part"
    Trainer(train_options(setup, part, max_steps=3)).run()  # 4 batches per epoch: stops inside epoch 1
    ck = torch.load(part / "checkpoint.pth", weights_only=True)
    assert (ck["epoch"], ck["batch"], ck["step"]) == (1, 3, 3)
    assert not (part / "model.pth").exists() and not (part / "epoch1.pth").exists()
    Trainer(train_options(setup, part, max_steps=6)).run()  # resumes, crosses the epoch boundary, stops in epoch 2
    ck = torch.load(part / "checkpoint.pth", weights_only=True)
    assert (ck["epoch"], ck["batch"], ck["step"]) == (2, 2, 6)
    Trainer(train_options(setup, part)).run()  # and finishes
    a = torch.load(full / "model.pth", weights_only=True)
    b = torch.load(part / "model.pth", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
    ha = json.loads((full / "history.json").read_text())["history"]
    hb = json.loads((part / "history.json").read_text())["history"]
    assert [round(r["train_loss"], 5) for r in ha] == [round(r["train_loss"], 5) for r in hb]
    ca = torch.load(full / "checkpoint.pth", weights_only=True)
    cb = torch.load(part / "checkpoint.pth", weights_only=True)
    torch.testing.assert_close(cb["loss"]["w_raw"], ca["loss"]["w_raw"])


def test_input_stats_can_include_the_channel_curves(setup: dict[str, Any], tmp_path: Path) -> None:
    """``train.input_stats_augmented``: the model's input mean and variance are those of the
    features plus the channel curves' (independent: means and variances add); off, the features'
    alone, as before."""
    from spkflow.augment.fbank import FbankChannelPerturb, normalize_channel_config
    from spkflow.train.trainer import Trainer

    cfg = json.loads(json.dumps(setup["config"]))
    cfg["train"]["channel_perturb"] = {"gain_db": 4.0, "shape_db": 2.0, "band_prob": 0.3}
    states = {}
    for flag in (False, True):
        cfg["train"]["input_stats_augmented"] = flag
        out = tmp_path / str(flag)
        Trainer(train_options({**setup, "config": cfg}, out, max_steps=1)).run()
        states[flag] = torch.load(out / "checkpoint.pth", weights_only=True)["model"]
    fb = yaml.safe_load((tmp_path / "True" / "config.yaml").read_text())["frontend"][
        "fbank"
    ]  # completed by the trainer
    shift, var = FbankChannelPerturb(normalize_channel_config(cfg["train"]["channel_perturb"]), fb).curve_moments()
    plain, wide = states[False], states[True]
    torch.testing.assert_close(
        wide["input_mean"].double(), plain["input_mean"].double() + torch.from_numpy(shift), atol=1e-4, rtol=0
    )
    want = torch.sqrt(plain["input_std"].double() ** 2 + torch.from_numpy(var))
    torch.testing.assert_close(wide["input_std"].double(), want, atol=1e-4, rtol=1e-5)
    wider = wide["input_std"] / plain["input_std"]
    assert float(wider[-1]) > float(wider[0]) > 1.0  # every bin wider, the band's most


@pytest.mark.parametrize("flag", [["--resume", "false"], ["--no-resume"]])
def test_no_resume_starts_over(setup: dict[str, Any], tmp_path: Path, flag: list[str]) -> None:
    """With a mid-epoch checkpoint present, ``--resume false`` (and the older ``--no-resume``)
    trains from step 0 again: the steps it traces begin at epoch 1 batch 0, and it stops at
    max_steps counted from 0, where a resumed run would have been done at once."""
    config_path = tmp_path / "train.yaml"
    config_path.write_text(yaml.safe_dump(setup["config"]))
    out = tmp_path / "exp"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    base = [sys.executable, "-m", "spkflow.bin.train", *cli_args(setup, out, config_path), "--trace-batches", "true"]
    r = subprocess.run([*base, "--max-steps", "3"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert torch.load(out / "checkpoint.pth", weights_only=True)["step"] == 3
    trace = out / "batch_trace.rank0.txt"
    trace.unlink()
    r = subprocess.run([*base, "--max-steps", "2", *flag], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" not in r.stderr
    assert [line.split()[:2] for line in trace.read_text().splitlines()] == [["1", "0"], ["1", "1"]]
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert (ck["epoch"], ck["batch"], ck["step"]) == (1, 2, 2)
    # the default resumes: the same command without the flag goes on from step 2
    r = subprocess.run([*base, "--max-steps", "3"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0 and "resumed from" in r.stderr, r.stderr[-3000:]
    assert trace.read_text().splitlines()[-1].split()[:2] == ["1", "2"]


def test_nan_loss_stops_naming_batch_and_keeps_checkpoint(setup: dict[str, Any], tmp_path: Path) -> None:
    import kaldiio

    from spkflow.train.trainer import Trainer, TrainingDiverged

    out = tmp_path / "exp"
    Trainer(train_options(setup, out, num_epochs=1)).run()
    before = (out / "checkpoint.pth").read_bytes()
    # poison one utterance's features: every epoch uses every utterance, so epoch 2 hits it
    bad_feats = tmp_path / "bad_feats"
    bad_feats.mkdir()
    feats = dict(kaldiio.load_scp(str(setup["feats"] / "feats.scp")))
    victim = sorted(feats)[5]
    with kaldiio.WriteHelper(f"ark,scp:{bad_feats}/feats.ark,{bad_feats}/feats.scp") as w:
        for k in sorted(feats):
            m = np.array(feats[k])
            if k == victim:
                m[:] = np.nan
            w(k, m)
    for name in ("vad.scp", "cmvn_utt.scp", "cmvn_utt_voiced.scp"):
        (bad_feats / name).write_text((setup["feats"] / name).read_text())
    with pytest.raises(TrainingDiverged) as err:
        # a second epoch after a one-epoch run: a new schedule (spkflow.train.resume)
        Trainer(train_options(setup, out, train_feats=str(bad_feats), num_epochs=2, resume_new_schedule=True)).run()
    msg = str(err.value)
    assert "non-finite loss" in msg and "epoch 2" in msg and "batch" in msg and "epoch2.txt" in msg
    line = int(msg.split("(line ")[1].split()[0])
    batch = (setup["batches"] / "epoch2.txt").read_text().splitlines()[line - 1].split()
    assert victim in batch and batch[0] in msg
    assert (out / "checkpoint.pth").read_bytes() == before  # last good checkpoint untouched
    assert not (out / "epoch2.pth").exists()


def test_config_errors_name_the_key(setup: dict[str, Any], tmp_path: Path) -> None:
    from spkflow.core.checks import ConfigError
    from spkflow.train.config import load_train_config
    from spkflow.train.trainer import Trainer

    cfg = json.loads(json.dumps(setup["config"]))
    cfg["train"]["crop_frames"] = 10
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"bad\.yaml: unknown key\(s\) train\.crop_frames"):
        load_train_config(path)
    cfg = json.loads(json.dumps(setup["config"]))
    cfg["model"]["chanels"] = 8
    with pytest.raises(ConfigError, match="chanels"):
        Trainer(train_options(setup, tmp_path / "x", config=cfg)).run()
    cfg = json.loads(json.dumps(setup["config"]))
    cfg["loss"]["margn"] = 0.2
    with pytest.raises(ConfigError, match=r"^config: unknown key\(s\) loss\.margn"):
        Trainer(train_options(setup, tmp_path / "y", config=cfg)).run()
    # the command line reports it and exits 1
    cfg = json.loads(json.dumps(setup["config"]))
    cfg["optimizer"] = {"lr": 1}
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "spkflow.bin.train", *cli_args(setup, tmp_path / "z", path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 1 and "optimizer" in r.stderr and "bad.yaml" in r.stderr


@pytest.mark.parametrize(
    "section, key, value, match",
    [
        (
            "loss",
            "name",
            "triplet",
            r"loss\.name must be aamsoftmax \| aamsoftmax_subcenter \| ge2e \| ge2e_xs, got 'triplet'",
        ),
        ("loss", "margn", 0.2, r"unknown key\(s\) loss\.margn; accepted: "),
        ("model", "name", "xvector", r"model\.name must be dvector_lstm \| ecapa_tdnn \| resnet, got 'xvector'"),
        ("model", "chanels", 8, r"unknown key\(s\) model\.chanels; accepted: "),
        ("optim", "name", "adagrad", r"optim\.name must be adam \| adamw \| sgd, got 'adagrad'"),
        ("optim", "lr", "1e-3", r"optim\.lr must be a number, got '1e-3' \(YAML reads"),
        ("optim", "lr", -0.1, r"optim\.lr must be >= 0\.0, got -0\.1"),
        (
            "scheduler",
            "name",
            "step",
            r"scheduler\.name must be constant \| warmup_cosine \| warmup_exponential \| exponential",
        ),
        ("scheduler", "warmup_steps", 1.5, r"scheduler\.warmup_steps must be an integer"),
        ("scheduler", "warmup_epochs", 1, r"scheduler\.warmup_epochs and scheduler\.warmup_steps: give one"),
        ("scheduler", "name", "warmup_exponential", r"scheduler\.final_lr_ratio must be > 0 for warmup_exponential"),
        ("optim", "lr_ref_batch", 0, r"optim\.lr_ref_batch must be >= 1, got 0"),
        ("optim", "nesterov", True, r"optim\.nesterov needs optim\.name sgd with momentum > 0"),
        ("train", "tensorboard", "yes", r"train\.tensorboard must be true or false"),
        ("train", "amp", "yes", r"train\.amp must be true or false, got 'yes'"),
        ("train", "amp_dtype", "half", r"train\.amp_dtype must be float16 \| bfloat16, got 'half'"),
        ("train", "select", "first", r"train\.select must be best \| last \| average"),
        ("train", "valid_every", 0, r"train\.valid_every must be >= 1, got 0"),
        ("train", "crop_min_frames", 400, r"need train\.crop_min_frames <= train\.crop_max_frames"),
        ("frontend", "vad", 1, r"frontend\.vad must be true or false"),
        ("train", "input_stats_augmented", True, r"train\.input_stats_augmented needs train\.channel_perturb"),
        ("train", "channel_perturb", {"gain": 3}, r"unknown key\(s\) train\.channel_perturb\.gain; accepted: "),
        (
            "train",
            "channel_perturb",
            {"prob": 1.5},
            r"train\.channel_perturb\.prob must be in \[0\.0, 1\.0\], got 1\.5",
        ),
        ("train", "channel_perturb", {"shape_db": -1}, r"train\.channel_perturb\.shape_db must be >= 0\.0, got -1"),
        ("train", "channel_perturb", {"tilt_db": "6 dB"}, r"train\.channel_perturb\.tilt_db must be a number"),
        (
            "train",
            "channel_perturb",
            {"rolloff_hz": [6000, 2000]},
            r"train\.channel_perturb\.rolloff_hz must be \[low, high\] with low <= high, got \[6000, 2000\]",
        ),
        (
            "train",
            "channel_perturb",
            {"shape_terms": 2.5},
            r"train\.channel_perturb\.shape_terms must be an integer, got 2\.5",
        ),
    ],
)
def test_config_mistakes_are_config_errors_at_load(
    setup: dict[str, Any], tmp_path: Path, section: str, key: str, value: Any, match: str
) -> None:
    """Every mistake in a training config file, names of the model, loss, optimiser and
    scheduler included, is found when the file is loaded: a ConfigError starting with the file
    and naming the dotted key (never a bare ValueError/TypeError from a constructor)."""
    from spkflow.core.checks import ConfigError
    from spkflow.train.config import load_train_config

    cfg = json.loads(json.dumps(setup["config"]))
    cfg.setdefault(section, {})[key] = value
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {match}"):
        load_train_config(path)


@pytest.mark.parametrize(
    "section, key, value, match",
    [
        ("loss", "mode", "softmx", r"loss \(ge2e\): GE2E mode must be 'softmax' or 'contrast'"),
        ("model", "channels", 30, r"model\.channels \(30\) must be a multiple of model\.scale"),
    ],
)
def test_config_values_only_a_constructor_judges_name_the_file(
    setup: dict[str, Any], tmp_path: Path, section: str, key: str, value: Any, match: str
) -> None:
    """Values only the model or loss constructor can judge fail when training starts, as one
    'error:' line naming the config file (exit 1), not a traceback."""
    cfg = json.loads(json.dumps(setup["config"]))
    cfg[section][key] = value
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "spkflow.bin.train", *cli_args(setup, tmp_path / "exp", path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert re.search(rf"error: {re.escape(str(path))}: {match}", r.stderr), r.stderr[-3000:]


def test_bad_batch_list_names_file_and_line(setup: dict[str, Any], tmp_path: Path) -> None:
    from spkflow.core.errors import InputError
    from spkflow.train.trainer import Trainer

    batches = tmp_path / "batches"
    batches.mkdir()
    lines = (setup["batches"] / "epoch1.txt").read_text().splitlines()
    toks = lines[1].split()
    toks[0], toks[2] = toks[2], toks[0]  # no longer speaker-major
    lines[1] = " ".join(toks)
    (batches / "epoch1.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"epoch1\.txt:2: .*speaker-major"):
        Trainer(train_options(setup, tmp_path / "exp", batches_dir=str(batches), num_epochs=1)).run()
    # a missing epoch is reported before any training
    (batches / "epoch1.txt").write_text((setup["batches"] / "epoch1.txt").read_text())
    with pytest.raises(InputError, match=r"epoch2\.txt: batch list of epoch 2 not found"):
        Trainer(train_options(setup, tmp_path / "exp2", batches_dir=str(batches), num_epochs=2)).run()
    assert not (tmp_path / "exp2" / "checkpoint.pth").exists()


def test_aam_and_lstm_train(tmp_path: Path) -> None:
    """The AAM-softmax baseline gets speaker labels (speaker x speed factor with speed
    perturbation); the d-vector LSTM trains too."""
    from spkflow.nnet.models import load_model_dir
    from spkflow.train.trainer import Trainer

    s = make_train_setup(
        tmp_path,
        epochs=1,
        loss={"name": "aamsoftmax", "margin": 0.2, "scale": 30},
        model={"name": "dvector_lstm", "hidden": 16, "embed_dim": 8, "layers": 2, "infer_window": 20, "infer_hop": 10},
    )
    s["config"]["train"]["select"] = "last"
    s["config"]["train"]["speed_perturb"] = [0.9, 1.0, 1.1]
    history = Trainer(train_options(s, tmp_path / "exp")).run()
    assert np.isfinite(history[0]["train_loss"]) and "acc" in history[0]
    ck = torch.load(tmp_path / "exp" / "checkpoint.pth", weights_only=True)
    assert ck["loss"]["inner.weight"].shape == (18, 8)  # one row per training speaker and speed
    model, _ = load_model_dir(tmp_path / "exp")
    assert model.embed_dim == 8


def test_resnet_trains_and_extracts_padding_invariant(tmp_path: Path) -> None:
    """A tiny espnet2 ResNet trains one epoch through the trainer (AAM-softmax, SpecAugment) and
    the saved model directory embeds a padded batch as it embeds each utterance alone."""
    from spkflow.nnet.models import load_model_dir
    from spkflow.train.trainer import Trainer

    model_cfg = {"name": "resnet", "num_blocks": [1, 1, 1, 1], "channels": 4, "embed_dim": 8}
    model_cfg["specaug"] = {"freq_width": 3, "time_width": 4}
    s = make_train_setup(tmp_path, epochs=1, loss={"name": "aamsoftmax", "margin": 0.2, "scale": 30}, model=model_cfg)
    s["config"]["train"]["select"] = "last"
    history = Trainer(train_options(s, tmp_path / "exp")).run()
    assert np.isfinite(history[0]["train_loss"])
    model, config = load_model_dir(tmp_path / "exp")
    assert config["model"]["name"] == "resnet" and model.embed_dim == 8 and model.input_dim == 20
    g = torch.Generator().manual_seed(0)
    lengths = permuted([45, 20, 33])
    x = torch.randn(3, 45, 20, generator=g)
    with torch.no_grad():
        batch = torch.nn.functional.normalize(model(x, torch.tensor(lengths)), dim=-1)
        worst = 0.0
        for i, n in enumerate(lengths):
            alone = torch.nn.functional.normalize(model(x[i : i + 1, :n], torch.tensor([n])), dim=-1)[0]
            worst = max(worst, float((batch[i] - alone).abs().max()))
    # measured <= 1.2e-7 (1 and 2 threads)
    within("trained ResNet padded vs alone (L2-normalised)", worst, 1e-4)


def test_sigterm_checkpoints_exits_143_and_resumes_exactly(setup: dict[str, Any], tmp_path: Path) -> None:
    """A real signal to the command-line trainer: it writes the checkpoint of its last completed
    step, exits 128 + 15; a rerun resumes and ends with the uninterrupted run's weights."""
    import signal
    import time

    from spkflow.train.trainer import Trainer

    full = tmp_path / "full"
    Trainer(train_options(setup, full)).run()
    config_path = tmp_path / "train.yaml"
    config_path.write_text(yaml.safe_dump(setup["config"]))
    out = tmp_path / "exp"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "spkflow.bin.train", *cli_args(setup, out, config_path), "--trace-batches"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    trace = out / "batch_trace.rank0.txt"
    deadline = time.time() + 120
    while not (trace.is_file() and trace.read_text().count("\n") >= 1) and proc.poll() is None:
        assert time.time() < deadline, "training did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by a signal" in err
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert 1 <= ck["step"] < 8 and not (out / "model.pth").exists()
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [tuple(line.split()[:2]) for line in trace.read_text().splitlines()]
    # every batch of the two epochs trained exactly once across the interruption
    assert sorted(steps) == [(str(e), str(b)) for e in (1, 2) for b in range(4)]
    a = torch.load(full / "model.pth", weights_only=True)
    b = torch.load(out / "model.pth", weights_only=True)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize(
    ("slow", "at", "position"),
    [
        # the 3rd step is under way (forward pass done: BatchNorm statistics updated, weights not yet)
        ("spkflow.train.build:Objective.forward", 3, (1, 2, 2)),
        # epoch 1's validation, after its 4 steps and before its end is recorded
        ("spkflow.train.validation:Validator.eer", 1, (1, 4, 4)),
    ],
    ids=["in a step", "in validation"],
)
def test_sigterm_in_a_step_that_does_not_end_checkpoints_at_once(
    setup: dict[str, Any], tmp_path: Path, slow: str, at: int, position: tuple[int, int, int]
) -> None:
    """The trainer is stopped inside a step (or a validation) that would take an hour
    (test/helpers/slow_step.py): SIGTERM writes the checkpoint of the last completed step at once and
    the process exits 143 without finishing the step, where before it promised a checkpoint "after
    this step" that a supervisor's SIGKILL, seconds later, never let it write.  The rerun trains the
    dropped step again and ends with the uninterrupted run's weights and BatchNorm statistics."""
    import signal

    from helpers.procs import wait_until
    from helpers.slow_step import Slow, slow_env
    from spkflow.train.trainer import Trainer

    full = tmp_path / "full"
    Trainer(train_options(setup, full)).run()
    config_path = tmp_path / "train.yaml"
    config_path.write_text(yaml.safe_dump(setup["config"]))
    out, marker = tmp_path / "exp", tmp_path / "in_the_slow_call"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    module, attr = slow.split(":")
    args = [sys.executable, "-m", "spkflow.bin.train", *cli_args(setup, out, config_path), "--trace-batches"]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=slow_env(tmp_path, [Slow(module, attr, at, marker)], env),
    )  # fmt: skip
    try:
        assert wait_until(lambda: marker.exists() or proc.poll() is not None, 300), "the slow call was not reached"
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)  # the step sleeps for an hour: only the checkpoint at the signal ends it
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "writing the checkpoint of the last completed step now" in err and "stopped by a signal" in err
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert (ck["epoch"], ck["batch"], ck["step"]) == position and not (out / "model.pth").exists()
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [tuple(line.split()[:2]) for line in (out / "batch_trace.rank0.txt").read_text().splitlines()]
    assert sorted(steps) == [(str(e), str(b)) for e in (1, 2) for b in range(4)]  # each step taken once
    a = torch.load(full / "model.pth", weights_only=True)
    b = torch.load(out / "model.pth", weights_only=True)
    assert any("running_mean" in k for k in a)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
    history = json.loads((out / "history.json").read_text())["history"]
    reference = json.loads((full / "history.json").read_text())["history"]
    for mine, theirs in zip(history, reference, strict=True):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-5)


@pytest.mark.parametrize(
    "path",
    sorted(
        str(p.relative_to(ROOT))
        for pattern in ("egs/*/spk1/conf/train*.yaml", "egs/*/spk1/conf/tuning/*.yaml")
        for p in ROOT.glob(pattern)
    ),
    ids=lambda p: p,
)
def test_shipped_configs_load(path: str) -> None:
    """Every training config of the spk1 recipes (ESPnet's tts1 configs are not ours) passes the checks
    (names, keys, values)."""
    from spkflow.train.config import load_train_config

    cfg = load_train_config(ROOT / path)
    assert cfg["model"]["name"] and cfg["loss"]["name"]


def test_validation_leaves_out_utterances_without_features(setup: dict[str, Any], tmp_path: Path) -> None:
    """Validation reads trials with stage 6's reader: trials naming an utterance without
    features are left out (counted in the log), and what is left must hold both labels."""
    from spkflow.core.errors import InputError
    from spkflow.nnet.models import build_model
    from spkflow.train.validation import Validator

    data = tmp_path / "valid"
    data.mkdir()
    lines = (setup["data"] / "trials").read_text().splitlines()
    target = next(line for line in lines if line.endswith(" target"))
    nontarget = next(line for line in lines if line.endswith(" nontarget"))
    ghost = f"{target.split()[0]} ghost-utt nontarget"
    (data / "trials").write_text("\n".join([target, nontarget, ghost]) + "\n")
    v = Validator(str(data), str(setup["feats"]), use_vad=True, mean_norm=False)
    assert len(v.trials) == 2 and list(v.trials.lines) == [1, 2] and "ghost-utt" not in v.feats
    model = build_model({**TINY_MODEL, "input_dim": 20})
    model.train()
    eer = v.eer(model, torch.device("cpu"), batch_size=2, max_frames=50)
    assert 0.0 <= eer <= 100.0 and model.training  # the model's mode is left as it was
    (data / "trials").write_text("\n".join([target, ghost]) + "\n")
    with pytest.raises(InputError, match=r"1 target and 0 non-target trials left with features in"):
        Validator(str(data), str(setup["feats"]), use_vad=True, mean_norm=False)


def test_amp_dtype_bfloat16_runs_the_objective_in_bfloat16() -> None:
    """train.amp_dtype bfloat16 (CUDA in training; CPU autocast here, as no GPU is in the tests):
    the loss is float32 and finite, close to but not equal to float32's, gradients are float32."""
    import torch

    from spkflow.nnet.losses import build_loss
    from spkflow.nnet.models import build_model
    from spkflow.train.build import Objective

    torch.manual_seed(0)
    model = build_model({"name": "ecapa_tdnn", "input_dim": 24, "channels": 32, "scale": 4, "embed_dim": 16})
    obj = Objective(model, build_loss({"name": "ge2e"}, 16)).eval()
    x = torch.randn(3 * 2, 120, 24)
    labels = torch.arange(3).repeat_interleave(2)
    full = obj(x, labels, 3, 2, None).detach()
    half = obj(x, labels, 3, 2, torch.bfloat16)
    assert half.dtype == torch.float32 and torch.isfinite(half)
    h = float(half.detach())
    assert h != float(full) and abs(h - float(full)) < 0.05 * abs(float(full)) + 1e-3
    half.backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in obj.parameters())


def test_aam_margin_warmup_logged_and_resume_exact(tmp_path: Path) -> None:
    """The margin rises linearly from 0 (start of epoch 1) to 0.2 (start of epoch 3), is a
    function of the step only (a run stopped and resumed mid-epoch ends with the same weights and
    history), and is logged per epoch in history.json."""
    from spkflow.train.trainer import Trainer

    loss = {"name": "aamsoftmax", "margin": 0.2, "scale": 30, "margin_warmup": {"start_epoch": 1, "end_epoch": 3}}
    s = make_train_setup(tmp_path, epochs=3, loss=loss)
    full = Trainer(train_options(s, tmp_path / "full")).run()
    spe = full[0]["steps"]
    expected = [0.2 * (spe - 1) / (2 * spe), 0.2 * (2 * spe - 1) / (2 * spe), 0.2]  # before each epoch's last step
    assert [round(r["margin"], 6) for r in full] == [round(m, 6) for m in expected]
    part = tmp_path / "part"
    Trainer(train_options(s, part, max_steps=spe + 1)).run()  # stops inside epoch 2, mid warm-up
    Trainer(train_options(s, part)).run()
    hb = json.loads((part / "history.json").read_text())["history"]
    assert [round(r["margin"], 6) for r in hb] == [round(r["margin"], 6) for r in full]
    assert [round(r["train_loss"], 5) for r in hb] == [round(r["train_loss"], 5) for r in full]
    for key in ("grad_norm_p50", "grad_norm_p99", "grad_norm_max"):  # the resumed epoch kept its first norms
        assert [r[key] for r in hb] == pytest.approx([r[key] for r in full], rel=1e-5), key
    a = torch.load(tmp_path / "full" / "model.pth", weights_only=True)
    b = torch.load(part / "model.pth", weights_only=True)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


def test_init_from_loads_trained_weights_and_names_a_mismatch(tmp_path: Path) -> None:
    """train.init_from (fine-tuning): at step 0 the model and the AAM classifier are exactly the
    trained ones (max_steps=0 leaves them untouched in checkpoint.pth); a model of another
    architecture, or a classifier over other speakers, is a CheckpointError naming the file."""
    from spkflow.nnet.checkpoint import CheckpointError
    from spkflow.train.trainer import Trainer

    s = make_train_setup(tmp_path, epochs=1, loss={"name": "aamsoftmax", "margin": 0.2, "scale": 30})
    s["config"]["train"]["select"] = "last"
    base = tmp_path / "base"
    Trainer(train_options(s, base)).run()
    trained = torch.load(base / "model.pth", weights_only=True)
    trained_loss = torch.load(base / "checkpoint.pth", weights_only=True)["loss"]
    s["config"]["train"]["init_from"] = str(base)
    s["config"]["loss"]["margin"] = 0.5
    s["config"]["optim"]["lr"] = 0.0  # one step with lr 0: the parameters stay those loaded at step 0
    Trainer(train_options(s, tmp_path / "ft", max_steps=1)).run()
    ck = torch.load(tmp_path / "ft" / "checkpoint.pth", weights_only=True)
    assert ck["step"] == 1
    params = [k for k in trained if "running_" not in k and "num_batches" not in k]  # BN statistics move
    assert params and all(torch.equal(ck["model"][k], trained[k]) for k in params)
    assert torch.equal(ck["loss"]["inner.weight"], trained_loss["inner.weight"])
    s["config"]["optim"]["lr"] = 0.01
    # another architecture: the error names model.pth
    s["config"]["model"] = {**s["config"]["model"], "embed_dim": s["config"]["model"].get("embed_dim", 8) + 4}
    with pytest.raises(CheckpointError, match=r"base/model\.pth.*'model' does not fit"):
        Trainer(train_options(s, tmp_path / "bad")).run()
    # the same model, other speakers (speed perturbation triples the classes): names loss.pth
    s["config"]["model"] = dict(TINY_MODEL)
    s["config"]["train"]["speed_perturb"] = [0.9, 1.0, 1.1]
    with pytest.raises(CheckpointError, match=r"base/loss\.pth.*'loss' does not fit.*same training speakers"):
        Trainer(train_options(s, tmp_path / "bad2")).run()
    s["config"]["train"]["init_from"] = str(base / "model.pth")  # the model only: the classifier starts afresh
    Trainer(train_options(s, tmp_path / "ok", max_steps=1)).run()


def test_loss_pth_holds_the_classifier_of_the_model_epochs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With train.select average, loss.pth is the average of the same epochs' classifiers as
    model.pth (not the last epoch's, which checkpoint.pth holds), and train.init_from starts from
    that pair: at step 0 of the fine-tuning the classifier is loss.pth's."""
    from spkflow.train.trainer import Trainer, average_state_dicts

    s = make_train_setup(tmp_path, epochs=2, loss={"name": "aamsoftmax", "margin": 0.2, "scale": 30})
    base = tmp_path / "base"
    Trainer(train_options(s, base)).run()  # select average, average_last 2
    per_epoch = [torch.load(base / f"epoch{e}.loss.pth", weights_only=True) for e in (1, 2)]
    chosen = torch.load(base / "loss.pth", weights_only=True)
    last = torch.load(base / "checkpoint.pth", weights_only=True)["loss"]
    torch.testing.assert_close(chosen["inner.weight"], average_state_dicts(per_epoch)["inner.weight"])
    assert not torch.equal(chosen["inner.weight"], last["inner.weight"])
    s["config"]["train"]["init_from"] = str(base)
    s["config"]["optim"]["lr"] = 0.0
    with caplog.at_level("INFO"):
        Trainer(train_options(s, tmp_path / "ft", max_steps=1, num_epochs=1)).run()
    ft = torch.load(tmp_path / "ft" / "checkpoint.pth", weights_only=True)["loss"]
    assert torch.equal(ft["inner.weight"], chosen["inner.weight"])
    assert f"+ the loss's weights of {base / 'loss.pth'} (the epochs of model.pth)" in caplog.text


def test_gradient_norms_and_tensorboard_events(tmp_path: Path) -> None:
    """The gradient norm of each step (before clipping) is in train.log's step lines, its
    percentiles in history.json, and, with the tensorboard package, loss, lr, margin, gradient
    norm and validation EER are event scalars in <exp>/tensorboard beside history.json."""
    pytest.importorskip("tensorboard")  # the optional extra (installed by .[test])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from spkflow.train.trainer import Trainer

    loss = {"name": "aamsoftmax", "margin": 0.2, "scale": 30, "margin_warmup": {"start_epoch": 1, "end_epoch": 2}}
    s = make_train_setup(tmp_path, epochs=2, loss=loss)
    s["config"]["train"]["grad_clip"] = 0.0  # not clipped: the logged norm is the one the step used
    out = tmp_path / "exp"
    hist = Trainer(train_options(s, out)).run()
    steps = hist[-1]["steps"]
    for row in hist:
        assert 0 < row["grad_norm_p50"] <= row["grad_norm_p99"] <= row["grad_norm_max"]
        assert row["grad_norm_nonfinite"] == 0
        # the step loop's waits for its batches: within the epoch's time (rounded to 0.1 s)
        assert 0 <= row["first_batch_seconds"] <= row["data_wait_seconds"] <= row["seconds"] + 0.05
        assert 0 <= row["data_wait_share"] <= 1
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/margin", "epoch/valid_eer", "epoch/train_loss"} <= tags
    assert "epoch/data_wait_share" in tags
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, steps + 1))  # log_every 1
    norms = [e.value for e in acc.Scalars("train/grad_norm")]
    assert max(norms) == pytest.approx(max(r["grad_norm_max"] for r in hist), rel=1e-6)
    eer = acc.Scalars("epoch/valid_eer")
    assert [round(e.value, 4) for e in eer] == [round(r["valid_eer"], 4) for r in hist]
    margins = [e.value for e in acc.Scalars("train/margin")]
    assert margins[0] < margins[-1] == pytest.approx(0.2)


def test_buffer_snapshot_holds_the_buffers_before_a_step() -> None:
    """What a checkpoint written during a step holds of the model's and the loss's buffers: their
    values at the step's start (its forward pass has changed the BatchNorm statistics since), the
    state dicts' buffers only; put back, the modules are as they were; taken again, the copies
    follow the same live tensors."""
    from torch import nn

    from spkflow.train.state import BufferSnapshot

    objective = nn.Module()
    objective.model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    objective.model.register_buffer("scratch", torch.zeros(2), persistent=False)  # not in a state dict
    objective.loss = nn.BatchNorm1d(2)
    snapshot = BufferSnapshot(objective)
    before = {k: v.clone() for k, v in objective.model.state_dict().items()}
    snapshot.take()
    objective.model(torch.randn(8, 3))  # training mode: the running statistics and the counter move
    assert not torch.equal(objective.model[1].running_mean, before["1.running_mean"])
    saved = snapshot.saved()
    stats = {"running_mean", "running_var", "num_batches_tracked"}
    assert set(saved["model"]) == {f"1.{k}" for k in stats} and set(saved["loss"]) == stats
    for k, v in saved["model"].items():
        assert torch.equal(v, before[k]), k
    snapshot.put_back()
    for k, v in objective.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    objective.model(torch.randn(8, 3))
    snapshot.take()
    assert torch.equal(snapshot.saved()["model"]["1.running_var"], objective.model[1].running_var)
    assert int(snapshot.saved()["model"]["1.num_batches_tracked"]) == 1  # put back to 0, then one step
