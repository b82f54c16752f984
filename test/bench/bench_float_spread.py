"""Measure the float spreads the two-path comparisons of the tests are bounded against.

    .venv/bin/python test/bench/bench_float_spread.py [TEST_ID ...] [--threads 1 2] [--permute 0 7] \\
        [--log out.jsonl]

Runs the given tests (default: every file that calls ``helpers.spread.within``) once per thread
count (SPKFLOW_TEST_THREADS, also OMP_NUM_THREADS) and per batch order (SPKFLOW_TEST_PERMUTE; 0:
as written, else the seed of a shuffle), with SPKFLOW_SPREAD_LOG collecting every check's spread.
Prints one row per test and check: the worst spread over all runs, its bound and the margin bound / worst;
a margin under 10 is flagged ("<10x").  Failing tests are reported, not fatal (the spread of a
check that failed is in the log all the same).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def default_tests() -> list[str]:
    """The test files that bound a two-path float comparison with ``within``."""
    return sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "test").rglob("test_*.py") if "within(" in p.read_text("utf-8")
    )


def run(tests: list[str], threads: int, permute: int, log: Path) -> int:
    env = dict(os.environ, SPKFLOW_SPREAD_LOG=str(log), SPKFLOW_TEST_THREADS=str(threads))
    env.update(OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT), LC_ALL="C")
    env["PATH"] = f"{ROOT / 'utils'}:{env['PATH']}"
    env.pop("SPKFLOW_TEST_PERMUTE", None)
    if permute:
        env["SPKFLOW_TEST_PERMUTE"] = str(permute)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("tests", nargs="*", help="pytest ids (default: the files calling within)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--permute", type=int, nargs="+", default=[0, 7], help="0: batch order as written; N: seed")
    p.add_argument("--log", default=None, help="keep the JSON lines here (default: a temporary file)")
    args = p.parse_args()
    tests = args.tests or default_tests()
    log = Path(args.log or tempfile.mkstemp(suffix=".jsonl")[1])
    failed = []
    for threads in args.threads:
        for permute in args.permute:
            if run(tests, threads, permute, log):
                failed.append(f"threads {threads} permute {permute}")
    worst: dict[str, dict] = {}
    for line in log.read_text().splitlines():
        r = json.loads(line)
        key = f"{r.get('test', '').split('::', 1)[-1]}: {r['check']}"
        w = worst.setdefault(key, {"spread": 0.0, "bound": r["bound"], "n": 0, "at": ""})
        w["n"] += 1
        if r["spread"] >= w["spread"]:
            w.update(spread=r["spread"], at=f"threads {r['threads']} permute {r['permute'] or 0}")
    print(f"{'test: check':<100} {'worst':>9} {'bound':>9} {'margin':>8}  runs  worst at")
    for check, w in sorted(worst.items()):
        margin = w["bound"] / w["spread"] if w["spread"] > 0 else float("inf")
        flag = " <10x" if margin < 10 else ""
        print(f"{check:<100} {w['spread']:9.2e} {w['bound']:9.1e} {margin:8.1f}{flag:5} {w['n']:4}  {w['at']}")
    print(f"log: {log}" + (f"; failing runs: {', '.join(failed)}" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
