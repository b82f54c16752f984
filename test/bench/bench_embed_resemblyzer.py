"""Benchmark: Resemblyzer's encoder through stage 5 (``--toolkit resemblyzer``) against Resemblyzer's own
loop, in the same run.

    .venv/bin/python test/bench/bench_embed_resemblyzer.py [--limit 200] [--nj 2] [--batch-size 32]
        [--peer-threads 1 2] [--workdir /tmp/bench_embed_resemblyzer]

Data: the first --limit utterances (LC_ALL=C order) of speechocean762's test set (real read speech,
16 kHz FLAC, 2-8 s) from the recipe's db.sh, as a data dir under --workdir (the corpus is only
referenced).  The peers, each from reading the files to the embeddings:

* Resemblyzer's own loop, as its README shows it: one process, for each utterance
  ``embed_utterance(preprocess_wav(wav))`` (soundfile reads the file), with 1 torch thread and with
  every core's (what a user running it alone on this machine gets);
* ours in one process, 1 torch thread: :class:`spkflow.embed.resemblyzer.ResemblyzerEmbedder`'s
  frontend per utterance, the partials of a batch in one forward (batches planned as stage 5 plans
  them: --batch-size, 3000 frames);
* ours end to end: ``scripts/spk/extract_embeddings.sh --toolkit resemblyzer --nj N --num-threads 1``
  (process starts, imports, the model loaded per job, DataLoader workers, the merge).

Prints utterances/s, each against Resemblyzer's 1-thread loop, the max |difference| of the
embeddings from Resemblyzer's (they must agree within 1e-5), the CPU and the load average (the
machine may be shared: read the ratios).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))  # the test helpers
from helpers.paths import db_var  # noqa: E402


def make_data(corpus: Path, out: Path, limit: int) -> list[tuple[str, Path]]:
    """The first ``limit`` test utterances as a sorted data dir (ids prefixed by the speaker)."""
    if not corpus.is_dir():
        sys.exit(f"speechocean762 not found at {corpus} (set SPEECHOCEAN762)")
    paths = dict(ln.split(maxsplit=1) for ln in (corpus / "test" / "wav.scp").read_text().splitlines() if ln.strip())
    u2s = dict(ln.split() for ln in (corpus / "test" / "utt2spk").read_text().splitlines() if ln.strip())
    keys = sorted((f"{u2s[u]}-{u}" for u in u2s), key=str.encode)[:limit]
    items = [(k, corpus / paths[k.split("-", 1)[1]].strip()) for k in keys]
    out.mkdir(parents=True, exist_ok=True)
    (out / "wav.scp").write_text("".join(f"{k} {p}\n" for k, p in items))
    (out / "utt2spk").write_text("".join(f"{k} {k.split('-')[0]}\n" for k in keys))
    s2u: dict[str, list[str]] = {}
    for k in keys:
        s2u.setdefault(k.split("-")[0], []).append(k)
    (out / "spk2utt").write_text("".join(f"{s} {' '.join(v)}\n" for s, v in sorted(s2u.items())))
    return items


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--nj", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--peer-threads", type=int, nargs="+", default=[1, os.cpu_count() or 1], help="torch threads")
    p.add_argument("--workdir", default="/tmp/bench_embed_resemblyzer")
    args = p.parse_args()
    import numpy as np
    import resemblyzer
    import soundfile as sf
    import torch
    from resemblyzer import VoiceEncoder, preprocess_wav

    from spkflow.embed.base import plan_batches, split_by_frames
    from spkflow.embed.resemblyzer import ResemblyzerEmbedder

    corpus = Path(os.environ.get("SPEECHOCEAN762") or db_var("SPEECHOCEAN762"))
    work = Path(args.workdir)
    items = make_data(corpus, work / "data", args.limit)
    seconds = sum(sf.info(str(f)).duration for _, f in items)
    pkg = Path(resemblyzer.__file__).parent
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(
        f"{len(items)} utterances, {seconds:.0f} s of speech; {os.cpu_count()} x {cpu}; load {os.getloadavg()[0]:.1f}"
    )

    rows: list[tuple[str, float]] = []
    ref: dict[str, np.ndarray] = {}
    encoder = VoiceEncoder("cpu", verbose=False)
    for threads in args.peer_threads:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        for utt, f in items:
            ref[utt] = encoder.embed_utterance(preprocess_wav(sf.read(f, dtype="float32")[0]))
        rows.append((f"Resemblyzer's loop, {threads} thread(s)", time.perf_counter() - t0))

    torch.set_num_threads(1)
    emb = ResemblyzerEmbedder(pkg)
    t0 = time.perf_counter()
    waves = {u: sf.read(f, dtype="float32")[0] for u, f in items}
    xs = {u: emb.prepare_wave(w) for u, w in waves.items()}
    got: dict[str, np.ndarray] = {}
    for batch in plan_batches(list(xs), {u: len(w) / 16000 for u, w in waves.items()}, args.batch_size, 3000):
        for part in split_by_frames(batch, lambda u: emb.frames(xs[u]), 3000):
            for u, v in zip(part, emb.embed([xs[u] for u in part]), strict=True):
                got[u] = v
    rows.append(("ours, one process, 1 thread (batched)", time.perf_counter() - t0))
    diff_in = max(float(np.abs(got[u] - ref[u]).max()) for u in ref)

    out = work / "out"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    script = str(ROOT / "scripts/spk/extract_embeddings.sh")
    opts = [
        "--toolkit",
        "resemblyzer",
        "--nj",
        str(args.nj),
        "--num-threads",
        "1",
        "--batch-size",
        str(args.batch_size),
    ]
    cmd = ["bash", script, *opts, "--model-dir", str(pkg), str(work / "data"), str(out)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, LC_ALL="C"))
    rows.append((f"ours, extract_embeddings.sh --nj {args.nj}, end to end", time.perf_counter() - t0))
    import kaldiio

    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    diff_script = max(float(np.abs(xv[u] - ref[u]).max()) for u in ref)

    base = dict(rows).get("Resemblyzer's loop, 1 thread(s)", rows[0][1])
    print(f"{'system':<50} {'wall s':>8} {'utt/s':>7} {'vs loop':>8}")
    for name, wall in rows:
        print(f"{name:<50} {wall:8.1f} {len(items) / wall:7.1f} {base / wall:7.2f}x")
    print(
        f"max |ours - Resemblyzer|: one process {diff_in:.1e}, script {diff_script:.1e}; load {os.getloadavg()[0]:.1f}"
    )
    return 0 if max(diff_in, diff_script) <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
