"""A data dir's durations and sample rates, from its tables and its files' headers, without
decoding a file (only a pipe or an ark entry is decoded, and only by :func:`utt2dur`).

* :func:`utt2dur` / :func:`write_utt2dur`: every utterance's seconds, as Kaldi's
  ``utils/data/get_utt2dur.sh`` writes them (6 significant digits, :func:`format_duration`);
* :func:`known_durations`: the seconds known without running anything, for planning work (job
  splits, batches by length): ``utt2dur``, else ``utt2num_frames``, else headers; never a pipe;
* :func:`native_rates`: the recordings' sample rates, from headers (a pipe's ``-ar N``).

Reading is :class:`spkflow.data.audio.AudioReader`'s; what these guarantee beyond it is that
nothing here runs a ``cmd |`` entry except :func:`utt2dur`, which must.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import soundfile as sf

from spkflow.core.errors import UtteranceError
from spkflow.data.audio import AudioReader, ark_location
from spkflow.data.pipes import is_pipe
from spkflow.data.tables import read_kv, write_kv

__all__ = ["format_duration", "known_durations", "native_rates", "utt2dur", "write_utt2dur"]


def format_duration(seconds: float) -> str:
    """Seconds as written to utt2dur: 6 significant digits, as Kaldi's ``wav-to-duration``."""
    return f"{seconds:.6g}"


def utt2dur(data_dir: str | os.PathLike[str], progress: bool = False) -> dict[str, float]:
    """Duration (seconds) of every utterance of a data dir, in file order.

    Files: from headers (no decoding).  Segments: ``end - start`` (``-1`` and overshoot resolved
    against the recording's header, looked up once per recording).  Pipes and ark entries: decoded.
    """
    reader = AudioReader(data_dir, sample_rate=None)
    keys: list[str] | Iterator[str] = reader.keys()
    if progress:
        from tqdm import tqdm

        keys = tqdm(keys, desc=f"utt2dur {data_dir}", unit="utt", mininterval=2.0)
    return {utt: reader.duration(utt) for utt in keys}


_PIPE_RE = re.compile(r"\|\s*(\[[^\]]*\])?\s*$")  # a "cmd |" entry, with or without segment times


def known_durations(data_dir: str | os.PathLike[str], utts: Iterable[str]) -> dict[str, float | None]:
    """Seconds per utterance where they are known without running anything, for planning work
    (job splits, length-sorted batches); None where they are not.

    From ``utt2dur``, else ``utt2num_frames`` (10 ms frames), else file headers / segment times
    (:meth:`AudioReader.duration`); never by running a ``cmd |`` pipe.  Errors are not reported
    here: the utterance is read later and fails there with its own message.
    """

    d = Path(data_dir)
    utts = list(utts)
    for name, scale in (("utt2dur", 1.0), ("utt2num_frames", 0.01)):
        if (d / name).is_file():
            table = read_kv(d / name)
            out: dict[str, float | None] = {}
            for u in utts:
                try:
                    out[u] = float(table[u].split()[0]) * scale
                except (KeyError, ValueError, IndexError):
                    out[u] = None
            return out
    reader = AudioReader(d, sample_rate=None)
    out = {}
    for u in utts:
        try:
            out[u] = None if _PIPE_RE.search(reader.source(u)) else reader.duration(u)
        except (UtteranceError, KeyError, OSError):
            out[u] = None
    return out


def write_utt2dur(data_dir: str | os.PathLike[str], progress: bool = False) -> Path:
    """Compute :func:`utt2dur` and write ``data_dir/utt2dur`` atomically (LC_ALL=C order)."""

    durs = utt2dur(data_dir, progress=progress)
    path = Path(data_dir) / "utt2dur"
    write_kv(path, [(k, format_duration(v)) for k, v in durs.items()])
    return path


_PIPE_RATE = re.compile(r"\s-ar\s+(\d+)\b")  # an ffmpeg / sox-style pipe's output rate


def native_rates(data_dir: str | os.PathLike[str], limit: int = 20000) -> tuple[dict[int, list[str]], int, int]:
    """Sample rates of a data dir's recordings, from file headers (no decoding): ``(rate ->
    recordings, number checked, number unknown)``.  A pipe counts at the rate its ``-ar N`` names
    (ffmpeg's, as ``narrowband_copy.py`` and the VoxCeleb2 recipe write), else as unknown; so does
    an unreadable header (the stages name it when they read it).  At most ``limit`` recordings,
    spread evenly over ``wav.scp``, are looked at."""
    wav = read_kv(Path(data_dir) / "wav.scp")
    keys = list(wav)
    if len(keys) > limit:
        keys = [keys[i * len(keys) // limit] for i in range(limit)]
    rates: dict[int, list[str]] = {}
    unknown = 0
    for key in keys:
        spec = wav[key].strip()
        rate: int | None = None
        if is_pipe(spec):
            m = _PIPE_RATE.search(spec)
            rate = int(m.group(1)) if m else None
        elif ark_location(spec) is None:
            try:
                rate = int(sf.info(os.fsencode(spec)).samplerate)
            except Exception:  # noqa: BLE001  (a missing or unreadable file is named when read)
                rate = None
        if rate is None:
            unknown += 1
        else:
            rates.setdefault(rate, []).append(key)
    return rates, len(keys), unknown
