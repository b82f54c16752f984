"""Benchmark: feature extraction real-time factor, make_fbank.sh (run.pl, nj=1 and nj=2) against
torchaudio's Kaldi fbank in one process, on the same real audio.

    OMP_NUM_THREADS=1 .venv/bin/python test/bench/bench_fbank.py [--corpus DIR] [--utts N] [--work DIR]
    # optional peer: .venv/bin/pip install kaldi-native-fbank  (or --knf-path DIR with the wheel unpacked)

Audio: speechocean762 train (1,500 utterances, 1.7 h of 16 kHz FLAC; ``--corpus`` defaults to
``SPEECHOCEAN762`` of the recipe's db.sh).  A data dir is written under ``--work`` (default a
temporary directory, removed afterwards) with absolute paths and utt2dur.

Rows (RTF = wall seconds / audio seconds; lower is better; "x" = speed relative to torchaudio):

* ``torchaudio 1 process``: for each utterance decode the FLAC (soundfile) and run
  ``torchaudio.compliance.kaldi.fbank`` (float32, 80 bins, dither 0) - the peer;
* ``spkflow compute_fbank 1 process``: the same loop with :func:`spkflow.features.fbank.compute_fbank`;
* ``kaldi-native-fbank 1 process`` (when importable): the same loop with its OnlineFbank;
* ``make_fbank.sh nj=1`` / ``nj=2``: the whole script through ``utils/run.pl`` - process start,
  duration split, decoding, fbank, VAD, CMVN stats, writing kaldiio arks and scps, the merge.

The machine's load average is printed before and after: on a shared machine the figures are
only comparable within one run.
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

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))  # the test helpers
from helpers.paths import db_var  # noqa: E402
from spkflow.features.fbank import FbankOptions, compute_fbank  # noqa: E402


def build_data_dir(corpus: Path, out: Path, limit: int) -> tuple[list[tuple[str, str]], float]:
    """wav.scp/utt2spk/spk2utt/utt2dur of speechocean762 train with absolute paths, sorted."""
    lines = (corpus / "train" / "wav.scp").read_text().split("\n")
    entries = []
    for line in lines:
        if line.strip():
            rec, rel = line.split()
            path = str(corpus / rel)
            spk = rel.split("/")[-2].replace("SPEAKER", "")
            entries.append((f"{spk}-{rec}", path))
    entries.sort()
    entries = entries[:limit] if limit else entries
    out.mkdir(parents=True, exist_ok=True)
    durs = {u: sf.info(p).frames / sf.info(p).samplerate for u, p in entries}
    (out / "wav.scp").write_text("".join(f"{u} {p}\n" for u, p in entries))
    (out / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u, _ in entries))
    (out / "utt2dur").write_text("".join(f"{u} {durs[u]:.4f}\n" for u, _ in entries))
    spk2utt: dict[str, list[str]] = {}
    for u, _ in entries:
        spk2utt.setdefault(u.split("-")[0], []).append(u)
    (out / "spk2utt").write_text("".join(f"{s} {' '.join(v)}\n" for s, v in sorted(spk2utt.items())))
    return entries, sum(durs.values())


def children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def loop(entries: list[tuple[str, str]], fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of decoding every file and calling ``fn`` on it."""
    t, c = time.perf_counter(), time.process_time()
    for _, path in entries:
        w, sr = sf.read(path, dtype="float32")
        fn(w, sr)
    return time.perf_counter() - t, time.process_time() - c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="")
    ap.add_argument("--utts", type=int, default=0, help="first N utterances (0: all)")
    ap.add_argument("--work", default="")
    ap.add_argument("--knf-path", default="", help="directory holding kaldi_native_fbank (pip --target)")
    ap.add_argument("--skip-script", action="store_true", help="only the in-process rows")
    a = ap.parse_args()
    corpus = Path(a.corpus or db_var("SPEECHOCEAN762"))
    if not (corpus / "train" / "wav.scp").is_file():
        print(f"speechocean762 not found at {corpus}", file=sys.stderr)
        return 1
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="bench_fbank."))
    cleanup = not a.work
    try:
        import torch
        import torchaudio.compliance.kaldi as kaldi

        torch.set_num_threads(1)
        data = work / "data" / "train"
        entries, audio = build_data_dir(corpus, data, a.utts)
        print(
            f"audio: {len(entries)} utterances, {audio / 3600:.2f} h ({corpus}); "
            f"cores: {os.cpu_count()}; load average before: {os.getloadavg()[0]:.2f}"
        )
        rows: list[tuple[str, tuple[float, float]]] = []
        loop(entries[:20], lambda w, sr: None)  # warm the page cache
        decode = loop(entries, lambda w, sr: None)
        rows.append(("decode only (soundfile), 1 process", decode))
        ta = loop(
            entries,
            lambda w, sr: kaldi.fbank(
                torch.from_numpy(w)[None] * 32768.0, num_mel_bins=80, dither=0.0, energy_floor=0.0, sample_frequency=sr
            ),
        )
        rows.append(("torchaudio Kaldi fbank, 1 process (peer)", ta))
        opts = FbankOptions()
        rows.append(("spkflow compute_fbank, 1 process", loop(entries, lambda w, sr: compute_fbank(w, sr, opts))))
        if a.knf_path:
            sys.path.insert(0, a.knf_path)
        try:
            import kaldi_native_fbank as knf

            ko = knf.FbankOptions()
            ko.frame_opts.dither = 0.0
            ko.mel_opts.num_bins = 80

            def knf_fbank(w, sr):
                f = knf.OnlineFbank(ko)
                f.accept_waveform(sr, w * 32768.0)
                f.input_finished()
                return np.stack([f.get_frame(i) for i in range(f.num_frames_ready)])

            rows.append(("kaldi-native-fbank, 1 process", loop(entries, knf_fbank)))
        except ImportError:
            print("(kaldi-native-fbank not installed: row skipped)")
        if not a.skip_script:
            env = dict(
                os.environ, PATH=f"{ROOT / '.venv' / 'bin'}:{ROOT / 'utils'}:{os.environ['PATH']}", OMP_NUM_THREADS="1"
            )
            for nj in (1, 2):
                out = work / f"fbank_nj{nj}"
                shutil.rmtree(out, ignore_errors=True)
                t, c = time.perf_counter(), children_cpu()
                subprocess.run(
                    [
                        "bash",
                        str(ROOT / "scripts" / "feats" / "make_fbank.sh"),
                        "--nj",
                        str(nj),
                        "--fbank-conf",
                        str(ROOT / "egs" / "TEMPLATE" / "spk1" / "conf" / "fbank.conf"),
                        "--vad-conf",
                        str(ROOT / "egs" / "TEMPLATE" / "spk1" / "conf" / "vad.conf"),
                        str(data),
                        str(out),
                    ],
                    check=True,
                    env=env,
                    capture_output=True,
                )
                rows.append(
                    (
                        f"make_fbank.sh nj={nj} (run.pl; + VAD, stats, arks)",
                        (time.perf_counter() - t, children_cpu() - c),
                    )
                )
        print(f"{'':52s} {'wall s':>7s} {'RTF':>8s} {'x torch':>8s} {'CPU s':>7s} {'CPU/audio':>10s}")
        for name, (sec, cpu) in rows:
            print(f"{name:52s} {sec:7.2f} {sec / audio:8.5f} {ta[0] / sec:7.2f}x {cpu:7.2f} {cpu / audio:10.5f}")
        print(
            "RTF = wall / audio; CPU/audio = CPU seconds (all processes) per second of audio; on N free "
            "cores a script's wall time approaches its CPU time / min(N, nj)"
        )
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        if cleanup:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
