"""``spkflow COMMAND`` dispatches to ``python -m spkflow.bin.COMMAND`` with the arguments unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import spkflow.bin

BIN = Path(spkflow.bin.__file__).parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spkflow.bin", *args], capture_output=True, text=True, timeout=120)


def test_lists_every_command_with_its_docstring_line():
    res = run()
    assert res.returncode == 0, res.stderr
    names = {p.stem for p in BIN.glob("*.py")} - {"__init__", "__main__", "argtypes"}
    listed = {line.split()[0] for line in res.stdout.splitlines() if line.startswith("  ")}
    assert listed == names
    assert "Write one epoch's N x M batch list from a spk2utt file." in res.stdout


def test_passes_arguments_on(tmp_path):
    spk2utt = tmp_path / "spk2utt"
    spk2utt.write_text("a a-1 a-2\nb b-1 b-2\n")
    out = tmp_path / "epoch1.txt"
    args = ["--spk2utt", str(spk2utt), "--num-spk", "2", "--num-utt", "2", "--seed", "0", "--epoch", "1"]
    via_cli = run("make-batches", *args, "--out", str(out))
    assert via_cli.returncode == 0, via_cli.stderr
    direct = tmp_path / "direct.txt"
    res = subprocess.run(
        [sys.executable, "-m", "spkflow.bin.make_batches", *args, "--out", str(direct)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert out.read_text() == direct.read_text() != ""


def test_unknown_command_is_an_error():
    res = run("no_such_command")
    assert res.returncode == 2
    assert "unknown command 'no_such_command'" in res.stderr
