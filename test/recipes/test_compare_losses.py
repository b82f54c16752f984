"""The speechocean762 recipe's local/compare_losses.sh table, on runs whose metrics exist (so it
trains nothing): per-seed rows, the mean row, and the development mean over --dev_sets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from helpers.paths import ROOT

RECIPE = ROOT / "egs/speechocean762/spk1"

EERS = {  # seed -> set -> EER %
    0: {"a": 2.0, "b": 10.0, "c": 30.0},
    1: {"a": 4.0, "b": 14.0, "c": 20.0},
}


def _recipe(tmp_path: Path) -> Path:
    """A recipe dir with the real path.sh, one config and two evaluated seeds of it."""
    r = tmp_path / "recipe"
    (r / "conf").mkdir(parents=True)
    (r / "path.sh").symlink_to(RECIPE / "path.sh")
    (r / "conf" / "x.yaml").write_text("loss:\n  name: ge2e_xs\ntrain:\n  seed: 0\n")
    for seed, eers in EERS.items():
        exp = r / "exp" / f"spk_x_seed{seed}"
        (exp / "config.yaml").parent.mkdir(parents=True)
        (exp / "config.yaml").write_text("loss:\n  name: ge2e_xs\n")
        for s, eer in eers.items():
            (exp / "eval" / s).mkdir(parents=True)
            (exp / "eval" / s / "metrics.json").write_text(json.dumps({"eer": eer, "min_dcf_p0.01": 0.5}))
    return r


def _run(r: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = ["bash", str(RECIPE / "local/compare_losses.sh"), "--seeds", "0 1", "--configs", "conf/x.yaml", *args]
    return subprocess.run(cmd, cwd=r, capture_output=True, text=True, timeout=120)


def test_dev_mean_column(tmp_path: Path) -> None:
    r = _recipe(tmp_path)
    out = _run(r, "--test_sets", "a b c", "--dev_sets", "a b")
    assert out.returncode == 0, out.stderr
    rows = {line.split("|")[3].strip(): line for line in out.stdout.splitlines() if line.startswith("| x |")}
    assert "development mean EER % (a, b)" in out.stdout
    cells = lambda row: [c.strip() for c in row.strip().strip("|").split("|")]  # noqa: E731
    assert cells(rows["0"])[-2] == "6.00" and cells(rows["1"])[-2] == "9.00"  # (2 + 10) / 2, (4 + 14) / 2
    assert cells(rows["mean"])[-2] == "**7.50**"
    assert cells(rows["mean"])[3] == "3.00" and cells(rows["mean"])[7] == "25.00"  # per-set means kept
    table = [line for line in out.stdout.splitlines(keepends=True) if line.startswith("|")]
    assert (r / "exp" / "compare_losses.md").read_text() == "".join(table)
    assert "x_seed0: metrics exist, skipped" in out.stdout  # nothing trained


def test_without_dev_sets_no_column(tmp_path: Path) -> None:
    out = _run(_recipe(tmp_path), "--test_sets", "a b c")
    assert out.returncode == 0, out.stderr
    assert "development mean" not in out.stdout
    lines = out.stdout.splitlines()
    head = next(line for line in lines if line.startswith("| config"))
    assert next(line for line in lines if "| mean |" in line).count("|") == head.count("|")


def test_dev_set_must_be_a_test_set(tmp_path: Path) -> None:
    out = _run(_recipe(tmp_path), "--test_sets", "a b", "--dev_sets", "a z")
    assert out.returncode != 0
    assert "--dev_sets holds z, which is not among --test_sets (a b)" in out.stdout + out.stderr


SUMMARISE = RECIPE / "local/summarise_runs.py"


def _summarise(r: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SUMMARISE), *args]
    return subprocess.run(cmd, cwd=r, capture_output=True, text=True, timeout=120)


def test_summarise_correlation_and_plot(tmp_path: Path) -> None:
    """The development mean against a held-out set, one point per run: Pearson's r as numpy gives
    it, the plot written, a run lacking a set named and left out, and the table unchanged."""
    r = _recipe(tmp_path)
    extra = {2: {"a": 3.0, "b": 12.0, "c": 40.0}}  # a second config, one seed
    for seed, eers in extra.items():
        exp = r / "exp" / f"spk_y_seed{seed}"
        for s, eer in eers.items():
            (exp / "eval" / s).mkdir(parents=True)
            (exp / "eval" / s / "metrics.json").write_text(json.dumps({"eer": eer, "min_dcf_p0.01": 0.4}))
    partial = r / "exp" / "spk_z_seed0" / "eval" / "a"
    partial.mkdir(parents=True)
    (partial / "metrics.json").write_text(json.dumps({"eer": 1.0, "min_dcf_p0.01": 0.1}))
    peer = r / "exp" / "peer"
    for s, eer in {"a": 5.0, "b": 15.0, "c": 25.0}.items():
        (peer / "eval" / s).mkdir(parents=True)
        (peer / "eval" / s / "metrics.json").write_text(json.dumps({"eer": eer, "model_tag": "peer"}))
    runs = ["exp/spk_x_seed0", "exp/spk_x_seed1", "exp/spk_y_seed2", "exp/spk_z_seed0"]
    out = _summarise(
        r, "--sets", "a b c", "--dev_sets", "a b", "--heldout", "c", "--peer", "exp/peer", "--plot", "p.png", *runs
    )
    assert out.returncode == 0, out.stderr
    assert "exp/spk_z_seed0 lacks a set of 'a b c': left out" in out.stderr
    dev = [(2 + 10) / 2, (4 + 14) / 2, (3 + 12) / 2]
    want = np.corrcoef(dev, [30.0, 20.0, 40.0])[0, 1]
    assert f"development mean vs c: r = {want:+.2f} over 3 runs" in out.stdout
    assert (r / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1:4] for row in rows[1:]] == [
        [" x ", " ge2e_xs ", " 0 "],
        [" x ", " ge2e_xs ", " 1 "],
        [" x ", " ", " mean "],
        [" y ", " - ", " 2 "],  # no config.yaml: loss unknown
    ]


def test_summarise_rejects_a_heldout_set_not_scored(tmp_path: Path) -> None:
    out = _summarise(_recipe(tmp_path), "--sets", "a b", "--dev_sets", "a", "--heldout", "c", "exp/spk_x_seed0")
    assert out.returncode != 0
    assert "--heldout holds c, which is not among --sets (a b)" in out.stderr
