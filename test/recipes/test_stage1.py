"""Stage 1 of the demo recipe end to end: ``./run.sh --stage 1 --stop_stage 1``.

The recipe runs in a mirror of the project made of symbolic links (``.venv``, ``spkflow``,
``utils``, ``local``, ``scripts``, ``egs/TEMPLATE`` and the recipe's own files), so that its
``data/`` lands under pytest's temporary folder and never in the repository.  Corpus paths
are given through the db.sh variables, as a user would.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers.corpora import make_dsp20_mini, make_fsdd_mini, make_librispeech_mini, make_speechocean_mini
from helpers.recipes import mirror_recipe
from spkflow.corpora.trials import read_trials
from spkflow.data.datadir import DataDir


def run_stage1(recipe: Path, env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(env_extra)
    return subprocess.run(
        ["./run.sh", "--stage", "1", "--stop_stage", "1", *args],
        cwd=recipe,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_stage1_on_mini_corpora(tmp_path: Path) -> None:
    so762 = make_speechocean_mini(
        tmp_path / "so762", spk_train=("0001", "0005", "1027"), spk_test=("0003", "9601", "9602"), n_train=3, n_test=3
    )
    dsp = make_dsp20_mini(tmp_path / "dsp", spks=("15307110189", "15307130120", "15307130191"), words=2, rounds=3)
    recipe = mirror_recipe(tmp_path)
    r = run_stage1(recipe, {"SPEECHOCEAN762": str(so762), "DSPSPEECH20": str(dsp)})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    data = recipe / "data"
    assert f"Stage 1 output: data dirs in {recipe}/data" in out  # says where the output went
    assert re.search(r"data/train: 3 speakers, 9 utterances", out)
    counts = {
        name: (len(DataDir(data / name).spks()), len(DataDir(data / name).utts()))
        for name in ("train", "test", "dsp20")
    }
    assert counts == {"train": (3, 9), "test": (3, 9), "dsp20": (2, 8)}  # rounds 01-02, 15307130191 left out
    for name in ("test", "dsp20"):
        trials = read_trials(data / name / "trials", DataDir(data / name).utt2spk())
        assert sum(t for *_, t in trials) == {"test": 9, "dsp20": 12}[name]
    assert data.resolve().is_relative_to(tmp_path.resolve()) and not data.is_symlink()


def test_stage1_prepares_heldout_sets_on_request(tmp_path: Path) -> None:
    """--librispeech true --fsdd true add data/libri and data/fsdd (with trials) as test sets;
    --dsp20_8k true adds data/dsp20_8k, DSPSpeech-20 read through 8 kHz ffmpeg pipes, which
    stage 1's validation reads (durations) like any other set."""
    so762 = make_speechocean_mini(
        tmp_path / "so762", spk_train=("0001", "0005", "1027"), spk_test=("0003", "9601", "9602"), n_train=3, n_test=3
    )
    dsp = make_dsp20_mini(tmp_path / "dsp", spks=("15307110189", "15307130120"), words=2, rounds=2)
    libri, fsdd = make_librispeech_mini(tmp_path / "libri"), make_fsdd_mini(tmp_path / "fsdd")
    recipe = mirror_recipe(tmp_path)
    env = {"SPEECHOCEAN762": str(so762), "DSPSPEECH20": str(dsp), "LIBRISPEECH": str(libri), "FSDD": str(fsdd)}
    r = run_stage1(recipe, env, "--test_sets", "test dsp20 libri fsdd")
    assert r.returncode != 0 and "data/libri" in r.stdout + r.stderr  # not prepared unless asked for
    r = run_stage1(
        recipe,
        env,
        "--test_sets",
        "test dsp20 libri fsdd dsp20_8k",
        "--local_data_opts",
        "--librispeech true --fsdd true --dsp20_8k true",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "data/libri: 3 speakers, 8 utterances" in out and "data/fsdd: 3 speakers, 18 utterances" in out
    assert "data/dsp20_8k: 2 speakers, 8 utterances" in out
    data = recipe / "data"
    assert (data / "dsp20_8k" / "trials").read_text() == (data / "dsp20" / "trials").read_text()
    pipes = (data / "dsp20_8k" / "wav.scp").read_text().splitlines()
    assert len(pipes) == 8 and all(line.endswith("-ar 8000 - |") for line in pipes)
    for name in ("libri", "fsdd"):
        trials = read_trials(recipe / "data" / name / "trials", DataDir(recipe / "data" / name).utt2spk())
        assert sum(t for *_, t in trials) > 0


def test_stage1_fails_clearly_without_corpus(tmp_path: Path) -> None:
    recipe = mirror_recipe(tmp_path)
    r = run_stage1(
        recipe,
        {"SPEECHOCEAN762": str(tmp_path / "missing"), "DSPSPEECH20": str(tmp_path / "m2")},
        "--local_data_opts",
        "--download false",
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "SPEECHOCEAN762" in out and "export SPEECHOCEAN762=" in out


@pytest.mark.corpus
def test_stage1_on_real_corpora(tmp_path: Path, corpus) -> None:
    so762, dsp = corpus("SPEECHOCEAN762"), corpus("DSPSPEECH20")
    recipe = mirror_recipe(tmp_path)
    r = run_stage1(recipe, {"SPEECHOCEAN762": str(so762), "DSPSPEECH20": str(dsp)})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "data/train: 125 speakers, 1500 utterances" in out
    assert "data/test: 125 speakers, 500 utterances" in out and "trials: 750 target + 7500 nontarget" in out
    assert "data/dsp20: 33 speakers, 1320 utterances" in out and "trials: 25740 target + 257400 nontarget" in out
    assert f"Stage 1 output: data dirs in {recipe}/data" in out
