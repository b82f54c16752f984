"""Diarization of a list of audio files, for users without a recipe (``python -m
spkflow.bin.diarize``): the recording id of a file is its stem, the output ``OUT_DIR/<stem>.rttm``.

Speech regions per file: a detector's (``energy``, ``silero``), or oracle speech from ``--speech``
naming an RTTM file (the turns of the recording named like the file's stem; an RTTM without any
turn of that recording is an error, not silence, since a misnamed recording would otherwise look
like an empty one) or a folder holding ``<stem>.rttm`` per file.  Two files with one stem are
refused before any work (their outputs would overwrite each other).  Each RTTM is written
atomically as soon as its recording is done, so an interrupted run keeps the finished ones.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spkflow.core.errors import InputError
from spkflow.diar.regions import Regions, union
from spkflow.diar.rttm import Turn, read_rttm, write_rttm
from spkflow.diar.speech import DETECTORS

__all__ = ["diarize_files", "speech_for"]


def speech_for(speech: str, stem: str, cache: dict[str, Any]) -> str | Regions:
    """The ``speech`` argument of ``Embedder.diarize`` for the file of ``stem``."""
    if speech in DETECTORS:
        if speech == "oracle":
            raise ValueError("--speech oracle: give the reference as an RTTM file or a folder of <stem>.rttm")
        return speech
    p = Path(speech)
    if p.is_dir():
        f = p / f"{stem}.rttm"
        if not f.is_file():
            raise InputError(f, None, f"no such file: the speech regions of recording {stem!r}")
        turns = read_rttm(f).turns
    elif p.is_file():
        if "rttm" not in cache:
            cache["rttm"] = read_rttm(p).turns
        turns = [t for t in cache["rttm"] if t.recording == stem]
        if not turns:
            raise InputError(p, None, f"no turns of recording {stem!r} (the recording id is the file's stem)")
    else:
        raise InputError(
            p, None, f"--speech must be {', '.join(d for d in DETECTORS if d != 'oracle')}, an RTTM file or a folder"
        )
    return union((t.start, t.end) for t in turns if t.recording == stem)


def diarize_files(
    diarize: Callable[..., list[Turn]],
    files: Sequence[str | os.PathLike[str]],
    out_dir: Path,
    *,
    speech: str = "energy",
    **opts: Any,
) -> list[tuple[Path, int, int]]:
    """``diarize(path, speech=..., **opts)`` for each file, ``out_dir/<stem>.rttm`` written;
    returns (rttm, speakers, turns) per file."""
    stems: dict[str, str] = {}
    for f in files:
        stem = Path(f).stem
        if stem in stems:
            raise InputError(f, None, f"same recording id {stem!r} (the file's stem) as {stems[stem]}")
        stems[stem] = os.fspath(f)
    cache: dict[str, Any] = {}
    plan = [(f, speech_for(speech, Path(f).stem, cache)) for f in files]
    out_dir.mkdir(parents=True, exist_ok=True)
    done = []
    for f, sp in plan:
        turns = diarize(f, speech=sp, **opts)
        out = out_dir / f"{Path(f).stem}.rttm"
        write_rttm(out, turns)
        done.append((out, len({t.speaker for t in turns}), len(turns)))
    return done
