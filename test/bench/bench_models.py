"""Cost of padding invariance: spkflow's masked ECAPA-TDNN vs espnet2's own forward.

    .venv/bin/python test/bench/bench_models.py [--channels 128] [--threads 2] [--repeat 5]

Prints, for a training step (forward + backward on a 128 x 200 x 80 batch of equal-length crops)
and for inference on a padded batch of 32 utterances of 100-800 frames, the median time of
espnet2's unmasked ``encoder -> pooling -> projector`` and of :class:`spkflow.nnet.models.EcapaTdnn`
(same modules and weights, with frame masks), and their ratio; and the speed of the
feature-domain speed perturbation against the step it augments.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def median_time(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--channels", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from spkflow.augment.fbank import FbankSpeedPerturb
    from spkflow.nnet.models import build_model

    torch.manual_seed(0)
    m = build_model({"name": "ecapa_tdnn", "input_dim": 80, "channels": args.channels, "embed_dim": 192})
    x = torch.randn(128, 200, 80)
    full = torch.full((128,), 200)

    def espnet_step() -> None:
        m.zero_grad()
        m.projector(m.pooling(m.encoder(x))).sum().backward()

    def ours_step() -> None:
        m.zero_grad()
        m(x, full).sum().backward()

    m.train()
    a, b = median_time(espnet_step, args.repeat), median_time(ours_step, args.repeat)
    print(
        f"train step 128x200x80, C={args.channels}, {args.threads} threads: espnet2 {a:.3f} s, "
        f"spkflow masked {b:.3f} s, ratio {b / a:.2f}"
    )

    lengths = torch.randint(100, 801, (32,))
    xb = torch.randn(32, int(lengths.max()), 80)
    m.eval()
    with torch.no_grad():
        a = median_time(lambda: m.projector(m.pooling(m.encoder(xb))), args.repeat)
        b = median_time(lambda: m(xb, lengths), args.repeat)
    print(
        f"inference, 32 padded utterances of 100-800 frames: espnet2 (unmasked, wrong for padded rows) "
        f"{a:.3f} s, spkflow masked {b:.3f} s, ratio {b / a:.2f}"
    )

    sp = FbankSpeedPerturb([0.9, 1.0, 1.1], {"num_mel_bins": 80})
    xr = torch.randn(128, 220, 80)
    c = median_time(lambda: sp(xr, num_utt=4), args.repeat)
    m.train()
    s = median_time(ours_step, args.repeat)
    print(f"speed perturbation of a 128x220x80 batch: {c * 1000:.1f} ms = {100 * c / s:.1f}% of a training step")


if __name__ == "__main__":
    main()
