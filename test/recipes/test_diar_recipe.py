"""The diarization recipe (egs/speechocean762/diar1) end to end, CI-sized: two short conversations
simulated from the real LibriSpeech mini speakers with the AMI turn-taking statistics, and the real
AMI excerpts prepared; a tiny model with a scoring, packed as spk1's stage 7 packs it and given to
the recipe as the pack (random weights: a real model, real arks; the figures of the demo model are
in the recipe's RESULTS.md); then a WeSpeaker ONNX model through the same stages (another toolkit:
plain cosine, no scoring), and the bad inputs named."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.recipes import linked_recipe


def sh(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, LC_ALL="C", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # path.sh sets it to the project root
    p = subprocess.run(["bash", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


def _recipe(tmp_path: Path) -> Path:
    return linked_recipe(tmp_path, "diar1")


@pytest.mark.slow
@pytest.mark.corpus
def test_diar_recipe_end_to_end(tmp_path, corpus):
    from helpers.models import make_scored_model_dir, make_wespeaker_onnx

    corpus("LIBRISPEECH")
    corpus("SPEECHOCEAN762")  # data/sim_so762: conversations of its test speakers
    corpus("AMI_EXCERPTS")
    recipe = _recipe(tmp_path)
    model_dir = make_scored_model_dir(tmp_path / "spk_dir", tmp_path / "model_audio")
    model = tmp_path / "spk_model.zip"  # every stage from the pack, as the README shows
    sh(["-c", f". ./path.sh && python -m spkflow.bin.pack --model-dir {model_dir} --out {model}"], recipe)
    data_opts = ["--local_data_opts", "--sim_recordings 2 --sim_duration 20"]
    p = sh(["run.sh", "--spk_model", model, *data_opts, "--sets", "sim"], recipe)
    assert "data/sim: 2 recordings" in p.stdout
    # unpacked once, before stage 3 (the extraction) reads it; its scoring used by stage 4
    unpacked = recipe / "exp" / "diar_spk_model" / "model"
    assert p.stdout.index("Unpacking") < p.stdout.index("Stage 3:") and (unpacked / "scoring.yaml").is_file()
    so762 = (recipe / "data" / "sim_so762" / "rttm").read_text().split("\n")
    assert len({ln.split()[1] for ln in so762 if ln}) == 2  # prepared beside it, scored when in --sets
    ami = recipe / "data" / "ami"  # prepared from AMI_EXCERPTS (db.sh), never copied: wav.scp names the corpus files
    assert (
        len((ami / "wav.scp").read_text().splitlines()) == 14 and (ami / "rttm").is_file() and (ami / "uem").is_file()
    )
    p = sh(["run.sh", "--spk_model", model, "--sets", "ami", "--stop_stage", "1", *data_opts], recipe)
    assert "data/ami: 14 recordings, 0.12 h, 1-4 speakers per recording" in p.stdout
    exp = recipe / "exp" / "diar_spk_model"
    results = (exp / "RESULTS.md").read_text()
    assert "| sim | pipeline |" in results and "| sim | baseline |" in results
    assert "| sim | pipeline_oracle_overlap |" in results  # run.sh's --overlap oracle
    for system in ("pipeline", "baseline", "pipeline_oracle_overlap"):
        d = exp / "sim.oracle_w1.5s0.75" / system
        hyp = (d / "hyp.rttm").read_text().splitlines()
        recs = {ln.split()[1] for ln in hyp}
        assert recs == {ln.split()[0] for ln in (recipe / "data" / "sim" / "wav.scp").read_text().splitlines()}
        total = json.loads((d / "scores.json").read_text())["total"]
        # no order between the conditions: skipping overlap (or the collars) takes away time that is
        # less often wrong than the rest, or more; the full DER is its three parts
        assert total["recordings"] == 2 and min(total["der_forgiving"], total["der_fair"]) >= 0
        assert total["der_full"] == pytest.approx(total["miss"] + total["fa"] + total["conf"], abs=1e-6)
        assert total["miss"] >= 0 and total["fa"] == pytest.approx(0.0, abs=1e-6)  # oracle speech: no false alarm
        assert list(d.glob("plot_*.png"))
    # the reference's overlap given a second speaker: less missed, the same where overlap is not scored
    pl, ov = (json.loads((exp / "sim.oracle_w1.5s0.75" / s / "scores.json").read_text())["total"]
              for s in ("pipeline", "pipeline_oracle_overlap"))  # fmt: skip
    assert ov["miss"] <= pl["miss"] + 1e-9 and ov["der_forgiving"] == pytest.approx(pl["der_forgiving"])
    # the windows were embedded by stage 5 of spk1: one vector per window of the segments file
    emb = exp / "embed" / "sim.oracle_w1.5s0.75" / "xvector.scp"
    seg = recipe / "dump" / "sim.oracle_w1.5s0.75" / "windows" / "segments"
    assert [ln.split()[0] for ln in emb.read_text().splitlines()] == [
        ln.split()[0] for ln in seg.read_text().splitlines()
    ]

    # clustering again on the same embeddings: AHC stopped at the calibrated LLR, oracle counts
    sh(["run.sh", "--spk_model", model, "--sets", "sim", "--stage", "4", "--cluster_method", "ahc",
        "--num_speakers", "oracle", "--baseline", "false"], recipe)  # fmt: skip
    counts = dict(ln.split() for ln in (exp / "sim.oracle_w1.5s0.75" / "reco2num_spk").read_text().splitlines())
    hyp = (exp / "sim.oracle_w1.5s0.75" / "pipeline" / "hyp.rttm").read_text().splitlines()
    for rec, n in counts.items():
        assert len({ln.split()[7] for ln in hyp if ln.split()[1] == rec}) == int(n)

    # another toolkit's model through the same stages (no scoring of ours: plain cosine)
    onnx = make_wespeaker_onnx(tmp_path / "wespeaker")
    sh(["run.sh", "--pretrained", onnx, "--pretrained_toolkit", "wespeaker", "--sets", "sim", "--stage", "3",
        "--tag", "wespeaker"], recipe)  # fmt: skip
    assert (recipe / "exp" / "diar_wespeaker" / "sim.oracle_w1.5s0.75" / "pipeline" / "scores.json").is_file()

    # what bounds the figures (local/limits.py): perfect clustering of these windows is near 0 % DER
    # forgiving, far below the random-weights model's; its window EER is a rate, over real pairs
    for embed, scoring in (("diar_spk_model", unpacked), ("diar_wespeaker", "none")):
        limits = f"python local/limits.py --sets sim --embed exp/{embed}/embed --scoring-dir {scoring}"
        p = sh(["-c", f". ./path.sh && {limits}"], recipe)
        row = next(ln for ln in p.stdout.splitlines() if ln.startswith("| sim |")).split("|")
        floor = [float(v) for v in row[3].split("/")]
        eer, pairs = float(row[4]), int(row[5])
        assert floor[0] < 2.0 and floor[0] <= floor[2] and 0.0 <= eer <= 100.0 and pairs > 0
    pipeline = json.loads((exp / "sim.oracle_w1.5s0.75" / "pipeline" / "scores.json").read_text())["total"]
    assert floor[0] < pipeline["der_forgiving"]

    # bad input: a reference naming a recording that is not in wav.scp: one line, file and line named
    rttm = recipe / "data" / "sim" / "rttm"
    rttm.write_text(rttm.read_text() + "SPEAKER nowhere 1 0.0 1.0 <NA> <NA> x <NA> <NA>\n")
    p = sh(["run.sh", "--spk_model", model, "--sets", "sim", "--stage", "2"], recipe, check=False)
    assert p.returncode != 0
    n = len(rttm.read_text().splitlines())
    assert f"data/sim/rttm:{n}: recording 'nowhere' is not in data/sim/wav.scp" in p.stdout + p.stderr


def test_diar_recipe_names_a_missing_model(tmp_path):
    recipe = _recipe(tmp_path)
    p = sh(["run.sh", "--spk_model", tmp_path / "none", "--stage", "3"], recipe, check=False)
    assert p.returncode == 1
    assert f"the speaker model {tmp_path / 'none'} not found: train it first" in p.stdout + p.stderr
