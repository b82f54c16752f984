"""Benchmark: planning one epoch of N x M batches at VoxCeleb2-dev scale and 10x, against
pytorch-metric-learning's MPerClassSampler producing the same number of batches.

    .venv/bin/pip install pytorch-metric-learning      # only for this benchmark
    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_batches.py [--scales 1,10] [--repeat 3]

The spk2utt is generated: 5,994 speakers and 1,092,009 utterances (VoxCeleb2 dev) with
lognormal utterance counts (sigma 0.6; every speaker has at least 1), and the same
shape with 10x the speakers.  For each scale it measures, side by side in one run:

- in process, wall time (best of --repeat at 1x, one run at larger scales) and peak
  traced memory (tracemalloc, a separate run; the peer's at 1x only) of
  * ours: ``plan_epoch`` on a loaded table (the int plan), and the plan plus all batches
    as utterance-id lists;
  * ours: building the table from a ``{speaker: [utts]}`` dict (validation included)
    plus the plan, the counterpart of the peer's constructor;
  * peer: ``MPerClassSampler(labels, m=M, batch_size=N*M, length_before_new_iter=B*N*M)``
    constructed and iterated once (B = our number of batches), its indices turned into
    ids;
- as a whole command, wall time and max RSS (wait4) of ``python -m
  spkflow.bin.make_batches`` against a script that reads the same spk2utt, runs the peer
  and writes the same batch-list format;
- coverage: distinct utterances used / all utterances, and repeated uses.

Without pytorch-metric-learning the peer's rows are skipped with a message.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spkflow.train.batches import plan_epoch  # noqa: E402
from spkflow.train.spk2utt import Spk2Utt, load_spk2utt  # noqa: E402

VOX2_SPEAKERS = 5994
VOX2_UTTS = 1_092_009

PEER_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from pytorch_metric_learning.samplers import MPerClassSampler
    from pytorch_metric_learning.utils import common_functions as c_f
    spk2utt, N, M, B, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    c_f.NUMPY_RANDOM = np.random.RandomState(0)
    utts, labels = [], []
    with open(spk2utt) as f:
        for i, line in enumerate(f):
            t = line.split()
            utts.extend(t[1:]); labels.extend([i] * (len(t) - 1))
    s = MPerClassSampler(np.array(labels), m=M, batch_size=N * M, length_before_new_iter=B * N * M)
    idx = np.fromiter(iter(s), dtype=np.int64, count=len(s)).reshape(B, N * M)
    ids = np.array(utts, dtype=object)
    with open(out, "w") as f:
        for row in ids[idx].tolist():
            f.write(" ".join(row) + "\\n")
""")


def generate(path: Path, num_speakers: int, num_utts: int, sigma: float = 0.6, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, sigma, num_speakers)
    counts = np.maximum(1, np.floor(w * num_utts / w.sum()).astype(np.int64))
    counts[np.argsort(-w)[: num_utts - counts.sum()]] += 1  # hit the total exactly
    with open(path, "w") as f:
        for i, n in enumerate(counts):
            spk = f"id{i:06d}"
            f.write(spk + " " + " ".join(f"{spk}-{j // 7:05d}-{j % 7:05d}" for j in range(n)) + "\n")
    return counts


def packing_bound(counts: np.ndarray, N: int, M: int) -> int:
    """Batches per epoch: the largest B with sum_s min(floor(n_s / M), B) >= N * B."""
    groups = counts // M
    lo, hi = 0, int(groups.sum()) // N
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if np.minimum(groups, mid).sum() >= N * mid else (lo, mid - 1)
    return lo


def best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
        del out
    return best


def traced_peak(fn) -> float:
    gc.collect()
    tracemalloc.start()
    out = fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del out
    return peak / 2**20


# A child's max RSS on Linux starts from the memory of whatever it was forked (or vforked)
# from, so each command is started by a small fresh launcher that forks it and reports
# its wall time and max RSS.
LAUNCHER = textwrap.dedent("""
    import os, sys, time
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.execvp(sys.argv[2], sys.argv[2:])
    _, status, usage = os.wait4(pid, 0)
    with open(sys.argv[1], "w") as f:
        f.write(f"{time.perf_counter() - t} {usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
""")


def run_child(cmd: list[str], workdir: Path) -> tuple[float, float, int, str]:
    """Wall time, max RSS (MiB) and exit status of one command, and its stderr."""
    result = workdir / "child.rusage"
    p = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(result), *cmd],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    wall, rss_kib, rc = result.read_text().split()
    return float(wall), int(rss_kib) / 1024, int(rc), p.stderr


def utterance_use(path: Path, total: int) -> tuple[int, int]:
    """(distinct utterances used, repeated uses) in a batch-list file."""
    seen: set[str] = set()
    uses = 0
    with open(path) as f:
        for line in f:
            t = line.split()
            uses += len(t)
            seen.update(t)
    return len(seen), uses - len(seen)


def bench_scale(scale: int, N: int, M: int, repeat: int, workdir: Path, peer: bool, peer_command: bool) -> list[tuple]:
    S, U = VOX2_SPEAKERS * scale, VOX2_UTTS * scale
    spk2utt = workdir / f"spk2utt.x{scale}"
    B = packing_bound(generate(spk2utt, S, U), N, M)
    name = f"x{scale} ({S:,} spk, {U:,} utts, {B:,} batches)"
    # whole commands
    out = workdir / f"ours.x{scale}.txt"
    ct, rss, rc, err = run_child(
        [
            sys.executable,
            "-m",
            "spkflow.bin.make_batches",
            "--spk2utt",
            str(spk2utt),
            "--num-spk",
            str(N),
            "--num-utt",
            str(M),
            "--seed",
            "0",
            "--epoch",
            "1",
            "--out",
            str(out),
        ],
        workdir,
    )
    assert rc == 0, err
    used, rep = utterance_use(out, U)
    cov = float(err.split("coverage ")[1].split("%")[0])
    cmd_rows = [("ours: make_batches command", ct, rss, used / U, rep)]
    if peer and peer_command:
        pout = workdir / f"peer.x{scale}.txt"
        script = workdir / "peer_cmd.py"
        script.write_text(PEER_SCRIPT)
        pt, prss, prc, perr = run_child(
            [sys.executable, str(script), str(spk2utt), str(N), str(M), str(B), str(pout)], workdir
        )
        assert prc == 0, perr
        pused, prep = utterance_use(pout, U)
        cmd_rows.append(("peer: same via MPerClassSampler", pt, prss, pused / U, prep))
        pout.unlink()
    table = load_spk2utt(spk2utt)
    assert len(plan_epoch(table, N, M, 0, 1)) == B
    mapping = {s: table.utts[table.offsets[i] : table.offsets[i + 1]] for i, s in enumerate(table.speakers)}
    labels = table.speaker_of()
    rows = []
    repeat = repeat if scale == 1 else 1

    t = best_time(lambda: plan_epoch(table, N, M, 0, 1), repeat)
    m = traced_peak(lambda: plan_epoch(table, N, M, 0, 1))
    rows.append((name, "ours: plan (int) from table", t, m))
    t2 = best_time(lambda: plan_epoch(table, N, M, 0, 1).batches, repeat)
    m2 = traced_peak(lambda: plan_epoch(table, N, M, 0, 1).batches)
    rows.append((name, "ours: plan + utterance-id lists", t2, m2))
    t3 = best_time(lambda: plan_epoch(Spk2Utt.from_mapping(mapping), N, M, 0, 1), repeat)
    m3 = traced_peak(lambda: plan_epoch(Spk2Utt.from_mapping(mapping), N, M, 0, 1))
    rows.append((name, "ours: dict -> table + plan", t3, m3))
    if peer:
        from pytorch_metric_learning.samplers import MPerClassSampler
        from pytorch_metric_learning.utils import common_functions as c_f

        ids = table.utt_array()

        def run_peer():
            c_f.NUMPY_RANDOM = np.random.RandomState(0)
            s = MPerClassSampler(labels, m=M, batch_size=N * M, length_before_new_iter=B * N * M)
            idx = np.fromiter(iter(s), dtype=np.int64, count=len(s)).reshape(B, N * M)
            return ids[idx].tolist()

        peer_t = best_time(run_peer, repeat if scale == 1 else 1)
        # tracing 10M+ small allocations takes minutes: the peer's memory is traced at 1x only
        pm = traced_peak(run_peer) if scale == 1 else float("nan")
        rows.append((name, "peer: MPerClassSampler init + epoch, ids", peer_t, pm))

    out.unlink()
    rows += [(name, *r) for r in cmd_rows]
    rows.append((name, f"ours: coverage of full groups {cov:.2f}%", None, None))
    spk2utt.unlink()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="1,10", help="comma-separated multiples of VoxCeleb2-dev size")
    ap.add_argument("--num-spk", type=int, default=64)
    ap.add_argument("--num-utt", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--peer-command-max-scale",
        type=int,
        default=1,
        help="run the peer as a whole command only up to this scale (it needs ~0.75 GB per 1x)",
    )
    args = ap.parse_args()
    try:
        import pytorch_metric_learning  # noqa: F401

        peer = True
    except ImportError:
        print(
            "pytorch-metric-learning is not installed: skipping the peer "
            "(.venv/bin/pip install pytorch-metric-learning)",
            file=sys.stderr,
        )
        peer = False
    print(
        f"N x M = {args.num_spk} x {args.num_utt}; python {sys.version.split()[0]}, numpy {np.__version__}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (int(s) for s in args.scales.split(",")):
            rows = bench_scale(
                scale, args.num_spk, args.num_utt, args.repeat, Path(tmp), peer, scale <= args.peer_command_max_scale
            )
            print(f"\n{rows[0][0]}")
            print(f"  {'what':<44} {'wall s':>8} {'peak MiB':>9} {'utts used':>10} {'repeats':>9}")
            for r in rows:
                if r[2] is None:
                    print(f"  {r[1]}")
                    continue
                extra = f" {100 * r[4]:>9.2f}% {r[5]:>9,}" if len(r) > 4 else ""
                mem = "traced" if len(r) == 4 else "max RSS"
                print(f"  {r[1]:<44} {r[2]:>8.3f} {r[3]:>9.1f}{extra}   ({mem})")
            ours = {r[1]: r for r in rows}
            if peer:
                a, b = ours["ours: plan + utterance-id lists"], ours["peer: MPerClassSampler init + epoch, ids"]
                line = f"  ratios peer / ours: in process {b[2] / a[2]:.1f}x time, {b[3] / a[3]:.1f}x traced memory"
                if "peer: same via MPerClassSampler" in ours:
                    c, d = ours["ours: make_batches command"], ours["peer: same via MPerClassSampler"]
                    line += (
                        f"; command {d[2] / c[2]:.1f}x time, {d[3] / c[3]:.1f}x max RSS; "
                        f"utterances used {100 * c[4]:.2f}% vs {100 * d[4]:.2f}%"
                    )
                print(line)


if __name__ == "__main__":
    main()
