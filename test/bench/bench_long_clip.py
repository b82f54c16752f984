"""Benchmark: peak memory of embedding one long recording (``Embedder.embed_file``, what ``verify``
and ``identify`` do per file), with the fbank and the ECAPA pooling computed in blocks
(:data:`spkflow.features.fbank.CHUNK_FRAMES`, :data:`spkflow.nnet.models.POOL_BLOCK`) against
the same code in one piece (both constants set past the clip's length: the previous behaviour),
measured in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_long_clip.py [--minutes 10] [--model DIR|PACK]

Model: ``--model`` (a model dir or pack), else an ECAPA-TDNN of the demo's shape (channels 128,
scale 8, 80 mel bins, 192-dim; 0.76 M parameters) with random weights: memory depends on the
shapes, not the weights.  Audio: a synthetic voice (test/helpers) of ``--minutes``.  Each row is
a fresh process (its peak resident set size, ``VmHWM``; Linux's ``ru_maxrss`` would include this
parent's size at the fork); "floor" is the same process on a
2-second clip (Python, torch, the model), "clip" the peak above it.  The embeddings of the two
ways are compared (max |diff| after L2 normalisation).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))  # the test helpers

# the peak of the process's own memory: VmHWM (ru_maxrss would count the parent's size at the fork)
CHILD = """
import json, re, sys
import spkflow.features.fbank as fbank, spkflow.nnet.models as models
from spkflow import Embedder
if sys.argv[3] == "one piece":
    fbank.CHUNK_FRAMES = models.POOL_BLOCK = 10**12
v = Embedder.from_pretrained(sys.argv[1]).embed_file(sys.argv[2])
hwm = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
print(json.dumps({"rss_mb": hwm / 1024, "emb": v.tolist()}))
"""


def demo_shaped_model(out: Path) -> Path:
    """A model dir of the demo's ECAPA shape with random weights."""
    from helpers.models import make_spkflow_model_dir

    make_spkflow_model_dir(out, channels=128, num_mel_bins=80, embed_dim=192)
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["model"]["scale"] == 8
    return out


def child(model: Path, wav: Path, how: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(wav), how], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--model", default=None, help="a model dir or pack (default: the demo's shape, random weights)")
    args = ap.parse_args()
    from helpers.audio import synth_voice

    print(f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = Path(args.model) if args.model else demo_shaped_model(work / "model")
        rng = np.random.default_rng(0)
        pieces = [synth_voice(rng, 110 + 3 * i, (500.0, 1500.0, 2500.0), 10.0) for i in range(int(args.minutes * 6))]
        sf.write(work / "long.wav", np.concatenate(pieces), 16000, subtype="PCM_16")
        sf.write(work / "short.wav", pieces[0][:32000], 16000, subtype="PCM_16")
        floor = child(model, work / "short.wav", "blocks")["rss_mb"]
        rows = {how: child(model, work / "long.wav", how) for how in ("one piece", "blocks")}
    print(f"{args.minutes:g}-minute clip, Embedder.embed_file, peak resident set size (floor: 2 s clip {floor:.0f} MB)")
    for how, r in rows.items():
        print(f"  {how:10s} {r['rss_mb']:7.0f} MB   clip {r['rss_mb'] - floor:6.0f} MB")
    a, b = (np.array(rows[h]["emb"]) for h in ("one piece", "blocks"))
    ratio = (rows["blocks"]["rss_mb"] - floor) / (rows["one piece"]["rss_mb"] - floor)
    diff = float(np.abs(a / np.linalg.norm(a) - b / np.linalg.norm(b)).max())
    print(f"  blocks / one piece (clip): {ratio:.2f}; embeddings max |diff| after L2 normalisation {diff:.2g}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
