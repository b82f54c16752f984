"""Stage 4 says when its config does not suit the run (spkflow.train.sizing): a warm-up longer than
the run, and a model large for its data; ``scheduler.warmup_fraction`` scales with the run.  Real
training runs (``python -m spkflow.bin.train``) on features and batch lists made here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.paths import ROOT
from helpers.train import cli_args, make_train_setup
from spkflow.train.config import ConfigError, normalize_train_config
from spkflow.train.optim import lr_factor

PY = sys.executable


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return make_train_setup(tmp_path_factory.mktemp("sizing"), epochs=2)  # 6 x 4 utterances, 4 steps per epoch


def train(setup: dict, out: Path, **sections: dict) -> subprocess.CompletedProcess:
    cfg = {k: dict(v) for k, v in setup["config"].items()}
    for name, values in sections.items():
        cfg[name] = values
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([PY, "-m", "spkflow.bin.train", *cli_args(setup, out, path)], env=env, capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_a_warm_up_longer_than_the_run_is_warned_and_a_fraction_scales(setup, tmp_path):
    p = train(setup, tmp_path / "steps", scheduler={"name": "warmup_cosine", "warmup_steps": 500})
    log = p.stderr
    assert "WARNING" in log and "warm-up of 500 steps is longer than the run's 8 steps" in log
    assert "the learning rate peaks at 0.00014 instead of 0.01" in log and "scheduler.warmup_fraction" in log
    p = train(setup, tmp_path / "frac", scheduler={"name": "warmup_cosine", "warmup_fraction": 0.25})
    assert "warm-up from 0 over 2 steps (0.25 of the run's 8 steps)" in p.stderr and "peaks at" not in p.stderr
    written = yaml.safe_load((tmp_path / "frac" / "config.yaml").read_text())["scheduler"]
    assert written["warmup_fraction"] == 0.25
    plain = yaml.safe_load((tmp_path / "steps" / "config.yaml").read_text())["scheduler"]
    assert "warmup_fraction" not in plain  # a config without it is written as before
    f = lr_factor({**written, "name": "warmup_cosine"}, 400, 200)
    assert f(50) == pytest.approx(0.5) and f(100) == pytest.approx(1.0)  # 0.25 of 400 steps
    with pytest.raises(ConfigError, match="warmup_fraction .* exclusive"):
        normalize_train_config({**setup["config"], "scheduler": {"warmup_fraction": 0.1, "warmup_steps": 5}})


def test_a_model_large_for_the_data_is_warned(setup, tmp_path):
    small = train(setup, tmp_path / "small")
    assert "large for the data" not in small.stderr
    big = {"name": "ecapa_tdnn", "channels": 64, "scale": 4, "embed_dim": 16}
    p = train(setup, tmp_path / "big", model=big)
    assert "WARNING" in p.stderr and "training utterances of 6 speakers" in p.stderr
    assert "per utterance, above 5,000): the model is large for the data" in p.stderr
