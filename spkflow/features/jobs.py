"""Stage 2 jobs: extract fbank + VAD into arks, merge (on the toolkit of :mod:`spkflow.data.jobs`).

``scripts/feats/make_fbank.sh`` drives three steps, each a thin front end in ``spkflow/bin``:

1. :func:`spkflow.data.jobs.write_split` (``split_by_duration``): utterances in data-dir order, cut
   into ``nj`` consecutive parts of about equal total audio duration.
2. :func:`extract_job` (``compute_fbank``): one job reads its utterances through
   :class:`spkflow.data.audio.AudioReader`, computes fbank (:func:`spkflow.features.fbank.compute_fbank`),
   energy VAD and per-utterance CMVN statistics, and writes kaldiio arks
   ``data/{raw_fbank,vad,cmvn_utt,cmvn_utt_voiced}_<name>.<job>.ark``, their scps and the
   stamp of its options (:func:`fbank_stamp`).
3. :func:`merge_jobs` (``merge_fbank``): checks that every utterance of the data dir is in
   exactly one job's ``feats.scp`` or ``bad_utts`` and that every job used the merge's options,
   and writes ``feats.scp``, ``vad.scp``, ``utt2num_frames``, ``cmvn_utt*.scp`` and
   ``bad_utts`` in the data dir's ``LC_ALL=C`` order.

Guarantees
----------
* Nothing complete-looking when incomplete: a job deletes its own stale scps first, writes the
  arks, then each scp atomically (feats scp last); a job that fails (a bad utterance, a full
  disk) removes what it wrote; the merge refuses to run with a job's scp missing and writes
  all its outputs or none (:class:`spkflow.data.jobs.StagedOutputs`).  A full disk is one line
  naming the file.
* One configuration per output dir: the merge refuses jobs whose fbank/VAD/compression stamp
  differs from its own, naming them; ``make_fbank.sh`` holds the output dir's lock
  (:mod:`spkflow.core.lock`), so a second run into the same dir is refused, naming the first.
* Bad audio (missing, empty, corrupt, shorter than one frame, a rate we refuse to resample)
  fails the job with an ``ERROR`` line naming the utterance and the reason; with
  ``skip_bad`` the utterance is left out, logged as ``WARNING`` and listed with its reason in
  ``bad_utts``, and the copied data dir is filtered to match, so ``utt2spk``/``spk2utt``
  agree with ``feats.scp``.  Never a silent hole.
* ``cmvn_utt.scp`` holds Kaldi CMVN statistics (``compute-cmvn-stats`` format: a 2 x (F+1)
  double matrix of sums, sums of squares and the count) per utterance over all frames;
  ``cmvn_utt_voiced.scp`` the same over voiced frames (``--weights`` = VAD; all frames when no
  frame is voiced, as :func:`spkflow.features.fbank.select_voiced`).  The loader takes the
  per-utterance mean from them without reading whole utterances.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.audio import AudioReader
from spkflow.data.jobs import (
    ArkWriter,
    MergeError,
    StagedOutputs,
    check_stamps,
    log_line,
    read_list,
    read_stamp,
    write_split,
    write_stamp,
    writing,
)
from spkflow.data.tables import c_key, format_kv, read_kv, read_kv_lines, read_spk2utt, write_kv
from spkflow.features.fbank import FbankOptions, check_resample_rate, compute_fbank
from spkflow.features.vad import VadOptions, compute_vad

__all__ = [
    "write_split",
    "job_paths",
    "fbank_stamp",
    "extract_job",
    "merge_jobs",
    "filter_data_dir",
    "JobSummary",
    "OUTPUT_KINDS",
]

#: ark kinds a job writes, in the order their scps are written (feats last).
OUTPUT_KINDS = ("vad", "cmvn_utt", "cmvn_utt_voiced", "raw_fbank")
#: merged scp name per kind
MERGED_NAME = {
    "raw_fbank": "feats.scp",
    "vad": "vad.scp",
    "cmvn_utt": "cmvn_utt.scp",
    "cmvn_utt_voiced": "cmvn_utt_voiced.scp",
}
#: every file the merge writes in the output dir, feats.scp (the mark of completion) last
MERGED_FILES = ("bad_utts", "utt2num_frames", *(MERGED_NAME[k] for k in OUTPUT_KINDS))
#: Kaldi CompressionMethod used by ``compress=True`` unless told otherwise: kTwoByteAuto (3), a
#: linear 16-bit code over the matrix's range, row-major: half the size of float32, error at most
#: range / 131070 (about 3e-4 on log-mel), and the loader decodes just a crop's rows with one
#: multiply-add.  Kaldi's own default (copy-feats --compress=true: kAutomaticMethod, 1, i.e. the
#: 1-byte per-column "CM" code) is a quarter of the size but about 1% of each bin's range off,
#: and decoding a crop costs about 10x more; pass 1 (or 2) to get it.
DEFAULT_COMPRESSION_METHOD = 3
COMPRESSION_METHODS = {1: "kAutomaticMethod", 2: "kSpeechFeature", 3: "kTwoByteAuto", 5: "kOneByteAuto"}


# --------------------------------------------------------------------------- extraction


def job_paths(ark_dir: str | os.PathLike[str], name: str, job: int | str, kind: str) -> tuple[Path, Path]:
    """(ark, scp) of one output kind of one job."""
    base = Path(ark_dir) / f"{kind}_{name}.{job}"
    return base.with_name(base.name + ".ark"), base.with_name(base.name + ".scp")


def _stamp_path(ark_dir: str | os.PathLike[str], name: str, job: int | str) -> Path:
    return Path(ark_dir) / f"stamp_{name}.{job}"


def fbank_stamp(fbank_opts: FbankOptions, vad_opts: VadOptions, compress: bool, compression_method: int) -> str:
    """One line naming every option that shapes a job's outputs (compared by the merge)."""
    fb = " ".join(fbank_opts.to_kaldi_conf().split())
    vad = " ".join(vad_opts.to_kaldi_conf().split())
    return f"fbank: {fb} | vad: {vad} | compression: {compression_method if compress else 'none'}"


@dataclass
class JobSummary:
    num_done: int = 0
    num_bad: int = 0
    audio_seconds: float = 0.0
    wall_seconds: float = 0.0
    voiced_frames: int = 0
    frames: int = 0


def _cmvn_stats(feats: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Kaldi ``compute-cmvn-stats`` matrix [2, F+1] (float64): sums | count ; sums of squares | 0."""
    x = feats.astype(np.float64)
    if weights is not None:
        w = weights.astype(np.float64)
        if w.sum() <= 0:
            w = np.ones(len(x))
    else:
        w = np.ones(len(x))
    stats = np.zeros((2, x.shape[1] + 1), dtype=np.float64)
    stats[0, :-1] = w @ x
    stats[1, :-1] = w @ (x * x)
    stats[0, -1] = w.sum()
    return stats


def _write_table(path: Path, pairs: list[tuple[str, str]]) -> None:
    with writing(path), atomic_write(path, "wb", encoding=None) as f:
        f.write("".join(format_kv(k, v) for k, v in pairs).encode("utf-8", "surrogateescape"))


def extract_job(
    data_dir: str | os.PathLike[str],
    utt_list: str | os.PathLike[str],
    ark_dir: str | os.PathLike[str],
    name: str,
    job: int | str,
    fbank_opts: FbankOptions,
    vad_opts: VadOptions,
    compress: bool = False,
    skip_bad: bool = False,
    progress: bool = True,
    compression_method: int = DEFAULT_COMPRESSION_METHOD,
) -> JobSummary:
    """Extract fbank, VAD and CMVN stats for the utterances in ``utt_list`` (one id per line).

    Writes, for each kind in :data:`OUTPUT_KINDS`, ``ark_dir/<kind>_<name>.<job>.{ark,scp}``,
    plus ``utt2num_frames_<name>.<job>``, ``bad_utts_<name>.<job>`` (empty unless
    ``skip_bad``) and ``stamp_<name>.<job>`` (:func:`fbank_stamp`).  Raises
    :class:`UtteranceError` on the first bad utterance unless ``skip_bad``, and
    :class:`~spkflow.core.errors.OutputError` naming the file on a full disk; a failed job removes
    what it wrote.  ``compress``: feature matrices Kaldi-compressed with ``compression_method``
    (see :data:`DEFAULT_COMPRESSION_METHOD`).
    """
    if compress and compression_method not in COMPRESSION_METHODS:
        raise ValueError(f"compression method must be one of {COMPRESSION_METHODS}, got {compression_method}")

    ark_dir = Path(ark_dir)
    ark_dir.mkdir(parents=True, exist_ok=True)
    aux = {k: ark_dir / f"{k}_{name}.{job}" for k in ("utt2num_frames", "bad_utts")}
    aux["stamp"] = _stamp_path(ark_dir, name, job)
    outputs = [job_paths(ark_dir, name, job, kind)[1] for kind in OUTPUT_KINDS] + list(aux.values())
    # Stale results of an earlier run must not survive a crash of this one.
    for p in outputs:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    try:
        return _extract(
            data_dir, utt_list, ark_dir, name, job, fbank_opts, vad_opts, compress, skip_bad, progress,
            compression_method, aux,
        )  # fmt: skip
    except BaseException:
        # nothing half-written stays: no scp (the mark of a finished job), no ark tail
        for p in outputs + [job_paths(ark_dir, name, job, kind)[0] for kind in OUTPUT_KINDS]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        raise


def _extract(
    data_dir: str | os.PathLike[str],
    utt_list: str | os.PathLike[str],
    ark_dir: Path,
    name: str,
    job: int | str,
    fbank_opts: FbankOptions,
    vad_opts: VadOptions,
    compress: bool,
    skip_bad: bool,
    progress: bool,
    compression_method: int,
    aux: dict[str, Path],
) -> JobSummary:

    utts = read_list(utt_list)
    reader = AudioReader(data_dir, sample_rate=None)
    target = int(fbank_opts.sample_frequency)
    method = compression_method if compress else None
    writers = {
        k: ArkWriter(
            job_paths(ark_dir, name, job, k)[0],
            compression_method=method if k == "raw_fbank" else None,
            scp_path=os.path.abspath(job_paths(ark_dir, name, job, k)[0]),
        )
        for k in OUTPUT_KINDS
    }
    entries: dict[str, list[tuple[str, str]]] = {k: [] for k in OUTPUT_KINDS}
    nframes: list[tuple[str, str]] = []
    bad: list[tuple[str, str]] = []
    summary = JobSummary()
    t0 = time.perf_counter()
    it = utts
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        it = tqdm(utts, desc=f"fbank {name}.{job}", unit="utt", mininterval=1.0, file=sys.stderr)
    last_report, log_lines = t0, progress and isinstance(it, list)
    try:
        for n, utt in enumerate(it):
            if log_lines and time.perf_counter() - last_report > 60:
                last_report = time.perf_counter()  # a log file gets one plain line a minute, not a bar
                log_line(
                    f"progress: {n}/{len(utts)} utterances, {summary.audio_seconds:.0f} s of audio, "
                    f"{last_report - t0:.0f} s"
                )
            if utt not in reader:
                raise InputError(
                    utt_list,
                    None,
                    f"utterance '{utt}' is not in {Path(data_dir) / 'wav.scp'}"
                    f"{' / segments' if (Path(data_dir) / 'segments').is_file() else ''}",
                )
            try:
                wave, rate = reader.read_native(utt)
                try:
                    check_resample_rate(rate, target)
                    feats = compute_fbank(wave, rate, fbank_opts)
                except (ValueError, MemoryError) as exc:
                    raise UtteranceError(utt, reader.source(utt), str(exc)) from exc
            except UtteranceError as exc:
                if not skip_bad:
                    log_line(f"ERROR: {exc}")
                    log_line("ERROR: rerun with --skip-bad true to leave bad utterances out (listed in bad_utts)")
                    raise
                log_line(f"WARNING: skipping {exc}")
                bad.append((utt, exc.message.replace("\n", " ").replace("\t", " ")))
                summary.num_bad += 1
                continue
            vad = compute_vad(feats, vad_opts)
            for kind, array in (
                ("raw_fbank", feats),
                ("vad", vad),
                ("cmvn_utt", _cmvn_stats(feats, None)),
                ("cmvn_utt_voiced", _cmvn_stats(feats, vad)),
            ):
                entries[kind].append((utt, writers[kind].write(utt, array)))
            nframes.append((utt, str(len(feats))))
            summary.num_done += 1
            summary.audio_seconds += len(wave) / rate
            summary.frames += len(feats)
            summary.voiced_frames += int(vad.sum())
        for w in writers.values():
            w.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    _write_table(aux["utt2num_frames"], nframes)
    _write_table(aux["bad_utts"], bad)
    write_stamp(aux["stamp"], fbank_stamp(fbank_opts, vad_opts, compress, compression_method))
    for kind in OUTPUT_KINDS:  # raw_fbank last: its scp means "this job is complete"
        _write_table(job_paths(ark_dir, name, job, kind)[1], entries[kind])
    summary.wall_seconds = time.perf_counter() - t0
    rtf = summary.wall_seconds / max(summary.audio_seconds, 1e-9)
    voiced = summary.voiced_frames / max(summary.frames, 1)
    log_line(
        f"done {summary.num_done} utterances ({summary.audio_seconds:.1f} s of audio, {summary.frames} frames, "
        f"{100 * voiced:.1f}% voiced), skipped {summary.num_bad}; {summary.wall_seconds:.1f} s, "
        f"real-time factor {rtf:.5f}"
    )
    return summary


# --------------------------------------------------------------------------- merge


def merge_jobs(
    data_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    ark_dir: str | os.PathLike[str],
    name: str,
    nj: int,
    log_dir: str | os.PathLike[str] | None = None,
    *,
    stamp: str | None = None,
    on_bad: Callable[[set[str]], object] | None = None,
) -> tuple[int, int]:
    """Merge job outputs into ``out_dir``; returns (utterances with features, bad utterances).

    Raises :class:`~spkflow.data.jobs.MergeError` (a ``RuntimeError``) naming the job (and its log)
    when a job's outputs are missing, naming utterances that are missing or appear twice, and
    naming the jobs whose stamp differs from ``stamp`` (:func:`fbank_stamp`; without it, from
    each other's).  All of :data:`MERGED_FILES` appear together or none does (a full disk
    included).  ``on_bad(bad utterances)`` runs, when there are any, before the outputs appear
    (``merge_fbank`` filters the copied data dir there, :func:`filter_data_dir`).
    """
    out_dir, ark_dir = Path(out_dir), Path(ark_dir)
    utts = list(read_kv(Path(data_dir) / "utt2spk"))
    want = set(utts)
    tables: dict[str, dict[str, str]] = {k: {} for k in OUTPUT_KINDS}
    frames: dict[str, str] = {}
    bad: dict[str, str] = {}
    seen_in: dict[str, int] = {}
    stamps: dict[str, str | None] = {}
    for job in range(1, nj + 1):
        feats_scp = job_paths(ark_dir, name, job, "raw_fbank")[1]
        if not feats_scp.is_file():
            where = f"; see {Path(log_dir) / f'make_fbank_{name}.{job}.log'}" if log_dir else ""
            raise MergeError(f"job {job} did not finish: {feats_scp} is missing{where}")
        stamps[f"job {job} ({_stamp_path(ark_dir, name, job)})"] = read_stamp(_stamp_path(ark_dir, name, job))
        for kind in OUTPUT_KINDS:
            scp = job_paths(ark_dir, name, job, kind)[1]
            if not scp.is_file():
                raise MergeError(f"job {job}: {scp} is missing")
            tables[kind].update(read_kv(scp))
        job_feats = list(read_kv(feats_scp))
        job_bad = (
            read_kv(ark_dir / f"bad_utts_{name}.{job}") if (ark_dir / f"bad_utts_{name}.{job}").stat().st_size else {}
        )
        for u in job_feats + list(job_bad):
            if u in seen_in:
                raise MergeError(f"utterance '{u}' was processed by jobs {seen_in[u]} and {job}")
            if u not in want:
                raise MergeError(f"job {job} produced utterance '{u}', which is not in {data_dir}/utt2spk")
            seen_in[u] = job
        frames.update(read_kv(ark_dir / f"utt2num_frames_{name}.{job}"))
        bad.update(job_bad)
    check_stamps(stamps, stamp, "fbank/VAD options", f"re-run make_fbank.sh into {out_dir}")
    missing = [u for u in utts if u not in seen_in]
    if missing:
        show = ", ".join(missing[:10]) + (f" ... ({len(missing)} in all)" if len(missing) > 10 else "")
        raise MergeError(f"{len(missing)} utterances of {data_dir} are neither in feats.scp nor in bad_utts: {show}")
    good = [u for u in utts if u not in bad]
    for kind in OUTPUT_KINDS:
        if set(tables[kind]) != set(good):
            raise MergeError(f"{kind} scps do not cover the same utterances as feats.scp")

    def text(pairs: list[tuple[str, str]]) -> str:
        return "".join(format_kv(k, v) for k, v in sorted(pairs, key=lambda kv: c_key(kv[0])))

    with StagedOutputs(out_dir, MERGED_FILES) as staged:
        if bad:
            staged.write_text("bad_utts", text([(u, bad[u]) for u in utts if u in bad]))
        staged.write_text("utt2num_frames", text([(u, frames[u]) for u in good]))
        for kind in OUTPUT_KINDS:  # raw_fbank -> feats.scp last
            staged.write_text(MERGED_NAME[kind], text([(u, tables[kind][u]) for u in good]))
        if bad and on_bad is not None:
            on_bad(set(bad))
    return len(good), len(bad)


def filter_data_dir(out_dir: str | os.PathLike[str], drop: set[str]) -> dict[str, int]:
    """Remove utterances ``drop`` from the copied data dir ``out_dir`` in place (atomically per
    file): utterance-keyed tables (``utt2*``, ``text``, ``segments``, ``wav.scp`` without
    segments), ``spk2utt`` rebuilt from ``utt2spk``, speaker tables filtered to the speakers
    left, ``wav.scp``/``reco2dur`` filtered to the recordings still used, and ``trials`` lines
    naming a dropped utterance.  Returns lines removed per file."""
    d = Path(out_dir)
    removed: dict[str, int] = {}
    if not drop:
        return removed

    def rewrite(fname: str, keep_line) -> None:
        p = d / fname
        if not p.is_file():
            return
        with open(p, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines(keepends=True)
        kept = [ln if ln.endswith("\n") else ln + "\n" for ln in lines if keep_line(ln)]
        if len(kept) != len(lines):
            removed[fname] = len(lines) - len(kept)
            with atomic_write(p, "wb", encoding=None) as f:
                f.write("".join(kept).encode("utf-8", "surrogateescape"))

    def first(ln: str) -> str:
        return ln.split(maxsplit=1)[0] if ln.strip() else ""

    has_segments = (d / "segments").is_file()
    for p in sorted(d.iterdir()):
        if p.is_file() and (p.name.startswith("utt2") or p.name in ("text", "segments")):
            rewrite(p.name, lambda ln: first(ln) not in drop)
    if has_segments:
        recs = {ln.split()[1] for ln in open(d / "segments", encoding="utf-8") if ln.strip()}
        rewrite("wav.scp", lambda ln: first(ln) in recs)
        rewrite("reco2dur", lambda ln: first(ln) in recs)
    else:
        rewrite("wav.scp", lambda ln: first(ln) not in drop)
    u2s = read_kv(d / "utt2spk")
    spk2utt: dict[str, list[str]] = {}
    for u, s in u2s.items():
        spk2utt.setdefault(s, []).append(u)
    if (d / "spk2utt").is_file():
        old = read_spk2utt(d / "spk2utt")
        if len(old) != len(spk2utt):
            removed["spk2utt"] = len(old) - len(spk2utt)
    write_kv(d / "spk2utt", spk2utt)
    spks = set(spk2utt)
    for p in sorted(d.iterdir()):
        if p.is_file() and p.name.startswith("spk2") and p.name != "spk2utt":
            rewrite(p.name, lambda ln: first(ln) in spks)
    for p in sorted(d.iterdir()):
        if p.is_file() and (p.name == "trials" or p.name.startswith("trials")):
            rewrite(p.name, lambda ln: not (set(ln.split()[:2]) & drop))
    return removed


def read_bad_utts(path: str | os.PathLike[str]) -> dict[str, str]:
    """``utt -> reason`` from a ``bad_utts`` file (empty dict when absent)."""
    p = Path(path)
    if not p.is_file() or p.stat().st_size == 0:
        return {}
    return dict(read_kv_lines(p))
