"""test/bench/bench_pipes.py runs small, so that the benchmark of a wav.scp command's cost cannot
rot: each row reads the WAV it wrote (the benchmark checks the bytes), and the guarded rows are
the code stage 5 runs."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "test" / "bench"))
import bench_pipes  # noqa: E402


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv here (util-linux)")
def test_bench_pipes_runs_small(tmp_path: Path) -> None:
    from spkflow.data import pipes

    out = bench_pipes.main(["--commands", "3", "--rounds", "1", "--hold-gb", "0", "--json", str(tmp_path / "p.json")])
    assert json.loads((tmp_path / "p.json").read_text()) == out
    row = out["hold_0_gb"]
    assert set(row) == {f"{k}_{m}" for k in ("plain", "setpriv", "prctl") for m in ("ms", "over_plain")}
    assert row["plain_over_plain"] == 1.0 and all(row[f"{k}_ms"] > 0 for k in ("plain", "setpriv", "prctl"))
    assert pipes._guard_start()[0][-2:] == ["--pdeathsig", "HUP"]  # the benchmark left the module as it was
