#!/usr/bin/env python3
"""How much the recording channel says about the speaker in each data set.

    python local/channel_stats.py [--sets "train test dsp20 libri fsdd"] [--dumpdir dump]

For every utterance, the mean of its voiced log-mel frames (stage-2 features) is reduced to two
numbers: the level (the mean over all bins) and the tilt (low half of the bins minus the high
half).  Both move with the microphone, the room and the gain of a recording, and with the voice.
The script prints, per set, their standard deviation within a speaker (averaged over speakers)
and between the speakers' means.  Between >> within: every speaker was recorded in one setting,
so the channel identifies the speaker there, and a model trained on such a set can learn it as
the voice.  Between ~ within: the channel varies inside a speaker (several sessions), and a
model that relies on it fails there.  docs/augmentation.md ("Channel") has the figures.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import kaldiio
import numpy as np

from spkflow.features import select_voiced


def channel_stats(feats_dir: Path, utt2spk: Path) -> dict[str, float]:
    spk_of = dict(line.split(maxsplit=1) for line in utt2spk.read_text().splitlines() if line.strip())
    vad_scp = feats_dir / "vad.scp"
    vads = kaldiio.load_scp(str(vad_scp)) if vad_scp.is_file() else {}
    level: dict[str, list[float]] = defaultdict(list)
    tilt: dict[str, list[float]] = defaultdict(list)
    for utt, x in kaldiio.load_scp_sequential(str(feats_dir / "feats.scp")):
        m = select_voiced(np.asarray(x, dtype=np.float64), vads.get(utt)).mean(axis=0)
        half = len(m) // 2
        spk = spk_of[utt].strip()
        level[spk].append(float(m.mean()))
        tilt[spk].append(float(m[:half].mean() - m[half:].mean()))
    out = {}
    for name, per_spk in (("level", level), ("tilt", tilt)):
        out[f"{name}_within"] = float(np.mean([np.std(v) for v in per_spk.values()]))
        out[f"{name}_between"] = float(np.std([np.mean(v) for v in per_spk.values()]))
    out["speakers"] = len(level)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="train test dsp20 libri fsdd")
    p.add_argument("--dumpdir", default="dump")
    p.add_argument("--datadir", default="data")
    args = p.parse_args()
    print("| set | speakers | level sd within / between speakers | tilt sd within / between |")
    print("|---|---|---|---|")
    for name in args.sets.split():
        s = channel_stats(Path(args.dumpdir) / "fbank" / name, Path(args.datadir) / name / "utt2spk")
        print(
            f"| {name} | {s['speakers']} | {s['level_within']:.2f} / {s['level_between']:.2f} "
            f"| {s['tilt_within']:.2f} / {s['tilt_between']:.2f} |"
        )


if __name__ == "__main__":
    main()
