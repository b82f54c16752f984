"""Benchmark: audio access against peers measured in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_audio.py [--repeat 3]

Rows (best of --repeat wall times; ratios < 1 mean ours is faster):

1. read every utterance of a 16 kHz FLAC data dir (speechocean762 test, 500 utts, from db.sh;
   synthetic FLAC when the corpus is absent): ``AudioReader.read`` vs ``soundfile.read`` on the
   same paths (our overhead) and vs ``torchaudio.load`` (peer; skipped when torchaudio has no
   decoding backend, e.g. torchaudio >= 2.9 without torchcodec);
2. utt2dur of that data dir: :func:`spkflow.data.durations.utt2dur` (headers) vs decoding every file
   (what Kaldi's ``wav-to-duration --read-entire-file`` and ESPnet's reader do for pipes);
3. 8 kHz -> 16 kHz on FSDD (600 utts; synthetic when absent): ``resample`` (scipy polyphase) vs
   ``torchaudio.functional.resample`` (default sinc), same inputs;
4. 40 segments of 2 s from one 120 s FLAC recording: ``AudioReader`` (seek) vs decode the whole
   recording for each segment and slice (Kaldi's ``extract-segments`` reads each recording once
   per segment group; ESPnet's ``SoundScpReader`` with segments decodes the whole file).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))  # the test helpers
from helpers.bench import best  # noqa: E402
from helpers.paths import db_var  # noqa: E402
from spkflow.data.audio import AudioReader  # noqa: E402
from spkflow.data.durations import utt2dur  # noqa: E402
from spkflow.data.resample import resample  # noqa: E402


def synth_dir(root: Path, n: int, rate: int, seconds: float) -> Path:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        p = root / f"u{i:04d}.flac"
        sf.write(p, (0.1 * rng.standard_normal(int(seconds * rate))).astype(np.float32), rate)
        lines.append(f"s{i % 50:03d}-u{i:04d} {p}\n")
    d = root / "data"
    d.mkdir()
    (d / "wav.scp").write_text("".join(sorted(lines)))
    return d


def real_or_synth(
    tmp: Path, var: str, make: Callable[[], Path], prepare: Callable[[Path, Path], Path]
) -> tuple[Path, str]:
    src = Path(db_var(var))
    if src.is_dir():
        return prepare(src, tmp), f"{var}={src}"
    return make(), "synthetic"


def row(name: str, ours: float, peer: float, peer_name: str) -> None:
    print(f"{name:48s} ours {ours * 1000:8.1f} ms   {peer_name:28s} {peer * 1000:8.1f} ms   ratio {ours / peer:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import torch
    import torchaudio
    import torchaudio.functional as AF

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from spkflow.corpora import collect
    from spkflow.corpora.base import write_data_dir

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "s").mkdir()
        (tmp / "f").mkdir()
        so, so_src = real_or_synth(
            tmp,
            "SPEECHOCEAN762",
            lambda: synth_dir(tmp / "s", 500, 16000, 4.0),
            lambda src, t: (
                write_data_dir(collect("speechocean762", str(src), split="test"), t / "test", utt2dur=False).path
            ),
        )
        fsdd, fsdd_src = real_or_synth(
            tmp,
            "FSDD",
            lambda: synth_dir(tmp / "f", 600, 8000, 0.5),
            lambda src, t: write_data_dir(collect("fsdd", str(src)), t / "fsdd", utt2dur=False).path,
        )
        print(f"data: {so_src} ({so}), {fsdd_src} ({fsdd}); repeat {args.repeat}; threads {torch.get_num_threads()}")

        reader = AudioReader(so)
        paths = [reader.source(u) for u in reader.keys()]
        ours = best(lambda: [reader.read(u) for u in reader.keys()], args.repeat)
        sfr = best(lambda: [sf.read(p, dtype="float32") for p in paths], args.repeat)
        try:
            ta = best(lambda: [torchaudio.load(p) for p in paths], args.repeat)
        except Exception as exc:  # torchaudio without a decoding backend
            print(f"torchaudio.load unavailable: {exc.__class__.__name__}: {str(exc)[:80]}")
            ta = float("nan")
        n_sec = sum(len(reader.read(u)) for u in reader.keys()) / 16000
        print(f"1. read {len(paths)} utts ({n_sec / 60:.1f} min of audio)")
        row("   AudioReader.read", ours, sfr, "soundfile.read")
        if ta == ta:  # not NaN
            row("   AudioReader.read", ours, ta, "torchaudio.load")

        hdr = best(lambda: utt2dur(so), args.repeat)
        dec = best(lambda: {p: len(sf.read(p)[0]) for p in paths}, args.repeat)
        print("2. utt2dur")
        row("   headers (spkflow.data.durations.utt2dur)", hdr, dec, "decode every file")

        r8 = AudioReader(fsdd, sample_rate=None)
        waves = [r8.read_native(u)[0] for u in r8.keys()]
        ours_rs = best(lambda: [resample(w, 8000, 16000) for w in waves], args.repeat)
        tensors = [torch.from_numpy(w) for w in waves]
        ta_rs = best(lambda: [AF.resample(t, 8000, 16000) for t in tensors], args.repeat)
        print(f"3. resample {len(waves)} FSDD utts 8 kHz -> 16 kHz")
        row("   resample (scipy polyphase)", ours_rs, ta_rs, "torchaudio resample")

        long = tmp / "long.flac"
        rng = np.random.default_rng(1)
        sf.write(long, (0.1 * rng.standard_normal(120 * 16000)).astype(np.float32), 16000)
        segd = tmp / "seg"
        segd.mkdir()
        (segd / "wav.scp").write_text(f"rec {long}\n")
        segs = [(f"rec-{i:03d}", 3.0 * i, 3.0 * i + 2.0) for i in range(40)]
        (segd / "segments").write_text("".join(f"{u} rec {s} {e}\n" for u, s, e in segs))
        sr = AudioReader(segd)
        ours_seg = best(lambda: [sr.read(u) for u, _, _ in segs], args.repeat)
        whole = best(
            lambda: [sf.read(long, dtype="float32")[0][int(s * 16000) : int(e * 16000)] for _, s, e in segs],
            args.repeat,
        )
        print("4. 40 x 2 s segments of a 120 s FLAC")
        row("   AudioReader (seek)", ours_seg, whole, "decode whole file + slice")


if __name__ == "__main__":
    main()
