"""Offline augmentation sources written as Kaldi data dirs: simulated room impulse responses and
coloured noise (no network, no downloads: simulated or generated once, stored as FLAC).

What it guarantees
------------------
* :func:`simulate_rirs` draws ``num`` shoebox rooms (dimensions, RT60, source and microphone
  positions at least ``margin`` metres from every wall) from a generator seeded by ``seed`` and
  computes each RIR with pyroomacoustics' image-source model (order and wall absorption from
  Sabine's formula for the drawn RT60, as pyroomacoustics' ``inverse_sabine``): the same
  ``(num, seed, options)`` give the same RIRs.  Each RIR is normalised to a peak of 0.9 (the
  augmentation re-normalises to unit energy anyway) and starts at most ``pre_delay`` ms before its
  direct path (the propagation delay in front is cut).
* :func:`coloured_noise` makes white, pink (1/f power) or brown (1/f^2) noise by shaping a white
  Gaussian spectrum, normalised to an RMS of 0.1.
* :func:`write_source_dir` writes ``<out>/audio/<key>.flac`` (16-bit) and a data dir
  (``wav.scp`` with absolute paths, ``utt2spk`` (each key its own "speaker"), ``spk2utt``,
  ``utt2dur``, and ``info.txt`` with how it was made); the data dir files appear at once
  (atomic renames) after all audio is written, so an interrupted run leaves no half data dir and a
  rerun replaces it.

Anchors: Kaldi's RIRS_NOISES ``simulated_rirs`` (image method, rooms 1-30 m) and MUSAN noise, as
WeSpeaker/ESPnet recipes download them; here they are made locally (``docs/augmentation.md``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import soundfile as sf

from spkflow.core.atomic import write_text_atomic

__all__ = ["NOISE_COLOURS", "coloured_noise", "simulate_rirs", "write_source_dir"]

NOISE_COLOURS = {"white": 0.0, "pink": 1.0, "brown": 2.0}  # exponent of 1/f in the power spectrum


def coloured_noise(colour: str, num_samples: int, rng: np.random.Generator, sample_rate: int = 16000) -> np.ndarray:
    """``num_samples`` of ``colour`` noise (white | pink | brown), float32, RMS 0.1."""
    if colour not in NOISE_COLOURS:
        raise ValueError(f"noise colour must be one of {', '.join(NOISE_COLOURS)}, got {colour!r}")
    alpha = NOISE_COLOURS[colour]
    spec = np.fft.rfft(rng.standard_normal(num_samples))
    f = np.fft.rfftfreq(num_samples, 1.0 / sample_rate)
    f[0] = f[1] if len(f) > 1 else 1.0
    spec *= f ** (-alpha / 2.0)  # amplitude ~ f^(-alpha/2): power ~ 1/f^alpha
    spec[0] = 0.0
    x = np.fft.irfft(spec, n=num_samples)
    rms = float(np.sqrt(np.mean(x**2))) or 1.0
    return (0.1 * x / rms).astype(np.float32)


def simulate_rirs(
    num: int,
    seed: int = 0,
    sample_rate: int = 16000,
    rt60: tuple[float, float] = (0.2, 0.8),
    room_xy: tuple[float, float] = (3.0, 10.0),
    room_z: tuple[float, float] = (2.4, 4.0),
    margin: float = 0.5,
    pre_delay: float = 2.0,
) -> Iterable[tuple[str, np.ndarray, dict[str, float]]]:
    """Yield ``(key, rir float32, room parameters)`` for ``num`` random shoebox rooms."""
    import pyroomacoustics as pra

    rng = np.random.default_rng([int(seed), 0x726972])  # "rir"
    for i in range(num):
        dims = np.array([rng.uniform(*room_xy), rng.uniform(*room_xy), rng.uniform(*room_z)])
        t60 = float(rng.uniform(*rt60))
        src = rng.uniform(margin, dims - margin)
        mic = rng.uniform(margin, dims - margin)
        try:
            absorption, max_order = pra.inverse_sabine(t60, dims)
        except ValueError:  # a room too small for this RT60: the most reverberant it can be
            absorption, max_order = 0.01, 100
        room = pra.ShoeBox(
            dims, fs=sample_rate, materials=pra.Material(absorption), max_order=int(max_order), air_absorption=False
        )
        room.add_source(src.tolist())
        room.add_microphone(mic.tolist())
        room.compute_rir()
        h = np.asarray(room.rir[0][0], dtype=np.float64)
        peak = int(np.argmax(np.abs(h)))
        h = h[max(0, peak - int(pre_delay * sample_rate / 1000)) :]
        h = (0.9 * h / np.max(np.abs(h))).astype(np.float32)
        info = {
            "room_x": float(dims[0]),
            "room_y": float(dims[1]),
            "room_z": float(dims[2]),
            "rt60": t60,
            "distance": float(np.linalg.norm(src - mic)),
            "max_order": int(max_order),
        }
        yield f"rir{i:05d}", h, info


def write_source_dir(
    out: str | os.PathLike[str],
    items: Iterable[tuple[str, np.ndarray]],
    sample_rate: int,
    info: str = "",
) -> Path:
    """Write the audio of ``items`` as FLAC and a Kaldi data dir over it (see the module doc)."""
    out = Path(out).resolve()
    audio = out / "audio"
    audio.mkdir(parents=True, exist_ok=True)
    wav, dur = [], []
    for key, x in items:
        path = audio / f"{key}.flac"
        tmp = audio / f".{key}.tmp.flac"
        sf.write(tmp, np.clip(x, -1.0, 1.0), sample_rate, subtype="PCM_16", format="FLAC")
        os.replace(tmp, path)
        wav.append(f"{key} {path}\n")
        dur.append(f"{key} {len(x) / sample_rate:.4f}\n")
    if not wav:
        raise ValueError(f"{out}: nothing to write")
    order = sorted(range(len(wav)), key=lambda i: wav[i].split()[0].encode())
    keys = [wav[i].split()[0] for i in order]
    write_text_atomic(out / "utt2spk", "".join(f"{k} {k}\n" for k in keys))
    write_text_atomic(out / "spk2utt", "".join(f"{k} {k}\n" for k in keys))
    write_text_atomic(out / "utt2dur", "".join(dur[i] for i in order))
    if info:
        write_text_atomic(out / "info.txt", info if info.endswith("\n") else info + "\n")
    write_text_atomic(out / "wav.scp", "".join(wav[i] for i in order))  # last: the dir is complete
    return out


def noise_items(
    num: int, seconds: float, seed: int, sample_rate: int = 16000, colours: Iterable[str] = ("white", "pink", "brown")
) -> Iterable[tuple[str, np.ndarray]]:
    """``num`` noise recordings of ``seconds``, colours in turn, from a generator seeded by ``seed``."""
    colours = list(colours)
    rng = np.random.default_rng([int(seed), 0x6E6F6973])  # "nois"
    n = int(math.ceil(seconds * sample_rate))
    for i in range(num):
        c = colours[i % len(colours)]
        yield f"{c}{i:04d}", coloured_noise(c, n, rng, sample_rate)
