"""Stage 3's check of the training settings against the corpus (spkflow.train.preflight, python -m
spkflow.bin.check_training): N x M batches the speakers cannot fill are an error naming the option
and what would fit; crops much longer than the utterances' voiced speech and a model large for the
speakers are warnings naming the keys.  Real spk2utt tables, stage-2 features (VAD arks) of
synthetic speech made here, the template's configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.paths import ROOT, TEMPLATE
from helpers.train import make_train_setup
from spkflow.train.preflight import CROP_PER_MEDIAN, crop_warning, speakers_error
from spkflow.train.spk2utt import Spk2Utt

PY = sys.executable


def table(counts: list[int]) -> Spk2Utt:
    return Spk2Utt.from_mapping({f"s{i:02d}": [f"s{i:02d}-{j}" for j in range(n)] for i, n in enumerate(counts)})


def test_more_speakers_per_batch_than_the_corpus_has_is_an_error_saying_what_fits() -> None:
    t = table([6] * 20)
    msg = speakers_error(t, 32, 6, "drop", 1)
    assert msg is not None and msg.startswith("--num_spk 32 is more than the 20 training speakers with at least 6")
    assert msg.endswith("lower --num_spk to 20 or fewer")  # no M lets 32 of 20 speakers fit
    assert speakers_error(t, 20, 6, "drop", 1) is None
    # 10 speakers with 8 utterances, 10 with 3: N = 12 fits with M = 3, or with short speakers repeated
    t = table([8] * 10 + [3] * 10)
    msg = speakers_error(t, 12, 4, "drop", 1)
    assert "the 10 training speakers with at least 4" in msg and "--num_utt 3 (12 speakers have that many)" in msg
    assert "--short_speakers repeat" in msg
    assert speakers_error(t, 12, 3, "drop", 1) is None and speakers_error(t, 12, 4, "repeat", 1) is None
    # enough speakers, but fewer batches per epoch than processes: a rank would get none
    msg = speakers_error(table([2] * 4), 4, 2, "drop", 2)
    assert msg is not None and "1 batch(es) of 4 x 2 per epoch" in msg and "fewer than the 2 training processes" in msg


def test_crops_much_longer_than_the_voiced_speech_are_warned() -> None:
    msg = crop_warning(200, 300, 59, "voiced")
    assert msg is not None and "train.crop_min_frames, train.crop_max_frames" in msg
    assert "59 voiced frames (median)" in msg and "5.1 times over" in msg and "about 29-59" in msg
    assert crop_warning(80, 160, 254, "voiced") is None  # the demo's crops on speechocean762 train
    assert crop_warning(100, int(CROP_PER_MEDIAN * 60), 60, "voiced") is None  # at the threshold: no warning
    assert crop_warning(100, int(CROP_PER_MEDIAN * 60) + 1, 60, "voiced") is not None


@pytest.fixture(scope="module")
def short_clips(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """6 speakers x 4 clips of 0.5-0.9 s (stage-2 features with VAD)."""
    return make_train_setup(tmp_path_factory.mktemp("preflight"))


def check(setup: dict, config: Path, *opts: str) -> subprocess.CompletedProcess:
    args = [PY, "-m", "spkflow.bin.check_training", "--config", config, "--spk2utt", setup["data"] / "spk2utt"]
    args += ["--train-dir", setup["feats"], "--fbank-conf", TEMPLATE / "conf" / "fbank.conf", *opts]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(list(map(str, args)), capture_output=True, text=True, env=env, timeout=300)


def test_the_template_defaults_on_short_clips_say_what_to_change(short_clips: dict, tmp_path: Path) -> None:
    """The template's 6.19 M ECAPA with 200-300-frame crops and --num_spk 32 on 6 speakers of clips
    under a second: one error (exit 1) and two warnings, each naming what to change."""
    p = check(short_clips, TEMPLATE / "conf" / "train_ecapa_ge2e_xs.yaml", "--num-spk", "32", "--num-utt", "6")
    assert p.returncode == 1, p.stderr
    lines = p.stderr.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["Warning", "Warning", "Error"], p.stderr
    assert "--num_spk 32 is more than the 0 training speakers with at least 6 utterances" in lines[2]
    assert lines[2].endswith("lower --num_utt to 4 and --num_spk to 6 or fewer"), lines[2]
    assert "train.crop_max_frames" in lines[0] and "voiced frames (median)" in lines[0]
    assert "6.19 M parameters for 24 training utterances of 6 speakers" in lines[1]
    assert "per speaker, above 50,000" in lines[1] and "model.channels" in lines[1]
    # a small model, crops the length of the speech, a batch the speakers fill: nothing to say
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(short_clips["config"]))  # a 16-channel ECAPA, 20-30-frame crops
    p = check(short_clips, small, "--num-spk", "3", "--num-utt", "2")
    assert p.returncode == 0 and p.stderr == "", p.stderr
