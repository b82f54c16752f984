"""The make_batches command and stage 3 of spk.sh, run as a user runs them (subprocesses).

The command's files are checked against guarantees a-e on their own (speaker ownership
from the spk2utt file, 4 ranks disjoint and equal), against the in-process planner, and
for byte-identical output under different PYTHONHASHSEED values.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.paths import ROOT
from helpers.recipes import template_recipe
from spkflow.train.batches import plan_epoch, read_batch_list


def make_spk2utt(path: Path, num_speakers: int = 60, seed: int = 0) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    counts = np.maximum(1, rng.lognormal(np.log(25), 0.9, num_speakers).astype(int))
    mapping = {f"spk{i:03d}": [f"spk{i:03d}-{j:04d}" for j in range(n)] for i, n in enumerate(counts)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{s} {' '.join(u)}\n" for s, u in sorted(mapping.items())), encoding="utf-8")
    return mapping


def run_cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "spkflow.bin.make_batches", *map(str, args)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def plan_cli(
    spk2utt: Path, out: Path, num_spk: int, num_utt: int, seed: int, epoch: int, *extra: str | int, env=None
) -> subprocess.CompletedProcess:
    """spkflow.bin.make_batches: the batch list of one epoch of ``spk2utt`` into ``out``."""
    return run_cli(
        *("--spk2utt", spk2utt, "--num-spk", num_spk, "--num-utt", num_utt, "--seed", seed, "--epoch", epoch),
        *extra,
        *("--out", out),
        env=env,
    )


def test_four_ranks_from_the_command(tmp_path: Path) -> None:
    spk2utt = tmp_path / "spk2utt"
    mapping = make_spk2utt(spk2utt)
    owner = {u: s for s, us in mapping.items() for u in us}
    N, M, W = 8, 4, 4
    files = []
    for r in range(W):
        out = tmp_path / f"rank{r}.txt"
        res = plan_cli(spk2utt, out, N, M, 3, 2, "--world-size", W, "--rank", r)
        assert res.returncode == 0, res.stderr
        assert re.search(rf"rank {r} of {W}; coverage \d+\.\d\d% ", res.stderr)
        assert "speakers with < 4 utterances dropped: " in res.stderr
        files.append(read_batch_list(out, batch_size=N * M))
    # e: equal counts, disjoint
    assert len({len(f) for f in files}) == 1 and len(files[0]) > 0
    used = [u for f in files for b in f for u in b]
    assert len(used) == len(set(used))
    # a: N distinct speakers x M utterances, speaker-major
    for b in (b for f in files for b in f):
        blocks = [{owner[u] for u in b[k * M : (k + 1) * M]} for k in range(N)]
        assert all(len(x) == 1 for x in blocks)
        assert len(set().union(*blocks)) == N
    # c: the remainder is less than N groups per rank plus the rank-split remainder
    possible = sum(len(u) // M for u in mapping.values())
    assert possible - len(used) // M < N + (W - 1) * N
    # the same as in process
    for r, f in enumerate(files):
        assert f == plan_epoch(spk2utt, N, M, 3, 2, W, r).batches


def test_output_is_byte_identical_across_hash_seeds(tmp_path: Path) -> None:
    spk2utt = tmp_path / "spk2utt"
    make_spk2utt(spk2utt, seed=1)
    outs = []
    for hs in ("0", "12345"):
        out = tmp_path / f"out{hs}.txt"
        res = plan_cli(spk2utt, out, 5, 3, 9, 1, "--short-speakers", "repeat", env={"PYTHONHASHSEED": hs})
        assert res.returncode == 0, res.stderr
        assert "repeated: " in res.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and outs[0].endswith(b"\n")


@pytest.mark.parametrize(
    "text, where",
    [
        ("a a1 a2 a3\nb b1 b2 b3\nc\n", ":3: speaker 'c' has no utterances"),
        ("a a1 a2 a3\nb b1 b2 a1\n", ":2: utterance 'a1' of speaker 'b' is also listed under speaker 'a'"),
        ("a a1 a2 a3\nb b1 b2 b3\na a4\n", ":3: speaker 'a' is also on line 1"),
        ("", ": spk2utt is empty"),
        ("a a1 a2 a3\nb b1 b2\n", ": --num-spk 2 is more than the 1 speakers with at least 3 utterances"),
    ],
)
def test_bad_input_fails_cleanly_and_leaves_output_alone(tmp_path: Path, text: str, where: str) -> None:
    spk2utt = tmp_path / "spk2utt"
    spk2utt.write_text(text)
    out = tmp_path / "out.txt"
    out.write_text("previous complete plan\n")
    res = plan_cli(spk2utt, out, 2, 3, 0, 1)
    assert res.returncode == 1
    assert f"{spk2utt}{where}" in res.stderr
    assert out.read_text() == "previous complete plan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "spk2utt"]


@pytest.mark.parametrize(
    "args",
    [
        ["--num-spk", "0", "--num-utt", "2"],
        ["--num-spk", "2", "--num-utt", "-1"],
        ["--num-spk", "2", "--num-utt", "2", "--world-size", "4", "--rank", "4"],
        ["--num-spk", "2", "--num-utt", "2", "--short-speakers", "keep"],
    ],
)
def test_bad_arguments_exit_2(tmp_path: Path, args: list[str]) -> None:
    spk2utt = tmp_path / "spk2utt"
    make_spk2utt(spk2utt)
    res = run_cli("--spk2utt", spk2utt, "--seed", 0, "--epoch", 1, "--out", tmp_path / "o", *args)
    assert res.returncode == 2
    assert "usage:" in res.stderr
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ stage 3 of spk.sh


def run_stage3(recipe: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "bash",
            "spk.sh",
            "--stage",
            "3",
            "--stop_stage",
            "3",
            "--train_set",
            "train",
            "--tag",
            "t",
            "--num_spk",
            "4",
            "--num_utt",
            "3",
            "--num_epochs",
            "3",
            "--batch_seed",
            "5",
            *extra,
        ],
        cwd=recipe,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_stage3_writes_one_file_per_epoch_and_reuses_them(tmp_path: Path) -> None:
    recipe = template_recipe(tmp_path / "recipe")
    data_spk2utt = recipe / "data" / "train" / "spk2utt"
    make_spk2utt(data_spk2utt, num_speakers=20, seed=2)

    res = run_stage3(recipe)
    assert res.returncode == 0, res.stdout + res.stderr
    bdir = recipe / "exp" / "spk_t" / "batches"
    for e in (1, 2, 3):
        assert read_batch_list(bdir / f"epoch{e}.txt") == plan_epoch(data_spk2utt, 4, 3, 5, e).batches
    # one line on the console for all epochs, one line per epoch in the summary file
    stage3 = [line for line in res.stdout.splitlines() if "batch lists (" in line]
    assert len(stage3) == 1 and "(3 planned, 0 kept)" in stage3[0], res.stdout
    assert re.search(r"\d+(-\d+)? batches per epoch, coverage \d+(\.\d+)?%", stage3[0]), stage3[0]
    assert "Epoch 1:" not in res.stdout
    summary = (bdir / "log" / "summary.txt").read_text()
    assert len(re.findall(r"Epoch \d: \d+ batches of 4 x 3 for rank 0 of 1; coverage \d+\.\d\d%", summary)) == 3

    before = (bdir / "epoch2.txt").stat().st_mtime_ns
    res = run_stage3(recipe)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(0 planned, 3 kept)" in res.stdout
    assert (bdir / "epoch2.txt").stat().st_mtime_ns == before

    # stage 2's copy of the data dir (minus bad utterances) takes over, and the plans follow it
    dump_spk2utt = recipe / "dump" / "fbank" / "train" / "spk2utt"
    make_spk2utt(dump_spk2utt, num_speakers=18, seed=2)
    res = run_stage3(recipe)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Batch settings changed" in res.stdout
    for e in (1, 2, 3):
        assert read_batch_list(bdir / f"epoch{e}.txt") == plan_epoch(dump_spk2utt, 4, 3, 5, e).batches


def test_stage3_reports_bad_input(tmp_path: Path) -> None:
    recipe = template_recipe(tmp_path / "recipe")
    spk2utt = recipe / "data" / "train" / "spk2utt"
    spk2utt.parent.mkdir(parents=True)
    spk2utt.write_text("a a1 a2 a3\nb b1 b2 b3\nc\n")
    res = run_stage3(recipe)
    assert res.returncode != 0
    assert "data/train/spk2utt:3: speaker 'c' has no utterances" in res.stdout + res.stderr
    assert not list((recipe / "exp" / "spk_t" / "batches").glob("epoch*.txt"))


def test_stage3_needs_a_spk2utt(tmp_path: Path) -> None:
    recipe = template_recipe(tmp_path / "recipe")
    res = run_stage3(recipe)
    assert res.returncode != 0
    assert "no spk2utt" in res.stdout + res.stderr
