"""Print what stage 2 is about to cost: hours of audio, estimated feature arks, free disk.

    python -m spkflow.bin.scale_facts [--fbank-conf conf/fbank.conf] [--compress true] \
        --out-dir dump data/vox2_dev data/vox1_o ...

Hours come from each data dir's utt2dur (utterances without it are counted and said to be
unknown).  Feature size is arithmetic, not a guess: frames = seconds / frame shift, one float32
per mel bin per frame (Kaldi's uncompressed matrix), two bytes per value when compressed
(stage 2's --fbank_compress true), plus a float32 VAD decision per frame.  Free disk is that of
the file system holding --out-dir (or its nearest existing parent).  Exits 0 even when the
estimate exceeds the free space: it warns, the user decides.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from spkflow.bin import setup_logging
from spkflow.bin.argtypes import boolean
from spkflow.data.tables import read_kv
from spkflow.features.fbank import FbankOptions


def feature_bytes(seconds: float, opts: FbankOptions, compress: bool) -> float:
    """Bytes of fbank + VAD arks for ``seconds`` of audio (headers of a few bytes per utterance aside)."""
    frames = seconds * 1000.0 / opts.frame_shift
    per_value = 2 if compress else 4
    return frames * (opts.dim * per_value + 4)


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="scale_facts", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("data_dirs", nargs="+")
    p.add_argument("--fbank-conf", default=None, help="Kaldi fbank option file (default: spkflow's defaults)")
    p.add_argument("--compress", type=boolean, default=False, help="stage 2 writes compressed arks (true|false)")
    p.add_argument("--out-dir", default=".", help="where the features go (free disk of its file system)")
    args = p.parse_args(argv)
    setup_logging()
    opts = FbankOptions.from_kaldi_conf(args.fbank_conf) if args.fbank_conf else FbankOptions()
    total = 0.0
    for d in args.data_dirs:
        if not (Path(d) / "utt2spk").is_file():
            logging.info("scale: %s: no utt2spk (stage 1 writes it)", d)
            continue
        u2s = read_kv(Path(d) / "utt2spk")
        durs = read_kv(Path(d) / "utt2dur") if (Path(d) / "utt2dur").is_file() else {}
        secs = sum(float(v) for v in durs.values())
        unknown = sum(1 for u in u2s if u not in durs)
        total += secs
        note = f" ({unknown} utterances of unknown duration)" if unknown else ""
        logging.info("scale: %s: %d utterances, %.2f h%s", d, len(u2s), secs / 3600, note)
    out = Path(args.out_dir).resolve()
    while not out.exists():
        out = out.parent
    free = shutil.disk_usage(out).free
    f32, cmp = feature_bytes(total, opts, False), feature_bytes(total, opts, True)
    logging.info(
        "scale: %.2f h of audio -> fbank %d dims every %g ms: ~%s float32 arks, ~%s compressed (%s); free at %s: %s",
        total / 3600,
        opts.dim,
        opts.frame_shift,
        _gb(f32),
        _gb(cmp),
        "chosen" if args.compress else "--fbank_compress true",
        out,
        _gb(free),
    )
    need = cmp if args.compress else f32
    if need > free:
        logging.warning("scale: the features need ~%s but only %s is free at %s", _gb(need), _gb(free), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
