"""Corpora: mini copies of each release's layout with real audio files, and the validity checks a
prepared data dir must pass (the real corpora: the db.sh variables, :func:`helpers.paths.db_var`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf

from helpers.paths import ROOT
from spkflow.data.datadir import DataDir
from spkflow.data.tables import check_sorted_unique

#: Real speech for the tests and benchmarks that need some, per db.sh corpus: (glob under the
#: corpus, the speaker of a file, speakers, files per speaker): the first files of the first
#: speakers in sorted order.  test/bench/gpu_bundle.sh copies exactly these files (same layout), and
#: the selection picks the same files from the copy, so the CUDA-marked tests and bench_gpu.py run
#: on a GPU machine without the corpora (7 MB: 16 kHz read speech and words, 8 kHz digits).
SPEECH: dict[str, tuple[str, Callable[[Path], str], int, int]] = {
    "SPEECHOCEAN762": ("WAVE/*/*.flac", lambda p: p.parent.name, 16, 3),  # 16 kHz read English, 2-20 s
    "LIBRISPEECH": ("test-clean/*/*/*.flac", lambda p: p.parent.parent.name, 8, 8),  # 16 kHz, 6-20 s
    "DSPSPEECH20": ("speech_data/*/*.flac", lambda p: p.parent.name, 12, 3),  # 16 kHz words, ~2 s
    "FSDD": ("recordings/*.flac", lambda p: p.stem.split("_")[1], 6, 8),  # 8 kHz digits, 0.2-2 s
}


def speech_files(root: Path, name: str) -> list[Path]:
    """The :data:`SPEECH` selection of corpus ``name`` (a db.sh variable) found under ``root``."""
    pattern, speaker, num_spk, per_spk = SPEECH[name]
    groups: dict[str, list[Path]] = {}
    for p in sorted(Path(root).glob(pattern)):
        groups.setdefault(speaker(p), []).append(p)
    return [p for spk in list(groups)[:num_spk] for p in groups[spk][:per_spk]]


def real_speech_sets(root_of: Callable[[str], Path]) -> dict[str, list[tuple[np.ndarray, int]]]:
    """Audio as stage 2 reads it, ``(waveform, native rate)``, per set: the :data:`SPEECH` selection of
    each corpus (``root_of(name)``: its directory), and ``dsp20_8k``: DSPSpeech-20 through an 8 kHz
    16-bit channel (ffmpeg ``-ar 8000 pcm_s16le`` in the demo's local/narrowband_copy.py; here
    :func:`spkflow.data.resample.resample`), which the recipes resample back to 16 kHz."""
    from spkflow.data.resample import resample

    sets: dict[str, list[tuple[np.ndarray, int]]] = {}
    for name in SPEECH:
        sets[name] = []
        for path in speech_files(root_of(name), name):
            w, sr = sf.read(path, dtype="float32", always_2d=True)
            sets[name].append((w[:, 0], int(sr)))
    sets["dsp20_8k"] = [
        (np.round(resample(w, sr, 8000) * 32768).clip(-32768, 32767).astype(np.float32) / 32768, 8000)
        for w, sr in sets["DSPSPEECH20"]
    ]
    return sets


def tone(path: Path, seconds: float, rate: int = 16000, freq: float = 220.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(round(seconds * rate))) / rate
    fmt = "FLAC" if path.suffix.lower() == ".flac" else "WAV"
    sf.write(path, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format=fmt, subtype="PCM_16")


def make_speechocean_mini(
    root: Path,
    spk_train: tuple[str, ...] = ("0001", "1027", "0005"),
    spk_test: tuple[str, ...] = ("0003", "9601"),
    n_train: int = 3,
    n_test: int = 2,
) -> Path:
    """speechocean762 layout: WAVE/SPEAKERnnnn/<utt>.WAV + train/ test/ Kaldi lists (tabs,
    relative paths, utt ids <0spk><4 digits>, spk2age unsorted).  Some audio is stored as
    .flac while wav.scp says .WAV (the shared copy's conversion)."""
    for split, spks, n in (("train", spk_train, n_train), ("test", spk_test, n_test)):
        lines: dict[str, list[str]] = {k: [] for k in ("wav.scp", "utt2spk", "text", "spk2age", "spk2gender")}
        for s_i, spk in enumerate(spks):
            for u in range(n):
                utt = f"0{spk}{u * 7 + 3:04d}"
                ext = ".WAV" if (s_i + u) % 2 else ".flac"
                tone(root / "WAVE" / f"SPEAKER{spk}" / f"{utt}{ext}", 0.25 + 0.05 * u)
                lines["wav.scp"].append(f"{utt}\tWAVE/SPEAKER{spk}/{utt}.WAV")
                lines["utt2spk"].append(f"{utt} {spk}")
                lines["text"].append(f"{utt}\tWE CALL IT BEAR {u}")
            lines["spk2age"].append(f"{spk}\t{30 - s_i}")
            lines["spk2gender"].append(f"{spk}\t{'mf'[s_i % 2]}")
        d = root / split
        d.mkdir(parents=True, exist_ok=True)
        for name, ls in lines.items():
            if name == "wav.scp":
                ls = ls[1:] + ls[:1]  # partly unsorted, like the release
            (d / name).write_text("\n".join(ls) + "\n")
    return root


def make_dsp20_mini(
    root: Path,
    spks: tuple[str, ...] = ("15307110189", "15307130120", "15307130191"),
    words: int = 3,
    rounds: int = 3,
    ext: str = ".flac",
) -> Path:
    for spk in spks:
        for w in range(words):
            for r in range(1, rounds + 1):
                tone(root / "speech_data" / spk / f"{spk}-{w:02d}-{r:02d}{ext}", 0.2)
    (root / "LICENSE").write_text("MIT\n")
    return root


def make_fsdd_mini(root: Path, spks: tuple[str, ...] = ("george", "jackson", "theo"), n: int = 2) -> Path:
    for spk in spks:
        for digit in range(3):
            for i in range(n):
                tone(root / "recordings" / f"{digit}_{spk}_{i}.wav", 0.3, rate=8000)
    return root


def make_librispeech_mini(root: Path) -> Path:
    layout = {"test-clean": {"121": ["121726"], "61": ["70968", "70970"]}, "train-clean-100": {"19": ["198"]}}
    for subset, spks in layout.items():
        for spk, chapters in spks.items():
            for ch in chapters:
                d = root / subset / spk / ch
                trans = []
                for u in range(2):
                    tone(d / f"{spk}-{ch}-{u:04d}.flac", 0.4)
                    trans.append(f"{spk}-{ch}-{u:04d} HELLO WORLD {u}")
                (d / f"{spk}-{ch}.trans.txt").write_text("\n".join(trans) + "\n")
    (root / "SPEAKERS.TXT").write_text(
        "; ID |SEX| SUBSET |MINUTES| NAME\n121 | F | test-clean | 8.0 | Anne\n"
        "61 | M | test-clean | 8.1 | Bob\n19 | F | train-clean-100 | 25.2 | Kara\n"
    )
    return root


def assert_valid(d: Path) -> None:
    """Our checks, and utils/validate_data_dir.sh when it exists."""
    DataDir(d).validate(no_feats=True, no_text=True)
    for name in os.listdir(d):
        if (d / name).is_file() and name != "trials":
            check_sorted_unique(d / name)
    script = ROOT / "utils" / "validate_data_dir.sh"
    if script.exists():
        r = subprocess.run([str(script), "--no-feats", "--no-text", str(d)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def real_speech_data_dir(corpus, out: Path, libri: int = 6, fsdd: int = 2) -> Path:
    """A sorted data dir of real recordings from the shared corpora (``corpus``: the conftest
    fixture): ``libri`` LibriSpeech test-clean utterances (16 kHz, 6-20 s), two per speaker, and
    ``fsdd`` FSDD digits (8 kHz, under 1 s: resampled), one per speaker.  Ids are speaker-prefixed."""
    from helpers.audio import write_data_dir_by_prefix

    entries: dict[str, str] = {}
    by_spk: dict[str, list[Path]] = {}
    for p in sorted(corpus("LIBRISPEECH").rglob("*.flac")):
        by_spk.setdefault(p.stem.split("-")[0], []).append(p)
    for p in [p for ps in by_spk.values() for p in ps[:2]][:libri]:
        entries[f"{p.stem.split('-')[0]}-{p.stem}"] = str(p)
    if fsdd:
        seen: set[str] = set()
        for p in sorted((corpus("FSDD") / "recordings").glob("*")):
            spk = p.stem.split("_")[1]
            if spk not in seen and len(seen) < fsdd:
                seen.add(spk)
                entries[f"{spk}-{p.stem}"] = str(p)
    return write_data_dir_by_prefix(out, entries)
