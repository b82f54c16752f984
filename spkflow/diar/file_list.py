"""Diarization of a list of audio files, for users without a recipe: the work behind ``python -m
spkflow.bin.diarize`` (:func:`diarize_files`: one ``OUT_DIR/<id>.rttm`` per file) and
``Embedder.diarize`` (:func:`diarize_file`: the turns of one file), through the pipeline and the
defaults of :mod:`spkflow.diar.pipeline`.  The embedder is passed in (an
:class:`~spkflow.api.Embedder`: its ``embed_batch`` and ``scoring``); nothing here calls back up.

Speech regions per file: a detector's (``energy``, ``silero``), the regions themselves (the API),
or oracle speech from an RTTM file (the turns of the recording of the file's id) or a folder of
``<id>.rttm`` files.

What it guarantees
------------------
* **Every input checked before any output is written**: each file exists, is a file (a folder
  is named as one) and has a readable audio header (its duration is read, nothing decoded); the
  recording ids; the speech regions given; a domain; the output folder.  A bad one is one line
  naming it, and nothing has been written.
* **RTTM-safe recording ids**: a file's recording id is its stem with every run of whitespace
  made ``_`` (:func:`~spkflow.diar.rttm.safe_id`: ``my meeting.flac`` -> ``my_meeting``, said in
  a log line); two files with one id are refused before any work.
* **Given speech inside its recording**: a turn of a speech RTTM ending more than
  :data:`~spkflow.diar.recordings.MAX_OVERSHOOT` s after the end of its recording is an error
  naming the file and line, as in a recording dir's ``rttm`` (within it: cut at the end); so is a
  given region (the API); an RTTM without any turn of a recording is an error, not silence (a
  misnamed recording would otherwise look like an empty one).
* **A user's files are never replaced**: an ``OUT_DIR/<id>.rttm`` that spkflow did not write (not
  listed in the folder's marker :data:`MARKER`) is refused before any work, naming it, unless
  ``overwrite``; the user's other files in ``OUT_DIR`` are never touched; one run at a time per
  folder (:mod:`spkflow.core.lock`); ``OUT_DIR`` an existing file is named as one.
* **Resumable**: each RTTM is written atomically as soon as its recording is done, and entered in
  the marker with a fingerprint of what made it (the model, the settings, the speech, the domain,
  the file's path, size and time).  A rerun keeps the RTTMs whose fingerprint matches (and says
  how many) and redoes the others.

pyannote.core's ``Annotation.write_rttm`` refuses a URI or label holding a space, and its
``Pipeline`` diarizes one file per call and leaves writing to the caller; here a list of files is
checked as a whole first, ids are made safe (and said), and a rerun resumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.core import lock
from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError, OutputError
from spkflow.data.audio import check_file, read_audio, spec_duration
from spkflow.deploy.decisions import domain_embeddings
from spkflow.deploy.gallery import embedder_stamp
from spkflow.diar.pipeline import Settings, diarize_recording, embed_windows
from spkflow.diar.recordings import MAX_OVERSHOOT
from spkflow.diar.regions import Regions, union
from spkflow.diar.rttm import Rttm, Turn, read_rttm, safe_id, write_rttm
from spkflow.diar.speech import DETECTORS

__all__ = ["MARKER", "Done", "FileRecording", "check_files", "check_out_dir", "diarize_file", "diarize_files"]

log = logging.getLogger(__name__)

#: the file in ``OUT_DIR`` that lists the RTTMs spkflow wrote there, each with its fingerprint
MARKER = ".spkflow-rttm"
_HEADER = "# written by spkflow (spkflow.diar.file_list): the RTTMs it wrote here, each with a fingerprint\n"
_PENDING = "-"


@dataclass(frozen=True)
class FileRecording:
    """One file to diarize, checked: ``path`` as given, its recording ``id``, ``duration`` (s)
    and its ``speech`` (a detector's name, or regions in seconds)."""

    path: str
    id: str
    duration: float
    speech: str | Regions


@dataclass(frozen=True)
class Done:
    """One RTTM of :func:`diarize_files`: its path, speakers and turns; ``kept``: finished by an
    earlier run with the same fingerprint, not redone."""

    rttm: Path
    speakers: int
    turns: int
    kept: bool = False


def _regions_of(src: str | os.PathLike[str], rttm: Rttm, rec: str, duration: float) -> Regions:
    spans = []
    for t, n in zip(rttm.turns, rttm.lines, strict=True):
        if t.recording != rec:
            continue
        if t.end > duration + MAX_OVERSHOOT:
            raise InputError(src, n, f"turn ends at {t.end:.3f} s, after the end of {rec!r} ({duration:.3f} s)")
        spans.append((t.start, min(t.end, duration)))
    if not spans:
        raise InputError(src, None, f"no turns of recording {rec!r} (the recording id is the file's stem)")
    return union(s for s in spans if s[1] > s[0])


def _given_regions(path: str, regions: Sequence[tuple[float, float]], duration: float) -> Regions:
    out = []
    for i, (s, e) in enumerate(regions, 1):
        s, e = float(s), float(e)
        if not (np.isfinite(s) and np.isfinite(e) and 0 <= s < e):
            raise InputError(path, None, f"speech region {i} ({s}, {e}): need 0 <= start < end")
        if e > duration + MAX_OVERSHOOT:
            raise InputError(path, None, f"speech region {i} ends at {e:.3f} s, after the end ({duration:.3f} s)")
        out.append((s, min(e, duration)))
    return union(r for r in out if r[1] > r[0])


def _speech_of(
    speech: str | Sequence[tuple[float, float]], rec: FileRecording, cache: dict[str, Rttm]
) -> str | Regions:
    if not isinstance(speech, str):
        return _given_regions(rec.path, speech, rec.duration)
    if speech in DETECTORS:
        if speech == "oracle":
            raise ValueError("--speech oracle: give the reference as an RTTM file or a folder of <id>.rttm")
        return speech
    p = Path(speech)
    if p.is_dir():
        f = p / f"{rec.id}.rttm"
        if not f.is_file():
            raise InputError(f, None, f"no such file: the speech regions of recording {rec.id!r}")
        return _regions_of(f, read_rttm(f), rec.id, rec.duration)
    if p.is_file():
        if speech not in cache:
            cache[speech] = read_rttm(p)
        return _regions_of(p, cache[speech], rec.id, rec.duration)
    raise InputError(
        p, None, f"--speech must be {', '.join(d for d in DETECTORS if d != 'oracle')}, an RTTM file or a folder"
    )


def check_files(
    files: Sequence[str | os.PathLike[str]], speech: str | Sequence[tuple[float, float]] = "energy"
) -> list[FileRecording]:
    """Every file checked (see the module doc), with its recording id, duration and speech; a
    renamed id is said in a log line.  Raises on the first bad input, before any output."""
    out: list[FileRecording] = []
    ids: dict[str, str] = {}
    cache: dict[str, Rttm] = {}
    for f in files:
        path = os.fspath(f)
        stem = Path(path).stem
        rid = safe_id(stem)
        check_file(path, rid)  # a path is a path: found, a regular file, readable (never a command)
        if rid in ids:
            raise InputError(path, None, f"same recording id {rid!r} as {ids[rid]}: their RTTMs would be one file")
        ids[rid] = path
        if rid != stem:
            log.info("%s: recording id %r (an RTTM field holds no whitespace)", path, rid)
        rec = FileRecording(path, rid, spec_duration(path, utt=rid), "")
        out.append(dataclasses.replace(rec, speech=_speech_of(speech, rec, cache)))
    return out


def _read_marker(out: Path) -> dict[str, str]:
    try:
        text = (out / MARKER).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}
    rows = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {r[0]: r[1] for r in rows if len(r) == 2}


def check_out_dir(out_dir: str | os.PathLike[str], ids: Sequence[str], *, overwrite: bool = False) -> dict[str, str]:
    """Refuse an ``out_dir`` that is a file, or whose ``<id>.rttm`` of one of ``ids`` spkflow did
    not write (unless ``overwrite``); returns the marker's ``name -> fingerprint``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(out, None, "exists and is a file, not a folder: give a folder for the RTTMs")
    written = _read_marker(out)
    for i in ids:
        if (out / f"{i}.rttm").is_dir():
            raise InputError(out / f"{i}.rttm", None, f"is a folder where the RTTM of recording {i!r} would go")
    foreign = [f"{i}.rttm" for i in ids if os.path.lexists(out / f"{i}.rttm") and f"{i}.rttm" not in written]
    if foreign and not overwrite:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InputError(
            out,
            None,
            f"holds {shown}, not written by spkflow (not in its {MARKER}); nothing was changed: choose another "
            "folder, move them, or pass --overwrite true (overwrite=True) to replace them",
        )
    return written


def _load_domain(embedder: Any, domain: Any) -> np.ndarray | None:
    if domain is None:
        return None
    if isinstance(domain, (str, os.PathLike)):
        domain = domain_embeddings(embedder, os.fspath(domain), progress=False)
    return np.atleast_2d(np.asarray(domain, dtype=np.float64))


def _fingerprint(stamp: str, settings: Settings, rec: FileRecording, domain: np.ndarray | None) -> str:
    st = os.stat(rec.path)
    what = {
        "model": stamp,
        "settings": dataclasses.asdict(settings),
        "speech": rec.speech,
        "domain": None if domain is None else hashlib.sha256(domain.tobytes()).hexdigest(),
        "file": [os.path.abspath(rec.path), st.st_size, st.st_mtime_ns],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _diarize(embedder: Any, rec: FileRecording, settings: Settings, domain: np.ndarray | None) -> list[Turn]:
    wave, rate = read_audio(rec.path, utt=rec.id)
    w = embed_windows(wave, rate, rec.id, embedder.embed_batch, speech=rec.speech, settings=settings)
    opts = settings.options(embedder.scoring, centred=domain is not None)
    return diarize_recording(w.windows, w.x, w.regions, embedder.scoring, opts, domain)


def diarize_file(
    embedder: Any,
    path: str | os.PathLike[str],
    *,
    speech: str | Sequence[tuple[float, float]] = "energy",
    settings: Settings | None = None,
    domain: Any = None,
) -> list[Turn]:
    """The turns of one file (``Embedder.diarize``): checked as :func:`diarize_files` checks each;
    ``speech`` as there, or the regions ``[(start, end), ...]`` in seconds; ``domain``: raw
    embeddings ``[M, D]`` of recordings like this one, or a path :func:`~spkflow.deploy.decisions.domain_embeddings`
    reads (a data dir, an embedding scp, a gallery); None: the training mean."""
    settings = settings or Settings()
    (rec,) = check_files([path], speech)
    return _diarize(embedder, rec, settings, _load_domain(embedder, domain))


def diarize_files(
    embedder: Any,
    files: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    speech: str = "energy",
    settings: Settings | None = None,
    domain: Any = None,
    overwrite: bool = False,
) -> list[Done]:
    """``out_dir/<id>.rttm`` for each file, in the order given (see the module doc: inputs
    checked first, a user's files kept, finished RTTMs of an earlier run kept)."""
    settings = settings or Settings()
    recs = check_files(files, speech)
    out = Path(out_dir)
    names = {r.id: f"{r.id}.rttm" for r in recs}
    check_out_dir(out, list(names), overwrite=overwrite)
    dom = _load_domain(embedder, domain)
    stamp = embedder_stamp(embedder)
    prints = {r.id: _fingerprint(stamp, settings, r, dom) for r in recs}
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(out, exc.strerror or str(exc)) from None
    done: list[Done] = []
    with lock.hold(out):
        written = check_out_dir(out, list(names), overwrite=overwrite)  # again, under the lock
        kept = {r.id for r in recs if written.get(names[r.id]) == prints[r.id] and (out / names[r.id]).is_file()}
        if kept:
            log.info(
                "%s: %d of %d RTTMs kept (an earlier run, the same model, settings and files)",
                out,
                len(kept),
                len(recs),
            )
        for r in recs:
            rttm = out / names[r.id]
            if r.id in kept:
                turns = read_rttm(rttm).turns
                done.append(Done(rttm, len({t.speaker for t in turns}), len(turns), kept=True))
                continue
            written[names[r.id]] = _PENDING  # ours from now on, unfinished until its fingerprint is in
            _write_marker(out, written)
            turns = _diarize(embedder, r, settings, dom)
            write_rttm(rttm, turns)
            written[names[r.id]] = prints[r.id]
            _write_marker(out, written)
            done.append(Done(rttm, len({t.speaker for t in turns}), len(turns)))
    return done


def _write_marker(out: Path, written: dict[str, str]) -> None:
    write_text_atomic(out / MARKER, _HEADER + "".join(f"{n} {p}\n" for n, p in sorted(written.items())))
