"""Benchmark: sequential embedding extraction (ESPnet's original way) vs ours, same model, same audio.

    .venv/bin/python test/bench/bench_embed.py [--arch ecapa|dvector|both] [--limit N] [--nj 2]
        [--batch-size 32] [--num-workers 1] [--model-dir DIR] [--workdir /tmp/bench_embed]

Data: speechocean762 train + test (2,000 real utterances, 2-20 s, FLAC, 16 kHz) from the
corpus path in the recipe's db.sh, as a data dir written under --workdir (the corpus is only
referenced).  Model: --model-dir (a stage-4 model dir), else a spkflow model dir with *random
weights* of the chosen architecture (``ecapa``: ECAPA-TDNN 512 channels, 80 log-mel, 6.2 M
parameters; ``dvector``: the GE2E paper's 3 x 768 LSTM d-vector), 80-bin Kaldi fbank + energy
VAD as in egs/speechocean762/spk1/conf.

Peers, each timed as one command from start to end (imports, model loading, all I/O):
* sequential: one process, batch 1, one utterance at a time in spk2utt order, writing ark/scp as
  it goes (what ESPnet's extract_xvectors.py / extract_spk_embed.py did before its thread pool):
  ``python test/bench/bench_embed.py --sequential ...``, once with torch's default threads (what
  ESPnet's script gets: one per core) and once with one thread (``--seq-threads 0,1``; 0 = default).
  On a busy machine the default threads oversubscribe the cores and the first peer slows down
  much more than the second: both are reported.
* ours: ``scripts/spk/extract_embeddings.sh --nj N --batch-size B`` (run.pl, 1 torch thread and
  --num-workers DataLoader workers per job, merge included).
Prints utterances/s of both, the ratio, the max |difference| of L2-normalised embeddings (the
two must agree), CPU count and load average before/after (other processes share the CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))  # the test helpers
from helpers.paths import db_var  # noqa: E402

ARCHS = {
    "ecapa": {"name": "ecapa_tdnn", "input_dim": 80, "channels": 512, "scale": 8, "embed_dim": 192},
    "dvector": {"name": "dvector_lstm", "input_dim": 80, "hidden": 768, "embed_dim": 256, "layers": 3},
}


def build_data_dir(out: Path, limit: int | None) -> Path:
    """speechocean762 train+test as one sorted data dir (speaker-prefixed ids, absolute paths)."""
    corpus = Path(db_var("SPEECHOCEAN762"))
    if not corpus.is_dir():
        sys.exit(f"speechocean762 not found at {corpus} (set SPEECHOCEAN762)")
    wav, u2s = {}, {}
    for part in ("train", "test"):
        paths = dict(ln.split(maxsplit=1) for ln in (corpus / part / "wav.scp").read_text().splitlines() if ln.strip())
        for ln in (corpus / part / "utt2spk").read_text().splitlines():
            if not ln.strip():
                continue
            utt, spk = ln.split()
            key = f"{spk}-{utt}"
            wav[key] = str(corpus / paths[utt].strip())
            u2s[key] = spk
    keys = sorted(wav, key=lambda k: k.encode())
    if limit:
        keys = keys[:limit]
    out.mkdir(parents=True, exist_ok=True)
    (out / "wav.scp").write_text("".join(f"{k} {wav[k]}\n" for k in keys))
    (out / "utt2spk").write_text("".join(f"{k} {u2s[k]}\n" for k in keys))
    s2u: dict[str, list[str]] = {}
    for k in keys:
        s2u.setdefault(u2s[k], []).append(k)
    (out / "spk2utt").write_text("".join(f"{s} {' '.join(v)}\n" for s, v in sorted(s2u.items())))
    return out


def build_model_dir(out: Path, arch: str) -> Path:
    import torch
    import yaml

    from spkflow.core.errors import InputError
    from spkflow.features.fbank import FbankOptions
    from spkflow.features.vad import VadOptions
    from spkflow.nnet.models import build_model

    conf = ROOT / "egs" / "speechocean762" / "spk1" / "conf"
    try:
        fbank = FbankOptions.from_kaldi_conf(conf / "fbank.conf")
        vad = VadOptions.from_kaldi_conf(conf / "vad.conf")
    except (InputError, OSError) as err:
        print(f"# recipe conf not usable ({err}); using the default fbank/VAD options")
        fbank, vad = FbankOptions(), VadOptions()
    cfg = {
        "frontend": {"vad": True, "mean_norm": False, "fbank": fbank.to_dict(), "vad_conf": dataclasses.asdict(vad)},
        "model": dict(ARCHS[arch]),
    }
    torch.manual_seed(0)
    model = build_model(cfg["model"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), out / "model.pth")
    return out


def sequential(model_dir: Path, data: Path, out: Path, threads: int) -> None:
    """Batch 1, one utterance at a time, speaker by speaker, one process."""
    import kaldiio
    import numpy as np
    import torch

    if threads > 0:
        torch.set_num_threads(threads)

    from spkflow.data.tables import read_spk2utt
    from spkflow.embed.native import SpkflowEmbedder

    emb = SpkflowEmbedder(model_dir)
    prep = emb.preparer(data)
    out.mkdir(parents=True, exist_ok=True)
    with (
        kaldiio.WriteHelper(f"ark,scp:{out}/xvector.ark,{out}/xvector.scp") as w_utt,
        kaldiio.WriteHelper(f"ark,scp:{out}/spk_xvector.ark,{out}/spk_xvector.scp") as w_spk,
    ):
        for spk, utts in read_spk2utt(data / "spk2utt").items():
            vs = []
            for u in utts:
                v = emb.embed([prep(u)])[0]
                w_utt[u] = v
                vs.append(v)
            w_spk[spk] = np.mean(vs, axis=0)


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and all its descendants)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def compare(a: Path, b: Path) -> tuple[int, float]:
    import kaldiio
    import numpy as np

    x, y = kaldiio.load_scp(str(a)), kaldiio.load_scp(str(b))
    assert set(x) == set(y), "different keys"
    n = lambda v: v / np.linalg.norm(v)  # noqa: E731
    return len(x), max(float(np.abs(n(x[k]) - n(y[k])).max()) for k in x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=("ecapa", "dvector", "both"), default="ecapa")
    p.add_argument("--model-dir", type=Path, default=None, help="a trained model dir instead of random weights")
    p.add_argument("--limit", type=int, default=None, help="first N utterances only (quick look)")
    p.add_argument("--nj", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-frames", type=int, default=3000, help="the script's CPU default")
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--seq-threads", default="0,1", help="torch threads of the sequential peers (0: default)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench_embed"))
    p.add_argument("--sequential", nargs=4, metavar=("MODEL_DIR", "DATA", "OUT", "THREADS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.sequential:
        sequential(Path(a.sequential[0]), Path(a.sequential[1]), Path(a.sequential[2]), int(a.sequential[3]))
        return
    import torch

    env = dict(os.environ, PYTHONPATH=str(ROOT), LC_ALL="C")
    env.pop("OMP_NUM_THREADS", None)  # the sequential peer gets torch's default threads
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    data = build_data_dir(a.workdir / "data", a.limit)
    n = len((data / "utt2spk").read_text().splitlines())
    archs = [a.arch] if a.arch != "both" else ["ecapa", "dvector"]
    print(
        f"# {n} utterances of speechocean762 train+test; {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"default torch threads {torch.get_num_threads()}, CUDA available: {torch.cuda.is_available()}"
    )
    for arch in archs:
        model_dir = a.model_dir or build_model_dir(a.workdir / f"model_{arch}", arch)
        what = f"{model_dir}" if a.model_dir else f"{arch} (random weights)"
        our_out = a.workdir / f"ours_{arch}"
        subprocess.run(["rm", "-rf", str(our_out)], check=True)
        load0 = os.getloadavg()
        t_our, c_our = timed(
            [
                "bash",
                str(ROOT / "scripts/spk/extract_embeddings.sh"),
                "--nj",
                str(a.nj),
                "--batch-size",
                str(a.batch_size),
                "--max-frames",
                str(a.max_frames),
                "--num-workers",
                str(a.num_workers),
                "--num-threads",
                "1",
                "--model-dir",
                str(model_dir),
                str(data),
                str(our_out),
            ],
            env,
        )
        load1 = os.getloadavg()
        print(f"model {what}, {n} utterances")
        print(
            f"  ours (nj={a.nj}, batch {a.batch_size}, max {a.max_frames} frames, {a.num_workers} worker/job, "
            f"1 thread/job): {t_our:8.1f} s {n / t_our:7.2f} utt/s, CPU {c_our:7.1f} s "
            f"(load avg {load0[0]:.1f} -> {load1[0]:.1f})",
            flush=True,
        )
        for threads in (int(x) for x in a.seq_threads.split(",") if x):
            seq_out = a.workdir / f"seq_{arch}_{threads}"
            subprocess.run(["rm", "-rf", str(seq_out)], check=True)
            senv = dict(env)
            if threads > 0:
                senv["OMP_NUM_THREADS"] = str(threads)
            load0 = os.getloadavg()
            t_seq, c_seq = timed(
                [sys.executable, __file__, "--sequential", str(model_dir), str(data), str(seq_out), str(threads)], senv
            )
            load1 = os.getloadavg()
            count, diff = compare(seq_out / "xvector.scp", our_out / "xvector.scp")
            label = f"{threads} thread" if threads else f"default {torch.get_num_threads()} threads"
            print(
                f"  sequential (1 process, batch 1, {label}): {t_seq:8.1f} s {n / t_seq:7.2f} utt/s, "
                f"CPU {c_seq:7.1f} s (load avg {load0[0]:.1f} -> {load1[0]:.1f}); ours is {t_seq / t_our:.2f}x "
                f"faster (CPU seconds ratio {c_seq / c_our:.2f}); "
                f"max |diff| of L2-normalised embeddings {diff:.2e} over {count}",
                flush=True,
            )


if __name__ == "__main__":
    main()
