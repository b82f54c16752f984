#!/usr/bin/env python3
"""A copy of a data dir whose audio comes through a narrow-band channel.

    python local/narrowband_copy.py [--rate 8000] data/dsp20 data/dsp20_8k

Every file of the source dir is copied; each wav.scp entry becomes an ffmpeg pipe (the binary of
the pinned imageio-ffmpeg) that resamples the recording to ``--rate`` Hz, so stage 2 reads 8 kHz
audio and resamples it to the features' rate as it does for FSDD.  Kaldi's SRE recipes make
their 8 kHz copies with ``sox ... -r 8000`` in wav.scp the same way.  The demo uses it for a
development set in the telephone band (DSPSpeech-20 at 8 kHz, ``--dsp20_8k true`` of
local/data.sh): a set the recipe may choose settings on, unlike the held-out FSDD.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from spkflow.core.atomic import atomic_write
from spkflow.corpora.voxceleb import default_ffmpeg, ffmpeg_pipe
from spkflow.data.tables import read_kv, write_kv


def narrow_entry(entry: str, ffmpeg: str, rate: int) -> str:
    """A wav.scp value (a path or a ``cmd |`` pipe) read through ffmpeg at ``rate`` Hz."""
    if entry.rstrip().endswith("|"):
        return f"{entry.rstrip()[:-1].rstrip()} | {ffmpeg_pipe(ffmpeg, '-', rate)}"
    return ffmpeg_pipe(ffmpeg, entry, rate)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=8000, help="sample rate of the channel (Hz)")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    a = p.parse_args(argv)
    if not (a.src / "wav.scp").is_file():
        sys.exit(f"narrowband_copy.py: {a.src / 'wav.scp'} not found")
    a.dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(a.src.iterdir()):  # each file appears whole or not at all (a killed copy is redone)
        if f.is_file() and f.name != "wav.scp":
            with open(f, "rb") as src, atomic_write(a.dst / f.name, "wb") as dst:
                shutil.copyfileobj(src, dst)
    ffmpeg = default_ffmpeg()
    wav = read_kv(a.src / "wav.scp")
    write_kv(a.dst / "wav.scp", {utt: narrow_entry(entry, ffmpeg, a.rate) for utt, entry in wav.items()})
    print(f"narrowband_copy.py: {len(wav)} utterances of {a.src} at {a.rate} Hz -> {a.dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
