"""test/bench/bench_step_host.py runs small, so that the benchmark of the trainer's host work per
step cannot rot: its rows call the code the trainer runs (and the peers), on a narrow ECAPA."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "test" / "bench"))
import bench_step_host  # noqa: E402


def test_bench_step_host_runs_small(tmp_path: Path) -> None:
    out = bench_step_host.main(
        ["--channels", "16", "--calls", "3", "--rounds", "1", "--json", str(tmp_path / "s.json")]
    )
    assert json.loads((tmp_path / "s.json").read_text()) == out
    rows = ("buffers", "buffers_peer", "seed", "seed_peer")
    assert set(out) == {f"{k}_us" for k in rows} | {"buffers_peer_over_buffers", "seed_peer_over_seed"}
    assert all(out[f"{k}_us"] > 0 for k in rows)
