"""The diarization recipe's stages over a recording dir (``data/<set>``: wav.scp, rttm, uem,
reco2dur; :mod:`spkflow.diar.recordings`), files in and files out, one function per stage, each
called by one command of ``egs/TEMPLATE/diar1/diar.sh``:

* stage 2, :func:`make_windows` (``diar_windows``): a recording dir -> its speech regions
  (``speech/``: a data dir whose ``segments`` are the regions) and the sliding windows over them
  (``windows/``: the data dir stage 3 embeds with spk1's stage-5 script);
* stage 4, :func:`cluster_set` (``diar_cluster``): the windows' embeddings (``xvector.scp``) ->
  one RTTM for the set (:func:`spkflow.diar.pipeline.diarize_recording` per recording);
* stage 5, :func:`score_set` (``diar_score``): reference and hypothesis RTTMs -> ``scores.md``
  (per recording and total) and ``scores.json`` (:mod:`spkflow.diar.metrics`).

The same pipeline on audio files without a recipe: :mod:`spkflow.diar.file_list`.

A recording of the set without speech gets no turns and is named in the log; every output is
written atomically.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError
from spkflow.data.tables import read_kv, write_kv
from spkflow.diar.metrics import format_table, score_diarization
from spkflow.diar.overlap import add_second_speakers
from spkflow.diar.pipeline import DiarOptions, call_domain, diarize_recording
from spkflow.diar.recordings import RecordingSet, load_recordings
from spkflow.diar.regions import Regions, intersect, union
from spkflow.diar.rttm import Turn, read_rttm, turns_by_recording, write_rttm
from spkflow.diar.speech import SileroOptions, detect_speech
from spkflow.diar.windows import Window, plan_windows, read_window_dir, write_window_dir
from spkflow.score.model_scoring import Scoring
from spkflow.score.trial_scoring import read_embeddings

__all__ = [
    "cluster_set",
    "make_windows",
    "read_speech_dir",
    "score_set",
    "speech_regions",
    "write_reco2num_spk",
]

log = logging.getLogger(__name__)


def speech_regions(rs: RecordingSet, rec: str, method: str, silero: SileroOptions | None = None) -> Regions:
    """Speech regions of one recording of ``rs`` by ``method`` (inside its UEM when it has one);
    ``silero``: silero's rules (None: the library's)."""
    wave = None
    if method != "oracle":
        from spkflow.data.audio import load_audio

        wave = load_audio(rs.wav[rec], 16000, utt=rec, table=True)
    elif rs.turns is None:
        raise InputError(rs.path / "rttm", None, "no such file: oracle speech needs the reference turns")
    regions = detect_speech(
        method, wave, 16000, turns=(rs.turns or {}).get(rec, []), duration=rs.durations[rec], silero=silero
    )
    return intersect(regions, rs.scored(rec))


def make_windows(
    reco_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    speech: str = "oracle",
    window: float = 1.5,
    shift: float = 0.75,
    min_window: float = 0.5,
    silero: SileroOptions | None = None,
) -> dict[str, int]:
    """Write ``out_dir/speech`` and ``out_dir/windows`` for the recordings of ``reco_dir``;
    returns counts (recordings, without speech, regions, windows)."""
    rs = load_recordings(reco_dir, need_rttm=speech == "oracle")
    for note in rs.notes:
        log.info("%s", note)
    out = Path(out_dir)
    regions_seg: dict[str, str] = {}
    windows: list[Window] = []
    silent = []
    for rec in rs.recordings:
        regions = speech_regions(rs, rec, speech, silero)
        regions_seg.update(
            {f"{rec}-{round(s * 1000):08d}-{round(e * 1000):08d}": f"{rec} {s:.3f} {e:.3f}" for s, e in regions}
        )
        ws = plan_windows(rec, regions, window, shift, min_window)
        if not ws:
            silent.append(rec)
        windows += ws
    if silent:
        log.warning(
            "no speech (or none as long as %.2f s) in %d recording(s): %s: no turns",
            min_window,
            len(silent),
            " ".join(silent),
        )
    sp = out / "speech"
    sp.mkdir(parents=True, exist_ok=True)
    write_kv(sp / "wav.scp", rs.wav)
    write_kv(sp / "segments", regions_seg)
    write_kv(sp / "reco2dur", {k: f"{v:.3f}" for k, v in rs.durations.items()})
    if windows:
        write_window_dir(out / "windows", rs.wav, windows)
    return {"recordings": len(rs.wav), "silent": len(silent), "regions": len(regions_seg), "windows": len(windows)}


def read_speech_dir(speech_dir: str | os.PathLike[str]) -> tuple[list[str], dict[str, Regions]]:
    """(recordings, recording -> speech regions) of a ``speech/`` dir written by :func:`make_windows`."""
    d = Path(speech_dir)
    recs = list(read_kv(d / "wav.scp"))
    regions: dict[str, list[tuple[float, float]]] = {r: [] for r in recs}
    seg = d / "segments"
    if seg.is_file() and seg.stat().st_size:
        for n, (key, rest) in enumerate(read_kv(seg).items(), 1):
            f = rest.split()
            if len(f) != 3 or f[0] not in regions:
                raise InputError(seg, n, f"expected '<region> <recording of wav.scp> <start> <end>', got {key} {rest}")
            regions[f[0]].append((float(f[1]), float(f[2])))
    return recs, {r: union(v) for r, v in regions.items()}


def cluster_set(
    work_dir: str | os.PathLike[str],
    xvector_scp: str | os.PathLike[str] | None,
    out_rttm: str | os.PathLike[str],
    scoring: Scoring,
    opts: DiarOptions,
    num_speakers: Mapping[str, int] | None = None,
    overlap: Mapping[str, Regions] | None = None,
) -> dict[str, int]:
    """Cluster each recording of ``work_dir`` (``speech/`` and ``windows/`` of :func:`make_windows`)
    from the windows' embeddings in ``xvector_scp``; write all turns to ``out_rttm``.
    ``num_speakers``: a per-recording count (``reco2num_spk``) overriding ``opts.num_speakers``;
    ``opts.centre == "set"`` centres every recording on the windows of all of them when there are
    enough (:func:`~spkflow.diar.pipeline.call_domain`, the command's rule), else the training mean; ``overlap``:
    regions of overlapped speech per recording, given a second speaker
    (:func:`spkflow.diar.overlap.add_second_speakers`)."""
    recs, regions = read_speech_dir(Path(work_dir) / "speech")
    wdir = Path(work_dir) / "windows"
    by_rec = read_window_dir(wdir) if (wdir / "segments").is_file() else {}
    emb: Mapping[str, np.ndarray] = {}
    if by_rec:
        if xvector_scp is None:
            raise ValueError(f"{wdir}: windows but no embeddings (xvector.scp)")
        keys = [w.id for ws in by_rec.values() for w in ws]
        emb = read_embeddings(xvector_scp, keys)
    turns: list[Turn] = []
    counts = {"recordings": len(recs), "speakers": 0, "overlap_turns": 0}
    domain = None
    if opts.centre == "set":  # every window of the set, if enough: recordings like each one, no labels
        domain = call_domain(
            [
                np.stack([np.asarray(emb[w.id], dtype=np.float64).reshape(-1) for w in ws if w.id in emb])
                for ws in by_rec.values()
                if any(w.id in emb for w in ws)
            ]
        )
        if domain is None:
            opts = dataclasses.replace(opts, centre="none")
    for rec in recs:
        ws = by_rec.get(rec, [])
        if not ws:
            continue
        o = opts
        if num_speakers is not None and rec in num_speakers:
            o = dataclasses.replace(opts, num_speakers=num_speakers[rec])
        missing = [w for w in ws if w.id not in emb]
        if missing:  # left out by stage 5 (--skip-bad): their time takes the nearest window's label
            log.warning("%s: %d of %d windows have no embedding in %s", rec, len(missing), len(ws), xvector_scp)
            ws = [w for w in ws if w.id in emb]
            if not ws:
                continue
        x = np.stack([np.asarray(emb[w.id], dtype=np.float64).reshape(-1) for w in ws])
        t = diarize_recording(ws, x, regions[rec], scoring, o, domain)
        if overlap is not None and overlap.get(rec):
            n = len(t)
            t = add_second_speakers(t, overlap[rec])
            counts["overlap_turns"] += len(t) - n
        counts["speakers"] += len({u.speaker for u in t})
        turns += t
    write_rttm(out_rttm, turns)
    return counts


def score_set(
    reco_dir: str | os.PathLike[str],
    hyp_rttm: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    title: str = "",
    plot: str | None = None,
) -> dict[str, float]:
    """Score ``hyp_rttm`` against ``reco_dir``'s ``rttm`` (inside its ``uem``); write
    ``scores.md`` and ``scores.json`` into ``out_dir`` and, for the recording ``plot`` (``""``: the
    first), ``plot_<recording>.png``; returns the totals."""
    rs = load_recordings(reco_dir, need_rttm=True)
    hyp = read_rttm(hyp_rttm)
    for t, n in zip(hyp.turns, hyp.lines, strict=True):
        if t.recording not in rs.wav:
            raise InputError(hyp_rttm, n, f"recording {t.recording!r} is not in {rs.path / 'wav.scp'}")
    scores = score_diarization(rs.turns or {}, turns_by_recording(hyp.turns), {r: rs.scored(r) for r in rs.recordings})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    head = f"# {title}\n\n" if title else ""
    write_text_atomic(out / "scores.md", head + format_table(scores))
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in scores.total.items()}
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in scores.rows]
    write_text_atomic(out / "scores.json", json.dumps({"total": clean, "recordings": rows}, indent=1) + "\n")
    if plot is not None:
        from spkflow.diar.metrics import optimal_mapping
        from spkflow.diar.plots import plot_diarization

        rec = plot or rs.recordings[0]
        if rec not in rs.wav:
            raise InputError(rs.path / "wav.scp", None, f"no recording {rec!r} to plot")
        ref, hyp_t = (rs.turns or {}).get(rec, []), turns_by_recording(hyp.turns).get(rec, [])
        plot_diarization(out / f"plot_{rec}.png", ref, hyp_t, optimal_mapping(ref, hyp_t, rec), title=f"{rec}: {title}")
    return scores.total


def write_reco2num_spk(path: str | os.PathLike[str], rs: RecordingSet) -> None:
    """``recording count`` of the reference speakers (for oracle-count runs)."""
    if rs.turns is None:
        raise InputError(rs.path / "rttm", None, "no such file: the speaker counts come from the reference")
    write_kv(path, {r: str(len({t.speaker for t in v})) for r, v in rs.turns.items()})
