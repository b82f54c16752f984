"""Measurement: how far an ONNX export's embeddings are from PyTorch's, over thread counts.

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_export_error.py \\
        [--model-dir egs/speechocean762/spk1/exp/spk_train] [--threads 1,2] [--data DIR --limit 50]

Exports the model once (spkflow.deploy.export.export_onnx with the check switched off), then for
every pair (torch threads, onnxruntime intra-op threads) compares onnxruntime with PyTorch on
(a) the inputs ``export_onnx`` checks (random features of lengths 7-1000 frames, alone and in one
padded batch: what decides whether the file is written), and (b) with ``--data``, the frontend
output of real utterances of a Kaldi data dir (its wav.scp; the first ``--limit``), one at a
time.  Prints, per pair and input set, the largest absolute difference, the largest difference
relative to the embedding's norm (``export_onnx``'s measure, ``spkflow.deploy.export.max_diff``:
max |onnx - torch| / ||torch||, or the difference after L2 normalisation when larger) and the
range of the norms.  docs/benchmarks.md chooses the export's tolerance from it.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", default=str(ROOT / "egs" / "speechocean762" / "spk1" / "exp" / "spk_train"))
    p.add_argument("--threads", default="1,2", help="thread counts tried for torch and for onnxruntime")
    p.add_argument("--data", default=None, help="a Kaldi data dir of real speech (wav.scp)")
    p.add_argument("--limit", type=int, default=50, help="utterances of --data")
    args = p.parse_args()

    import numpy as np
    import onnxruntime as ort
    import torch

    from spkflow.api import Embedder
    from spkflow.data.audio import AudioReader
    from spkflow.deploy.export import check_inputs, export_onnx, max_diff

    emb = Embedder.from_pretrained(args.model_dir, device="cpu")
    model = emb.model.cpu().eval()
    sets = {"export check": check_inputs(model)[1]}
    if args.data:
        reader = AudioReader(args.data, sample_rate=None)
        utts = reader.keys()[: args.limit]
        feats = []
        for u in utts:
            x = emb.features(*reader.read_native(u))
            feats.append((x[None].astype(np.float32), np.array([len(x)], dtype=np.int64)))
        sets[f"real speech ({len(utts)} utts of {args.data})"] = feats

    threads = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        export_onnx(model, path, config=emb.config, tol=float("inf"))
        name = emb.config["model"]["name"]
        print(f"model {args.model_dir}: {name}, {emb.dim}-dim; {os.cpu_count()} CPUs, {cpu_model()}")
        print("| torch threads | onnxruntime threads | inputs | max abs | max abs / norm | norms |")
        print("|---|---|---|---|---|---|")
        for tt in threads:
            torch.set_num_threads(tt)
            for ot in threads:
                opts = ort.SessionOptions()
                opts.log_severity_level = 3
                opts.intra_op_num_threads = ot
                session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
                for name, batches in sets.items():
                    rel, absolute = max_diff(session, model, batches)
                    with torch.inference_mode():
                        norms = [
                            float(v)
                            for x, n in batches
                            for v in model(torch.from_numpy(x), torch.from_numpy(n)).norm(dim=-1)
                        ]
                    print(f"| {tt} | {ot} | {name} | {absolute:.2g} | {rel:.2g} | {min(norms):.1f}-{max(norms):.1f} |")


if __name__ == "__main__":
    main()
