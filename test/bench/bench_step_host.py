"""Benchmark: what the trainer's step costs its main thread around the model, against what it did before.

    .venv/bin/python test/bench/bench_step_host.py [--device cpu|cuda] [--channels 512] [--calls 500]
        [--rounds 3] [--json OUT]

The objective: the VoxCeleb recipe's ECAPA (``--channels``) and its AAM loss, as stage 4 builds them.
Rows, interleaved ``--rounds`` times, each the mean over ``--calls`` calls, microseconds of this
thread's wall clock (on CUDA the device is synchronised at the end of each row's calls):

* ``buffers``: :meth:`spkflow.train.state.BufferSnapshot.take`, the copy of the BatchNorm
  statistics (and the other state-dict buffers) before each step, against ``buffers_peer``, what
  the trainer did before: walk the state dicts and clone each buffer into a fresh tensor;
* ``seed``: :func:`spkflow.train.trainer._seed_generators`, the step's re-seeding, against
  ``seed_peer``, ``torch.manual_seed`` (every backend torch knows).

Printed: each row's median and the ratio of the peer to it; ``--json`` writes the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--channels", type=int, default=512)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)

    import torch
    import yaml

    from spkflow.nnet.losses import build_loss
    from spkflow.nnet.models import build_model
    from spkflow.train.state import BufferSnapshot
    from spkflow.train.trainer import _seed_generators

    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg = yaml.safe_load((ROOT / "egs" / "voxceleb" / "spk1" / "conf" / "train_ecapa_c512_aam.yaml").read_text())
    objective = torch.nn.Module()
    objective.model = build_model(dict(cfg["model"], input_dim=80, channels=a.channels))
    loss_cfg = {k: v for k, v in cfg["loss"].items() if k != "margin_warmup"}
    objective.loss = build_loss(loss_cfg, objective.model.embed_dim, num_classes=3 * 5994)
    objective.to(device).train()
    snapshot = BufferSnapshot(objective)

    def peer_buffers() -> None:  # the trainer's copy before BufferSnapshot
        for part in ("model", "loss"):
            module = getattr(objective, part)
            keys = module.state_dict(keep_vars=True).keys()
            {k: b.detach().clone() for k, b in module.named_buffers() if k in keys}

    rows: dict[str, Callable[[int], None]] = {
        "buffers": lambda i: snapshot.take(),
        "buffers_peer": lambda i: peer_buffers(),
        "seed": lambda i: _seed_generators(i, device),
        "seed_peer": lambda i: torch.manual_seed(i),
    }
    us: dict[str, list[float]] = {k: [] for k in rows}
    for fn in rows.values():
        fn(0)
    for _ in range(a.rounds):
        for name, fn in rows.items():
            t = time.perf_counter()
            for i in range(a.calls):
                fn(i)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            us[name].append(1e6 * (time.perf_counter() - t) / a.calls)
    out = {f"{k}_us": round(statistics.median(v), 2) for k, v in us.items()}
    for k in ("buffers", "seed"):
        out[f"{k}_peer_over_{k}"] = round(out[f"{k}_peer_us"] / out[f"{k}_us"], 2)
    count = sum(len(v) for v in snapshot.saved().values())
    print(
        f"{a.device}, ECAPA-{a.channels} + AAM ({count} buffers), median of {a.rounds} rounds of {a.calls} calls: "
        + ", ".join(f"{k} {out[f'{k}_us']:.1f} us" for k in rows)
        + f"; the peers take {out['buffers_peer_over_buffers']:.1f}x and {out['seed_peer_over_seed']:.1f}x",
        flush=True,
    )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
