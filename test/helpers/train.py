"""A training set-up on real files made here (data dir, stage-2 features, stage-3 batch lists,
trials, config) and the trainer's command-line arguments for it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from helpers.audio import make_speakers

TINY_MODEL = {
    "name": "ecapa_tdnn",
    "channels": 16,
    "scale": 4,
    "embed_dim": 8,
    "specaug": {"freq_width": 3, "time_width": 4},
}


def make_train_setup(
    root: Path,
    num_spk: int = 6,
    num_utt: int = 4,
    N: int = 3,
    M: int = 2,
    epochs: int = 2,
    model: dict[str, Any] | None = None,
    loss: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Data dir + stage-2 features + stage-3 batch lists + trials + a training config."""
    from spkflow.features.fbank import FbankOptions, VadOptions
    from spkflow.features.jobs import extract_job, merge_jobs
    from spkflow.train.batches import plan_epoch, write_batch_list

    data = make_speakers(root, num_spk=num_spk, num_utt=num_utt, min_sec=0.5, max_sec=0.9)
    utts = [line.split()[0] for line in (data / "utt2spk").read_text().splitlines()]
    (root / "list").write_text("".join(u + "\n" for u in utts))
    fb = FbankOptions(num_mel_bins=20)
    conf = root / "conf"
    conf.mkdir()
    (conf / "fbank.conf").write_text(fb.to_kaldi_conf())
    (conf / "vad.conf").write_text(VadOptions().to_kaldi_conf())
    feats = root / "feats"
    feats.mkdir()
    extract_job(data, root / "list", root / "arks", "train", 1, fb, VadOptions(), progress=False)
    merge_jobs(data, feats, root / "arks", "train", 1)
    batches = root / "exp" / "batches"
    batches.mkdir(parents=True)
    for e in range(1, epochs + 1):
        write_batch_list(batches / f"epoch{e}.txt", plan_epoch(data / "spk2utt", N, M, seed=0, epoch=e))
    spk = {u: u.split("-")[0] for u in utts}
    trials = [f"{a} {b} {'target' if spk[a] == spk[b] else 'nontarget'}\n" for a, b in itertools.combinations(utts, 2)]
    (data / "trials").write_text("".join(trials))
    config = {
        "frontend": {"vad": True, "mean_norm": False},
        "model": dict(model or TINY_MODEL),
        "loss": dict(loss or {"name": "ge2e"}),
        "optim": {"name": "adam", "lr": 0.01},
        "scheduler": {"name": "warmup_cosine", "warmup_steps": 2},
        "train": {
            "crop_min_frames": 20,
            "crop_max_frames": 30,
            "select": "average",
            "average_last": 2,
            "log_every": 1,
            "input_stats_utts": 10,
        },
    }
    return {
        "data": data,
        "feats": feats,
        "batches": batches,
        "conf": conf,
        "config": config,
        "epochs": epochs,
        "root": root,
    }


def train_options(setup: dict[str, Any], out: Path, *, valid: bool = True, **kw: Any):
    """``TrainOptions`` of a :func:`make_train_setup` run into ``out`` on the CPU without a progress
    bar (validation on the training data unless ``valid`` is false); ``kw`` overrides."""
    from spkflow.train.trainer import TrainOptions

    base: dict[str, Any] = dict(
        config=setup["config"],
        train_data=str(setup["data"]),
        train_feats=str(setup["feats"]),
        batches_dir=str(setup["batches"]),
        out_dir=str(out),
        num_epochs=setup["epochs"],
        fbank_conf=str(setup["conf"] / "fbank.conf"),
        vad_conf=str(setup["conf"] / "vad.conf"),
        device="cpu",
        progress=False,
    )
    if valid:
        base.update(valid_data=str(setup["data"]), valid_feats=str(setup["feats"]))
    base.update(kw)
    return TrainOptions(**base)


def cli_args(setup: dict[str, Any], out: Path, config_path: Path) -> list[str]:
    return [
        "--config",
        str(config_path),
        "--train-data",
        str(setup["data"]),
        "--train-feats",
        str(setup["feats"]),
        "--batches-dir",
        str(setup["batches"]),
        "--num-epochs",
        str(setup["epochs"]),
        "--out-dir",
        str(out),
        "--valid-data",
        str(setup["data"]),
        "--valid-feats",
        str(setup["feats"]),
        "--fbank-conf",
        str(setup["conf"] / "fbank.conf"),
        "--vad-conf",
        str(setup["conf"] / "vad.conf"),
        "--device",
        "cpu",
        "--no-progress",
        "--num-threads",
        "1",
    ]


def train_sh_command(setup: dict[str, Any], out: Path, config_path: Path, *opts: str) -> list[str]:
    """scripts/spk/train.sh on ``setup`` into ``out``, as spk.sh stage 4 calls it, plus ``opts``."""
    from helpers.paths import ROOT

    return [
        str(ROOT / "scripts" / "spk" / "train.sh"),
        "--train-config",
        str(config_path),
        "--num-epochs",
        str(setup["epochs"]),
        "--num-threads",
        "1",
        "--fbank-conf",
        str(setup["conf"] / "fbank.conf"),
        "--vad-conf",
        str(setup["conf"] / "vad.conf"),
        "--train-opts",
        "--no-progress --trace-batches",
        *opts,  # last: they win (parse_options keeps the last value)
        str(setup["feats"]),
        str(setup["batches"]),
        str(out),
    ]


def make_train_sh_setup(root: Path, epochs: int) -> dict[str, Any]:
    """:func:`make_train_setup` as scripts/spk/train.sh reads it: 12 speakers x 4 utterances in
    2 x 2 batches (12 batches per epoch, 6 per rank of 2), the dump dir a copy of the data dir (as
    stage 2 writes it), the config in ``root``/train.yaml (``config_path``)."""
    import shutil

    import yaml

    s = make_train_setup(root, num_spk=12, num_utt=4, N=2, M=2, epochs=epochs)
    for f in ("utt2spk", "spk2utt", "wav.scp"):
        shutil.copy(s["data"] / f, s["feats"] / f)
    s["config_path"] = s["root"] / "train.yaml"
    s["config_path"].write_text(yaml.safe_dump(s["config"]))
    return s
