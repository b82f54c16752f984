"""Benchmark: ``python -m spkflow.bin.diarize`` end to end (process start, model load, energy VAD,
windows, embeddings, clustering, RTTM) on long simulated meetings, against Resemblyzer's own
diarization route in the same run.

    OMP_NUM_THREADS=2 .venv/bin/python test/bench/bench_diarize.py --model MODEL \\
        [--minutes 10 60] [--peer-python PYTHON]

Recordings: conversations of 4 LibriSpeech mini speakers (db.sh's LIBRISPEECH) simulated with the
AMI turn-taking statistics (egs/TEMPLATE/diar1/conf/turn_stats_ami.json), one per --minutes.
Ours: one process per recording, the command a user runs, 1.5 s windows every 0.75 s over the
energy VAD's speech, spectral clustering in the model's scoring space.  The peer: Resemblyzer
(pretrained GE2E LSTM, the embedder of Google's turn-to-diarize line of work) as its diarization
demo runs it, one process too: ``preprocess_wav`` (webrtcvad), ``embed_utterance(return_partials=
True, rate=1/0.75)`` (1.6 s partials every 0.75 s), and the same spectral clusterer.  Rows: wall
time, real-time factor (wall / audio) and peak resident memory of each process (``wait4``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test"))  # the test helpers

PEER = r"""
import sys, numpy as np
from resemblyzer import VoiceEncoder, preprocess_wav
from spkflow.diar.cluster import spectral_labels
wav = preprocess_wav(sys.argv[1])
enc = VoiceEncoder("cpu", verbose=False)
_, partials, _ = enc.embed_utterance(wav, return_partials=True, rate=1 / 0.75)
labels = spectral_labels(partials, max_speakers=8)
print(len(partials), len(set(labels.tolist())))
"""


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out, err = proc.communicate()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed:\n{err.decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--model", required=True, help="model dir or pack (the demo's: egs/speechocean762/spk1/exp/spk_train)"
    )
    p.add_argument("--minutes", type=float, nargs="+", default=[10.0, 60.0])
    p.add_argument("--peer-python", default=sys.executable, help="a Python with resemblyzer (default: this one)")
    p.add_argument("--work", default=None, help="keep the recordings here (default: a temporary folder)")
    args = p.parse_args()
    from helpers.paths import db_var

    libri = Path(os.environ.get("LIBRISPEECH") or db_var("LIBRISPEECH"))
    if not libri.is_dir():
        raise SystemExit(f"LibriSpeech mini not found at {libri} (set LIBRISPEECH)")
    if subprocess.run([args.peer_python, "-c", "import resemblyzer"], capture_output=True).returncode != 0:
        raise SystemExit(f"{args.peer_python} cannot import resemblyzer: pip install '.[resemblyzer]' in the checkout")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_diarize-"))
    py = sys.executable
    subprocess.run(
        [py, "-m", "spkflow.bin.prepare_corpus", "librispeech", str(libri), str(work / "pool")],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"OMP_NUM_THREADS={threads}, {os.cpu_count()} CPUs; model {args.model}")
    print(f"{'recording':<14} {'system':<34} {'wall s':>8} {'RTF':>7} {'peak RSS MiB':>13}")
    for minutes in args.minutes:
        name = f"meet{int(minutes)}min"
        reco = work / name
        if not (reco / "wav.scp").is_file():
            subprocess.run(
                [py, "-m", "spkflow.bin.simulate_conversations", "--stats",
                 str(ROOT / "egs/TEMPLATE/diar1/conf/turn_stats_ami.json"), "--num-recordings", "1",
                 "--min-speakers", "4", "--max-speakers", "4", "--duration", str(60 * minutes), "--prefix", name,
                 str(work / "pool"), str(reco / "audio"), str(reco)],
                env=env, check=True, capture_output=True,
            )  # fmt: skip
        audio = next((reco / "audio").glob("*.flac"))
        import soundfile as sf

        seconds = sf.info(str(audio)).duration
        out = work / "out" / name
        shutil.rmtree(out, ignore_errors=True)  # a kept RTTM of an earlier run (--work reused) would be no work
        ours = [py, "-m", "spkflow.bin.diarize", "--model", args.model, "--out", str(out), str(audio)]
        for label, cmd in (
            ("spkflow.bin.diarize (energy VAD)", ours),
            ("Resemblyzer partials + spectral", [args.peer_python, "-c", PEER, str(audio)]),
        ):
            wall, rss = run(cmd, env)
            print(f"{name:<14} {label:<34} {wall:8.1f} {wall / seconds:7.4f} {rss:13.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
