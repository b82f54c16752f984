"""Benchmark: ESPnet speaker models batched under the padding mask vs one utterance at a time, end to end.

    .venv/bin/python test/bench/bench_espnet_batched.py [--encoder rawnet3|resnet|ecapa] [--size full|small]
        [--limit 64] [--nj 2] [--batch-size 16] [--workdir /tmp/bench_espnet_batched]

Data: the first --limit utterances (in LC_ALL=C order) of speechocean762's test set (real read
speech, 16 kHz FLAC, 2-8 s) from the recipe's db.sh, as a data dir under --workdir (the corpus is
only referenced).  Model: an ESPnet speaker model with *random weights* built by
``espnet2.tasks.spk.SpeakerTask``; ``--size full`` is the shape of ESPnet's VoxCeleb recipes
(RawNet3: asteroid sinc frontend with 256 filters, model_scale 8, ndim 1024, 1536 channels, 16 M
parameters; ResNet34 with 32 channels on 80 log-mels; ECAPA-TDNN 1024), ``--size small`` the tiny
shape of the tests (where per-call overhead dominates).

Two measurements of the same two peers:

* model only (``--mode inprocess`` or ``both``): one process, one torch thread, the model loaded
  once, ``EspnetEmbedder.embed`` on the utterances in batches planned as stage 5 plans them
  (longest first) of 1 and of B; audio read beforehand.
* end to end (``--mode script`` or ``both``), each one command from start to end (imports, model
  loading, audio reading, merge):
``scripts/spk/extract_embeddings.sh --toolkit espnet --nj N`` with ``--batch-size 1`` (one
utterance at a time: what stage 5 did for RawNet3 / ResNet / conformers before issue 33) and with
``--batch-size B`` (one padded batch under :class:`spkflow.embed.masking.PaddingMask`), both with
``--max-frames 100000`` (so batches hold B utterances) and one torch thread per job.  Prints
utterances/s of both, the speed-up, the max |difference| of the L2-normalised embeddings (they must
agree within 1e-4), CPU count and load average (the machine may be shared).
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

_BASE = dict(
    specaug=None,
    specaug_conf={},
    normalize=None,
    normalize_conf={},
    pooling_conf={},
    loss="aamsoftmax",
    loss_conf=dict(margin=0.3, scale=30),
    spk_num=1211,
    input_size=None,
    init=None,
)
_MEL = dict(
    frontend="melspec_torch",
    frontend_conf=dict(preemp=True, n_fft=512, log=True, win_length=400, hop_length=160, n_mels=80, normalize="mn"),
)
CONFIGS = {
    ("rawnet3", "full"): dict(
        _BASE,
        frontend="asteroid_frontend",
        frontend_conf=dict(sinc_stride=16, sinc_kernel_size=251, sinc_filters=256),
        encoder="rawnet3",
        encoder_conf=dict(model_scale=8, ndim=1024, output_size=1536),
        pooling="chn_attn_stat",
        projector="rawnet3",
        projector_conf=dict(output_size=192),
    ),
    ("rawnet3", "small"): dict(
        _BASE,
        frontend="asteroid_frontend",
        frontend_conf=dict(sinc_stride=16, sinc_kernel_size=251, sinc_filters=32),
        encoder="rawnet3",
        encoder_conf=dict(model_scale=4, ndim=32, output_size=48),
        pooling="chn_attn_stat",
        projector="rawnet3",
        projector_conf=dict(output_size=16),
    ),
    ("resnet", "full"): dict(
        _BASE,
        **_MEL,
        encoder="resnet",
        encoder_conf=dict(m_channels=32),
        pooling="stats",
        projector="xvector",
        projector_conf=dict(output_size=256),
    ),
    ("resnet", "small"): dict(
        _BASE,
        **_MEL,
        encoder="resnet",
        encoder_conf=dict(m_channels=4),
        pooling="stats",
        projector="xvector",
        projector_conf=dict(output_size=16),
    ),
    ("ecapa", "full"): dict(
        _BASE,
        **_MEL,
        encoder="ecapa_tdnn",
        encoder_conf=dict(model_scale=8, ndim=1024, output_size=1536),
        pooling="chn_attn_stat",
        projector="rawnet3",
        projector_conf=dict(output_size=192),
    ),
    ("ecapa", "small"): dict(
        _BASE,
        **_MEL,
        encoder="ecapa_tdnn",
        encoder_conf=dict(model_scale=4, ndim=32, output_size=48),
        pooling="chn_attn_stat",
        projector="rawnet3",
        projector_conf=dict(output_size=16),
    ),
}


def build_data_dir(out: Path, limit: int) -> Path:
    corpus = Path(db_var("SPEECHOCEAN762"))
    if not corpus.is_dir():
        sys.exit(f"speechocean762 not found at {corpus} (set SPEECHOCEAN762)")
    paths = dict(ln.split(maxsplit=1) for ln in (corpus / "test" / "wav.scp").read_text().splitlines() if ln.strip())
    u2s = dict(ln.split() for ln in (corpus / "test" / "utt2spk").read_text().splitlines() if ln.strip())
    keys = sorted((f"{u2s[u]}-{u}" for u in u2s), key=str.encode)[:limit]
    out.mkdir(parents=True, exist_ok=True)
    (out / "wav.scp").write_text("".join(f"{k} {corpus / paths[k.split('-', 1)[1]].strip()}\n" for k in keys))
    (out / "utt2spk").write_text("".join(f"{k} {k.split('-')[0]}\n" for k in keys))
    s2u: dict[str, list[str]] = {}
    for k in keys:
        s2u.setdefault(k.split("-")[0], []).append(k)
    (out / "spk2utt").write_text("".join(f"{s} {' '.join(v)}\n" for s, v in sorted(s2u.items())))
    return out


def build_model_dir(out: Path, encoder: str, size: str) -> tuple[Path, float]:
    import argparse as ap

    import torch
    import yaml
    from espnet2.tasks.spk import SpeakerTask

    cfg = CONFIGS[(encoder, size)]
    torch.manual_seed(0)
    model = SpeakerTask.build_model(ap.Namespace(**cfg))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), out / "model.pth")
    params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("loss.")) / 1e6
    return out, params


def timed(cmd: list[str]) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), LC_ALL="C")
    env["PATH"] = f"{ROOT / 'utils'}:{Path(sys.executable).parent}:{env['PATH']}"
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return time.perf_counter() - t


def inprocess(model: Path, data: Path, batch_size: int) -> None:
    """Model time only: batches of 1 and of ``batch_size`` (longest first), one thread."""
    import numpy as np
    import torch

    from spkflow.data.audio import AudioReader
    from spkflow.embed.base import plan_batches
    from spkflow.embed.espnet import EspnetEmbedder

    torch.set_num_threads(1)
    emb = EspnetEmbedder(model)
    reader = AudioReader(data, sample_rate=emb.sample_rate)
    waves = {u: reader.read(u) for u in reader.keys()}
    durs = {u: len(w) / emb.sample_rate for u, w in waves.items()}
    out = {}
    for bs in (1, batch_size):
        batches = plan_batches(list(waves), durs, bs, 10**9)
        emb.embed([waves[batches[-1][0]]])  # warm-up
        t = time.perf_counter()
        vecs = {}
        for b in batches:
            vecs.update(zip(b, emb.embed([waves[u] for u in b]), strict=True))
        out[bs] = (time.perf_counter() - t, vecs)
        print(
            f"model only, batch {bs:3d}: {out[bs][0]:7.1f} s, {sum(durs.values()) / out[bs][0]:6.1f} s of audio per s"
        )
    (t1, v1), (tb, vb) = out[1], out[batch_size]
    diff = max(float(np.abs(v1[u] / np.linalg.norm(v1[u]) - vb[u] / np.linalg.norm(vb[u])).max()) for u in v1)
    print(f"model only: speed-up of batch {batch_size} over batch 1: {t1 / tb:.2f}x; max |diff| after L2: {diff:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoder", choices=("rawnet3", "resnet", "ecapa"), default="rawnet3")
    ap.add_argument("--size", choices=("full", "small"), default="full")
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--nj", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_espnet_batched"))
    ap.add_argument("--mode", choices=("both", "inprocess", "script"), default="both")
    a = ap.parse_args()

    import kaldiio
    import numpy as np

    data = build_data_dir(a.workdir / "data", a.limit)
    model, params = build_model_dir(a.workdir / f"model_{a.encoder}_{a.size}", a.encoder, a.size)
    durs = []
    import soundfile as sf

    for line in (data / "wav.scp").read_text().splitlines():
        durs.append(sf.info(line.split(maxsplit=1)[1]).duration)
    script = str(ROOT / "scripts" / "spk" / "extract_embeddings.sh")
    base = [
        "bash",
        script,
        "--toolkit",
        "espnet",
        "--nj",
        str(a.nj),
        "--max-frames",
        "100000",
        "--model-dir",
        str(model),
    ]
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    print(f"# {os.cpu_count()} CPUs ({name}); load average before: {os.getloadavg()}")
    print(
        f"# {a.encoder} ({a.size}, {params:.1f} M parameters), {len(durs)} utterances of speechocean762 test, "
        f"{sum(durs):.0f} s of audio ({min(durs):.1f}-{max(durs):.1f} s), nj={a.nj}, 1 torch thread per job"
    )
    if a.mode in ("both", "inprocess"):
        inprocess(model, data, a.batch_size)
    if a.mode == "inprocess":
        return
    results = {}
    for bs in (1, a.batch_size):
        out = a.workdir / f"out_{a.encoder}_{a.size}_b{bs}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        secs = timed([*base, "--batch-size", str(bs), str(data), str(out)])
        results[bs] = (secs, dict(kaldiio.load_scp(str(out / "xvector.scp"))))
        print(
            f"end to end, batch {bs:3d}: {secs:7.1f} s, {len(durs) / secs:6.2f} utt/s, "
            f"{sum(durs) / secs:6.1f} s of audio per s"
        )
    (t1, v1), (tb, vb) = results[1], results[a.batch_size]

    def l2(v: np.ndarray) -> np.ndarray:
        return v / np.linalg.norm(v)

    diff = max(float(np.abs(l2(v1[u]) - l2(vb[u])).max()) for u in v1)
    print(f"end to end: speed-up of batch {a.batch_size} over batch 1: {t1 / tb:.2f}x; max |diff| after L2: {diff:.1e}")
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
