"""Diarization of a list of audio files, for users without a recipe: the work behind ``python -m
spkflow.bin.diarize`` (:func:`diarize_files`: one ``OUT_DIR/<id>.rttm`` per file) and
``Embedder.diarize`` (:func:`diarize_file`: one file's :class:`~spkflow.diar.result.Diarization`),
through the pipeline and the defaults of :mod:`spkflow.diar.pipeline`; with a gallery
(``identify --save``), the speakers named by :mod:`spkflow.diar.naming`.  The embedder is passed in (an
:class:`~spkflow.api.Embedder`: its ``embed_batch`` and ``scoring``); nothing here calls back up.

Speech regions per file: a detector's (``silero``, ``energy``; the default
:data:`~spkflow.diar.speech.DEFAULT_DETECTOR`), the regions themselves (the API), or oracle speech
from an RTTM file (the turns of the recording of the file's id) or a folder of ``<id>.rttm`` files
(then also the reference of the plots, ``plot_dir``).

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
* **A user's files are never replaced**: an ``OUT_DIR/<id>.rttm`` (or a plot ``PLOT_DIR/<id>.png``)
  that spkflow did not write (not listed in the folder's marker :data:`MARKER`,
  :mod:`spkflow.diar.written`) is refused before any work, naming it, unless ``overwrite``; the
  user's other files in ``OUT_DIR`` are never touched; one run at a time per folder
  (:mod:`spkflow.core.lock`); ``OUT_DIR`` an existing file is named as one.
* **One centring for the call**: without a domain, every file's windows are embedded first and
  each file is clustered centred on the windows of all of them when there are enough
  (:func:`~spkflow.diar.pipeline.call_domain`: at least
  :data:`~spkflow.diar.pipeline.CENTRE_FROM`, else the training mean), said in one log line; the
  embeddings are kept in memory between the two passes (windows x dimension float64: 8 MB for an
  hour's 4,000 windows of 256 dimensions), the audio is not.
* **Resumable**: each RTTM is written atomically as soon as its recording is done, and entered in
  the marker with a fingerprint of what made it (the model, the settings, the speech, the domain
  or, without one, every file of the call, the gallery, the file's path, size and time).  A rerun
  keeps the RTTMs whose fingerprint matches (and says how many) and redoes the others.
* **Progress that moves** (``progress``): a bar over the recordings and, for a recording of a
  minute or more, one over its speech detection (seconds) and its windows (the windows are
  embedded :data:`~spkflow.diar.pipeline.EMBED_CHUNK` at a time, the bar moving after each);
  one log line per recording as it is written (speakers, turns, seconds of speech, seconds taken).

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
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.core.errors import InputError
from spkflow.data.audio import check_file, read_audio, spec_duration
from spkflow.deploy.decisions import domain_embeddings
from spkflow.deploy.gallery import Gallery, embedder_stamp
from spkflow.diar.naming import Naming, name_clusters
from spkflow.diar.pipeline import Settings, Windowed, call_domain, diarize_recording, embed_windows
from spkflow.diar.recordings import MAX_OVERSHOOT
from spkflow.diar.regions import Regions, union
from spkflow.diar.result import Diarization
from spkflow.diar.rttm import Rttm, Turn, read_rttm, safe_id, write_rttm
from spkflow.diar.speech import DEFAULT_DETECTOR, DETECTORS
from spkflow.diar.written import MARKER, PENDING, holding, refuse_foreign, write_marker

__all__ = [
    "LONG_RECORDING",
    "MARKER",
    "Done",
    "FileRecording",
    "check_files",
    "check_out_dir",
    "diarize_file",
    "diarize_files",
]

log = logging.getLogger(__name__)

#: a recording at least this long (s) gets its own progress bar (speech detection, then windows)
LONG_RECORDING = 60.0


@dataclass(frozen=True)
class FileRecording:
    """One file to diarize, checked: ``path`` as given, its recording ``id``, ``duration`` (s),
    its ``speech`` (a detector's name, or regions in seconds) and, when the speech came from an
    RTTM, that RTTM's turns of the recording (``reference``, for the plots)."""

    path: str
    id: str
    duration: float
    speech: str | Regions
    reference: tuple[Turn, ...] | None = None


@dataclass(frozen=True)
class Done:
    """One RTTM of :func:`diarize_files`: its path, speakers, turns, seconds of speech and seconds
    taken; ``kept``: finished by an earlier run with the same fingerprint, not redone; ``names``:
    how each cluster was named (with a gallery)."""

    rttm: Path
    speakers: int
    turns: int
    speech: float = 0.0
    seconds: float = 0.0
    kept: bool = False
    names: tuple[Naming, ...] = ()


def _turns_of(src: str | os.PathLike[str], rttm: Rttm, rec: str, duration: float) -> list[Turn]:
    out = []
    for t, n in zip(rttm.turns, rttm.lines, strict=True):
        if t.recording != rec:
            continue
        if t.end > duration + MAX_OVERSHOOT:
            raise InputError(src, n, f"turn ends at {t.end:.3f} s, after the end of {rec!r} ({duration:.3f} s)")
        if min(t.end, duration) > t.start:
            out.append(t._replace(end=min(t.end, duration)))
    if not out:
        raise InputError(src, None, f"no turns of recording {rec!r} (the recording id is the file's stem)")
    return out


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


def _with_speech(
    speech: str | Sequence[tuple[float, float]], rec: FileRecording, cache: dict[str, Rttm]
) -> FileRecording:
    if not isinstance(speech, str):
        return dataclasses.replace(rec, speech=_given_regions(rec.path, speech, rec.duration))
    if speech in DETECTORS:
        if speech == "oracle":
            raise ValueError("--speech oracle: give the reference as an RTTM file or a folder of <id>.rttm")
        return dataclasses.replace(rec, speech=speech)
    p = Path(speech)
    if p.is_dir():
        f = p / f"{rec.id}.rttm"
        if not f.is_file():
            raise InputError(f, None, f"no such file: the speech regions of recording {rec.id!r}")
        turns = _turns_of(f, read_rttm(f), rec.id, rec.duration)
    elif p.is_file():
        if speech not in cache:
            cache[speech] = read_rttm(p)
        turns = _turns_of(p, cache[speech], rec.id, rec.duration)
    else:
        raise InputError(
            p, None, f"--speech must be {', '.join(d for d in DETECTORS if d != 'oracle')}, an RTTM file or a folder"
        )
    return dataclasses.replace(rec, speech=union((t.start, t.end) for t in turns), reference=tuple(turns))


def check_files(
    files: Sequence[str | os.PathLike[str]], speech: str | Sequence[tuple[float, float]] = DEFAULT_DETECTOR
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
        out.append(_with_speech(speech, FileRecording(path, rid, spec_duration(path, utt=rid), ""), cache))
    return out


def check_out_dir(out_dir: str | os.PathLike[str], ids: Sequence[str], *, overwrite: bool = False) -> dict[str, str]:
    """Refuse an ``out_dir`` that is a file, or whose ``<id>.rttm`` of one of ``ids`` spkflow did
    not write (unless ``overwrite``); returns the marker's ``name -> fingerprint``."""
    return refuse_foreign(out_dir, [f"{i}.rttm" for i in ids], overwrite=overwrite)


def _load_domain(embedder: Any, domain: Any) -> np.ndarray | None:
    if domain is None:
        return None
    if isinstance(domain, (str, os.PathLike)):
        domain = domain_embeddings(embedder, os.fspath(domain), progress=False)
    return np.atleast_2d(np.asarray(domain, dtype=np.float64))


def _load_gallery(embedder: Any, gallery: Any) -> Gallery | None:
    if gallery is None or isinstance(gallery, Gallery):
        return gallery
    g = Gallery.load(os.fspath(gallery), embedder_stamp(embedder))
    if embedder.scoring.calibration is None:
        raise InputError(gallery, None, "naming speakers needs the model's calibration (scoring.yaml): it has none")
    return g


def _digest(a: np.ndarray | None, *more: Any) -> str | None:
    if a is None:
        return None
    return hashlib.sha256(a.tobytes() + json.dumps(more).encode()).hexdigest()


def _identity(rec: FileRecording) -> list[Any]:
    st = os.stat(rec.path)
    return [os.path.abspath(rec.path), st.st_size, st.st_mtime_ns]


def _call_key(recs: Sequence[FileRecording]) -> str:
    """What a call's own centring depends on: every file of it and its speech."""
    what = sorted([*_identity(r), r.speech] for r in recs)
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


def _fingerprint(
    stamp: str,
    settings: Settings,
    rec: FileRecording,
    domain: np.ndarray | None,
    gallery: Gallery | None,
    call: str | None = None,
) -> str:
    what = {
        "model": stamp,
        "settings": dataclasses.asdict(settings),
        "speech": rec.speech,
        "domain": _digest(domain),
        "call": call,
        "gallery": None if gallery is None else _digest(gallery.emb, gallery.speakers, gallery.speech.tolist()),
        "file": _identity(rec),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


class _Bars:
    """The progress bars of a run (tqdm, on standard error): recordings, and the stage of a long one."""

    def __init__(self, total: int, progress: bool) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self.on = progress
        self.recs = tqdm(total=total, desc="diarizing", unit="rec", file=sys.stderr, disable=not progress or total < 2)
        self.rec: Any = None

    @contextmanager
    def recording(self, rec: FileRecording) -> Iterator[dict[str, Any]]:
        """Callbacks for :func:`~spkflow.diar.pipeline.embed_windows` (none for a short recording)."""
        if not self.on or rec.duration < LONG_RECORDING:
            yield {}
            return
        bar = self._tqdm(
            total=round(rec.duration), desc=f"{rec.id}: speech", unit="s", file=sys.stderr, leave=False, position=1
        )

        def on_speech(seconds: float) -> None:
            if int(seconds) > bar.n:
                bar.update(int(seconds) - bar.n)

        def on_windows(done: int, total: int) -> None:
            if done == 0:
                bar.reset(total=total)
                bar.set_description(f"{rec.id}: windows")
                bar.unit = "win"
            bar.update(done - bar.n)

        try:
            yield {"on_speech": on_speech if isinstance(rec.speech, str) else None, "on_windows": on_windows}
        finally:
            bar.close()

    def close(self) -> None:
        self.recs.close()


def _embed(embedder: Any, rec: FileRecording, settings: Settings, callbacks: dict[str, Any] | None = None) -> Windowed:
    wave, rate = read_audio(rec.path, utt=rec.id)
    return embed_windows(
        wave, rate, rec.id, embedder.embed_batch, speech=rec.speech, settings=settings, **(callbacks or {})
    )


def _cluster(
    embedder: Any,
    w: Windowed,
    settings: Settings,
    centre: np.ndarray | None,
    domain: np.ndarray | None,
    gallery: Gallery | None,
) -> tuple[Diarization, list[Naming]]:
    """``centre``: what :func:`~spkflow.diar.pipeline.call_domain` chose (None: the training mean);
    ``domain``: the user's, for naming."""
    opts = settings.options(embedder.scoring, centred=centre is not None)
    d = Diarization.of(w.recording, diarize_recording(w.windows, w.x, w.regions, embedder.scoring, opts, centre))
    if gallery is None:
        return d, []
    return name_clusters(d, w.windows, w.x, embedder.scoring, gallery, domain=domain)


def diarize_file(
    embedder: Any,
    path: str | os.PathLike[str],
    *,
    speech: str | Sequence[tuple[float, float]] = DEFAULT_DETECTOR,
    settings: Settings | None = None,
    domain: Any = None,
    gallery: Any = None,
    progress: bool = False,
) -> Diarization:
    """One file's :class:`~spkflow.diar.result.Diarization` (``Embedder.diarize``): checked as
    :func:`diarize_files` checks each; ``speech`` as there, or the regions ``[(start, end), ...]``
    in seconds; ``domain``: raw embeddings ``[M, D]`` of recordings like this one, or a path
    :func:`~spkflow.deploy.decisions.domain_embeddings` reads (a data dir, an embedding scp, a
    gallery); None: the training mean; ``gallery``: a :class:`~spkflow.deploy.gallery.Gallery`
    or its file, to name the speakers by (:mod:`spkflow.diar.naming`)."""
    settings = settings or Settings()
    (rec,) = check_files([path], speech)
    g = _load_gallery(embedder, gallery)
    dom = _load_domain(embedder, domain)
    bars = _Bars(1, progress)
    with bars.recording(rec) as cb:
        w = _embed(embedder, rec, settings, cb)
    bars.close()
    d, names = _cluster(embedder, w, settings, call_domain([w.x], dom), dom, g)
    for n in names:
        log.debug("%s: %s named %s (best %s, LLR %s)", rec.id, n.cluster, n.name, n.candidate, n.llr)
    return d


def _plot(path: Path, rec: FileRecording, d: Diarization) -> None:
    from spkflow.diar.plots import plot_diarization

    ref = list(rec.reference) if rec.reference is not None else None
    mapping = None
    if ref:
        from spkflow.diar.metrics import optimal_mapping

        mapping = optimal_mapping(ref, list(d.turns), rec.id)
    what = "reference against hypothesis" if ref else "hypothesis"
    plot_diarization(path, ref, list(d.turns), mapping, title=f"{rec.id}: {what}")


def diarize_files(
    embedder: Any,
    files: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    speech: str = DEFAULT_DETECTOR,
    settings: Settings | None = None,
    domain: Any = None,
    gallery: Any = None,
    overwrite: bool = False,
    plot_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    on_done: Callable[[Done], None] | None = None,
) -> list[Done]:
    """``out_dir/<id>.rttm`` for each file, in the order given (see the module doc: inputs
    checked first, a user's files kept, finished RTTMs of an earlier run kept), and with
    ``plot_dir`` a timeline ``plot_dir/<id>.png`` each (against the reference when ``speech`` is
    an RTTM); ``gallery``: the speakers named by it; ``on_done``: called with each :class:`Done`
    as its RTTM is in place."""
    settings = settings or Settings()
    recs = check_files(files, speech)
    out = Path(out_dir)
    names = {r.id: f"{r.id}.rttm" for r in recs}
    plots = {r.id: f"{r.id}.png" for r in recs}
    pdir = Path(plot_dir) if plot_dir is not None else None
    same = pdir is not None and pdir.resolve() == out.resolve()
    check_out_dir(out, list(names), overwrite=overwrite)
    if pdir is not None:
        refuse_foreign(pdir, list(plots.values()), overwrite=overwrite)
    g = _load_gallery(embedder, gallery)
    dom = _load_domain(embedder, domain)
    stamp = embedder_stamp(embedder)
    call = _call_key(recs) if dom is None else None
    prints = {r.id: _fingerprint(stamp, settings, r, dom, g, call) for r in recs}
    done: list[Done] = []
    bars = _Bars(len(recs), progress)
    windowed: dict[str, Windowed] = {}  # the first pass: every window embedded (windows x dim floats)
    took: dict[str, float] = {}
    with holding(out, [*names.values(), *(plots.values() if same else [])], overwrite=overwrite) as written:
        with _plot_folder(pdir, list(plots.values()), overwrite, same, written) as pwritten:
            kept = {r.id for r in recs if written.get(names[r.id]) == prints[r.id] and (out / names[r.id]).is_file()}
            if kept:
                log.info(
                    "%s: %d of %d RTTMs kept (an earlier run, the same model, settings and files)",
                    out,
                    len(kept),
                    len(recs),
                )
            centre = dom
            if len(kept) < len(recs):  # without a domain, the call's centring needs every file's windows
                for r in recs if dom is None else [r for r in recs if r.id not in kept]:
                    t0 = time.monotonic()
                    with bars.recording(r) as cb:
                        windowed[r.id] = _embed(embedder, r, settings, cb)
                    took[r.id] = time.monotonic() - t0
                    bars.recs.update(1)
                centre = call_domain([w.x for w in windowed.values()], dom)
            for r in recs:
                rttm = out / names[r.id]
                t0 = time.monotonic() - took.get(r.id, 0.0)
                if r.id in kept:
                    d = Diarization.from_rttm(rttm, r.id)
                    found: list[Naming] = []
                else:
                    written[names[r.id]] = PENDING  # ours from now on, unfinished until its fingerprint is in
                    write_marker(out, written)
                    d, found = _cluster(embedder, windowed.pop(r.id), settings, centre, dom, g)
                    write_rttm(rttm, d.turns)
                    written[names[r.id]] = prints[r.id]
                    write_marker(out, written)
                if (
                    pdir is not None
                    and pwritten is not None
                    and (
                        r.id not in kept
                        or pwritten.get(plots[r.id]) != prints[r.id]
                        or not (pdir / plots[r.id]).is_file()
                    )
                ):
                    pwritten[plots[r.id]] = PENDING
                    write_marker(pdir, pwritten)
                    _plot(pdir / plots[r.id], r, d)
                    pwritten[plots[r.id]] = prints[r.id]
                    write_marker(pdir, pwritten)
                item = Done(rttm, len(d.speakers), len(d), d.speech, time.monotonic() - t0, r.id in kept, tuple(found))
                done.append(item)
                _log_done(item)
                if on_done is not None:
                    on_done(item)
                if r.id not in took:
                    bars.recs.update(1)
    bars.close()
    return done


def _log_done(d: Done) -> None:
    named = ""
    if d.names:
        known = [n.name for n in d.names if not n.name.startswith("unknown_")]
        named = f"; named: {', '.join(known) or 'none'} ({len(d.names) - len(known)} unknown)"
    log.info(
        "%s: %d speakers, %d turns, %.1f s of speech, %s%s",
        d.rttm,
        d.speakers,
        d.turns,
        d.speech,
        "kept (an earlier run)" if d.kept else f"{d.seconds:.1f} s taken",
        named,
    )


@contextmanager
def _plot_folder(
    pdir: Path | None, names: list[str], overwrite: bool, same: bool, written: dict[str, str]
) -> Iterator[dict[str, str] | None]:
    if pdir is None:
        yield None
    elif same:
        yield written
    else:
        with holding(pdir, names, overwrite=overwrite) as pwritten:
            yield pwritten
