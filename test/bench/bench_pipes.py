"""Benchmark: what a wav.scp ``cmd |`` entry costs per command, guarded so that it ends with its
reader (:mod:`spkflow.data.pipes`), against the plain ``sh -c`` that Kaldi's ``popen`` and
Python's ``subprocess.run(..., shell=True)`` start.

    .venv/bin/python test/bench/bench_pipes.py [--commands 100] [--rounds 3] [--hold-gb 0,2] [--json OUT]

The command: ``cat`` of a 6 s 16 kHz WAV written here (192 KB), so the figure is the start-up of
the command's processes, not its work.  Rows, interleaved ``--rounds`` times, each the mean over
``--commands`` commands: ``plain`` (the peer), ``setpriv`` (:func:`~spkflow.data.pipes.run_pipe`
armed by util-linux's ``setpriv --pdeathsig``, its choice where that is there) and ``prctl`` (the
same with ``setpriv`` hidden: the death signal set between fork and exec, which makes Python fork
instead of vfork).  ``--hold-gb``: the reader holds that much memory (touched), as a DataLoader
worker does: fork's cost grows with it, vfork's does not.  Printed: ms per command of each row
and its ratio to the peer's, per held size; ``--json`` writes the same.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spkflow.data import pipes  # noqa: E402


def plain(command: str, utt: str) -> bytes:
    """The peer: ``sh -c`` as Kaldi and Python start it, with nothing to end it with its reader."""
    return subprocess.run(command, shell=True, capture_output=True, stdin=subprocess.DEVNULL, check=True).stdout


def guarded(setpriv: bool) -> Callable[[str, str], bytes]:
    """:func:`spkflow.data.pipes.run_pipe`, its guard armed through ``setpriv`` or (hidden) ``prctl``."""
    which, probe = shutil.which, pipes._guard_start
    probe.cache_clear()
    if not setpriv:
        shutil.which = lambda *a, **k: None  # type: ignore[assignment]
    try:
        prefix, preexec = pipes._guard_start()
    finally:
        shutil.which = which
        probe.cache_clear()
    if setpriv and not prefix:
        raise SystemExit("no setpriv with --pdeathsig here (util-linux >= 2.33)")

    def run(command: str, utt: str) -> bytes:
        pipes._guard_start = lambda: (prefix, preexec)  # type: ignore[assignment]  # this row's way
        try:
            return pipes.run_pipe(command, utt)
        finally:
            pipes._guard_start = probe

    return run


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commands", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hold-gb", default="0,2", help="memory the reader holds, GB, comma-separated")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    rows = {"plain": plain, "setpriv": guarded(True), "prctl": guarded(False)}
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "six_seconds.wav"
        sf.write(wav, np.zeros(96000, np.float32), 16000, subtype="PCM_16")
        command = f"cat {wav}"
        assert pipes.run_pipe(command, "u") == plain(command, "u") == wav.read_bytes()
        for gb in (float(x) for x in a.hold_gb.split(",")):
            held = np.ones(int(gb * 2**27)) if gb else None  # float64: 2**27 of them a GB, touched
            ms: dict[str, list[float]] = {k: [] for k in rows}
            for _ in range(a.rounds):
                for name, run in rows.items():
                    t = time.perf_counter()
                    for _ in range(a.commands):
                        run(command, "u")
                    ms[name].append(1000 * (time.perf_counter() - t) / a.commands)
            peer = statistics.median(ms["plain"])
            key = f"hold_{gb:g}_gb"
            out[key] = {f"{k}_ms": round(statistics.median(v), 2) for k, v in ms.items()}
            out[key].update({f"{k}_over_plain": round(statistics.median(v) / peer, 2) for k, v in ms.items()})
            print(
                f"reader holding {gb:g} GB: "
                + ", ".join(
                    f"{k} {statistics.median(v):.2f} ms ({statistics.median(v) / peer:.2f}x)" for k, v in ms.items()
                )
                + f" per command (median of {a.rounds} rounds of {a.commands})",
                flush=True,
            )
            del held
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
