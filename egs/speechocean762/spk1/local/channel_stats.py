#!/usr/bin/env python3
"""How much the recording channel says about the speaker in each data set.

    python local/channel_stats.py [--sets "train test dsp20 libri fsdd"] [--dumpdir dump]
    python local/channel_stats.py --sets libri --session '^([^-]+-[^-]+)-' [--config conf/train.yaml]

For every utterance, the mean of its voiced log-mel frames (stage-2 features) is reduced to two
numbers: the level (the mean over all bins) and the tilt (low half of the bins minus the high
half).  Both move with the microphone, the room and the gain of a recording, and with the voice.
The script prints, per set, their standard deviation within a speaker (averaged over speakers)
and between the speakers' means.  Between >> within: every speaker was recorded in one setting,
so the channel identifies the speaker there, and a model trained on such a set can learn it as
the voice.  Between ~ within: the channel varies inside a speaker (several sessions), and a
model that relies on it fails there.  journal/2026-11-23-channel.md has the figures.

With ``--session`` (a regex whose first group is the recording session of an utterance id, as in
local/session_eer.py) it prints instead, for every two sessions of one speaker, how their mean
voiced log-mel spectra differ: the level (dB) and the peak-to-peak of the rest (dB), the
equaliser curve that would map one session onto the other.  ``--config`` (with or without it)
adds what a training config's channel curves make of two crops (level and equaliser terms only: no band, no roll-off).
"""

from __future__ import annotations

import argparse
import itertools
import re
from collections import defaultdict
from pathlib import Path

import kaldiio
import numpy as np

from spkflow.features.fbank import select_voiced


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


DB = 10.0 / np.log(10.0)  # natural-log power units -> dB


def session_pairs(feats_dir: Path, utt2spk: Path, session: re.Pattern[str]) -> list[tuple[str, str, float, float]]:
    """(session a, session b, level difference dB, peak-to-peak of the rest dB) for every two
    sessions of one speaker, from the mean of each session's voiced log-mel frames."""
    spk_of = dict(line.split(maxsplit=1) for line in utt2spk.read_text().splitlines() if line.strip())
    vad_scp = feats_dir / "vad.scp"
    vads = kaldiio.load_scp(str(vad_scp)) if vad_scp.is_file() else {}
    means: dict[str, list[np.ndarray]] = defaultdict(list)
    spk_of_session: dict[str, str] = {}
    for utt, x in kaldiio.load_scp_sequential(str(feats_dir / "feats.scp")):
        m = session.match(utt)
        if m is None:
            raise SystemExit(f"channel_stats.py: {feats_dir}/feats.scp: utterance {utt!r} does not match --session")
        name = m.group(1) if m.groups() else m.group(0)
        if utt not in spk_of:
            raise SystemExit(f"channel_stats.py: {utt2spk}: no speaker for utterance {utt!r}")
        means[name].append(select_voiced(np.asarray(x, dtype=np.float64), vads.get(utt)).mean(axis=0))
        spk_of_session[name] = spk_of[utt].strip()
    out = []
    for a, b in itertools.combinations(sorted(means), 2):
        if spk_of_session[a] != spk_of_session[b]:
            continue
        d = (np.mean(means[a], axis=0) - np.mean(means[b], axis=0)) * DB
        out.append((a, b, float(d.mean()), float(np.ptp(d - d.mean()))))
    return out


def curve_spread(config: Path, pairs: int = 2000) -> tuple[float, float, float]:
    """(level difference sd dB, median and 90th percentile of the peak-to-peak of the rest dB) of
    two crops' channel curves under ``config``'s ``train.channel_perturb`` (band and roll-off off)."""
    import torch

    from spkflow.augment.fbank import FbankChannelPerturb
    from spkflow.train.config import load_train_config

    cfg = load_train_config(config)
    channel = dict(cfg["train"]["channel_perturb"] or {})
    if not channel:
        raise SystemExit(f"channel_stats.py: {config}: no train.channel_perturb")
    channel.update(band_prob=0.0, rolloff_prob=0.0, reverb_prob=0.0)
    perturb = FbankChannelPerturb(channel, cfg["frontend"]["fbank"] or {})  # null: FbankOptions defaults
    torch.manual_seed(0)
    c = perturb.curves(2 * pairs).double().numpy() * DB
    d = c[0::2] - c[1::2]
    level = d.mean(axis=1)
    p2p = np.ptp(d - level[:, None], axis=1)
    return float(level.std()), float(np.median(p2p)), float(np.percentile(p2p, 90))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="train test dsp20 libri fsdd")
    p.add_argument("--dumpdir", default="dump")
    p.add_argument("--datadir", default="data")
    p.add_argument("--session", help="regex: its first group is an utterance's session (prints session pairs)")
    p.add_argument("--config", type=Path, help="a training config: what its channel curves do to two crops")
    args = p.parse_args()
    if args.session:
        pattern = re.compile(args.session)
        print("| set | sessions | level difference (dB) | equaliser peak-to-peak (dB) |")
        print("|---|---|---|---|")
        for name in args.sets.split():
            feats, utt2spk = Path(args.dumpdir) / "fbank" / name, Path(args.datadir) / name / "utt2spk"
            for a, b, level, p2p in session_pairs(feats, utt2spk, pattern):
                print(f"| {name} | {a} ~ {b} | {level:+.1f} | {p2p:.1f} |")
    else:
        print("| set | speakers | level sd within / between speakers | tilt sd within / between |")
        print("|---|---|---|---|")
        for name in args.sets.split():
            s = channel_stats(Path(args.dumpdir) / "fbank" / name, Path(args.datadir) / name / "utt2spk")
            print(
                f"| {name} | {s['speakers']} | {s['level_within']:.2f} / {s['level_between']:.2f} "
                f"| {s['tilt_within']:.2f} / {s['tilt_between']:.2f} |"
            )
    if args.config:
        sd, median, p90 = curve_spread(args.config)
        print(
            f"{args.config}: two crops' channels differ by {sd:.1f} dB (sd) in level, "
            f"{median:.1f} dB peak-to-peak in shape (median; 90th percentile {p90:.1f})"
        )


if __name__ == "__main__":
    main()
