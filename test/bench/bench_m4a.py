"""Benchmark: VoxCeleb2's m4a read through the recipe's ffmpeg pipe vs converted once to FLAC.

    .venv/bin/python test/bench/bench_m4a.py WORK_DIR     # then, for stage 2 on both:
    scripts/feats/make_fbank.sh --nj 1 WORK_DIR/d OUT     # (and a data dir of WORK_DIR/flac)

40 utterances of real speech (speechocean762 from db.sh, the first 8 s of files >= 7 s), AAC at
64 kb/s (VoxCeleb2's ~70 kb/s).  Prints: pipe read time per utterance (spkflow.data.audio.AudioReader
on the wav.scp line spkflow.corpora.voxceleb writes), one-off m4a -> FLAC conversion time,
FLAC read time, MP4 header duration time, disk per hour for wav / m4a / FLAC, scaled to
VoxCeleb2 dev's 2,360 h.  Leaves WORK_DIR/d (a data dir of the m4a pipes) for make_fbank.sh.
"""

import subprocess
import sys
import time
from pathlib import Path

import imageio_ffmpeg
import soundfile as sf

from spkflow.corpora.voxceleb import ffmpeg_pipe, m4a_duration
from spkflow.data.audio import AudioReader

ROOT = Path(__file__).resolve().parents[2]
exe = imageio_ffmpeg.get_ffmpeg_exe()
root = Path(sys.argv[1])
src, m4a, flac = root / "src", root / "m4a", root / "flac"
for d in (src, m4a, flac):
    d.mkdir(parents=True, exist_ok=True)
db = ROOT / "egs" / "TEMPLATE" / "spk1" / "db.sh"
so762 = subprocess.run(["bash", "-c", f'. "{db}"; printf %s "$SPEECHOCEAN762"'], capture_output=True, text=True).stdout
so = Path(so762) / "WAVE"
files = sorted(so.rglob("*.flac"))
n = 0
total = 0.0
for f in files:
    x, r = sf.read(f, dtype="float32")
    if len(x) < 7 * r:
        continue
    x = x[: 8 * r]
    sf.write(src / f"{n:03d}.wav", x, r, subtype="PCM_16")
    total += len(x) / r
    n += 1
    if n == 40:
        break
print(f"{n} files, {total:.1f} s of speech (16 kHz mono)")
t = time.perf_counter()
for w in sorted(src.glob("*.wav")):
    subprocess.run(
        [
            exe,
            "-nostdin",
            "-v",
            "error",
            "-y",
            "-i",
            str(w),
            "-c:a",
            "aac",
            "-b:a",
            "64k",
            str(m4a / (w.stem + ".m4a")),
        ],
        check=True,
    )
print(f"encode to m4a (test setup only): {time.perf_counter() - t:.2f} s")
d = root / "d"
d.mkdir(exist_ok=True)
(d / "wav.scp").write_text(  # noqa: E501
    "".join(f"u{p.stem} {ffmpeg_pipe(exe, str(p))}\n" for p in sorted(m4a.glob("*.m4a")))
)


def size(p):
    return sum(f.stat().st_size for f in p.iterdir())


hours = total / 3600
for _rep in range(2):
    t = time.perf_counter()
    rd = AudioReader(d)
    secs = sum(len(rd.read(k)) / 16000 for k in rd.keys())
    tp = time.perf_counter() - t
    print(
        f"pipe read (ffmpeg per utterance): {tp:.2f} s for {secs:.0f} s audio -> {secs / tp:.0f}x real time,", end=" "
    )
    print(f"{tp / n * 1000:.1f} ms/utt")
t = time.perf_counter()
for p in sorted(m4a.glob("*.m4a")):
    subprocess.run(
        [
            exe,
            "-nostdin",
            "-v",
            "error",
            "-y",
            "-i",
            str(p),
            "-ac",
            "1",
            "-ar",
            "16000",
            "-sample_fmt",
            "s16",
            str(flac / (p.stem + ".flac")),
        ],
        check=True,
    )
tc = time.perf_counter() - t
print(f"convert m4a -> flac once: {tc:.2f} s -> {total / tc:.0f}x real time, {tc / n * 1000:.1f} ms/utt")
for _rep in range(2):
    t = time.perf_counter()
    secs = sum(len(sf.read(p, dtype="float32")[0]) / 16000 for p in sorted(flac.glob("*.flac")))
    tf = time.perf_counter() - t
    print(f"flac read (libsndfile): {tf:.3f} s -> {secs / tf:.0f}x real time, {tf / n * 1000:.2f} ms/utt")
t = time.perf_counter()
[m4a_duration(p) for p in sorted(m4a.glob("*.m4a"))]
th = time.perf_counter() - t
print(f"m4a duration from header: {th / n * 1e6:.0f} us/utt")
for name, p in (("wav 16-bit", src), ("m4a 64 kb/s", m4a), ("flac", flac)):
    per_hour = size(p) / hours
    print(f"disk {name}: {size(p) / 1e6:.2f} MB for {total:.0f} s -> {per_hour / 1e6:.0f} MB/h;", end=" ")
    print(f"x2360 h = {per_hour * 2360 / 1e9:.0f} GB")
