"""Stage 2 jobs: split a data dir by audio duration, extract fbank + VAD into arks, merge.

``scripts/feats/make_fbank.sh`` drives three steps, each a thin front end in ``spkflow/bin``:

1. :func:`write_split` (``split_by_duration``): utterances in data-dir order, cut into ``nj``
   consecutive parts of about equal total audio duration (``utt2dur`` when present, else
   ``segments`` times, else file headers).  Kaldi's ``split_data.sh`` balances the number of
   utterances, so one job can get all the long recordings and the stage waits on it.
2. :func:`extract_job` (``compute_fbank``): one job reads its utterances through
   :class:`spkflow.audio.AudioReader`, computes fbank (:func:`spkflow.features.compute_fbank`),
   energy VAD and per-utterance CMVN statistics, and writes kaldiio arks
   ``data/{raw_fbank,vad,cmvn_utt,cmvn_utt_voiced}_<name>.<job>.ark`` and their scps.
3. :func:`merge_jobs` (``merge_fbank``): checks that every utterance of the data dir is in
   exactly one job's ``feats.scp`` or ``bad_utts`` and writes ``feats.scp``, ``vad.scp``,
   ``utt2num_frames``, ``cmvn_utt*.scp`` and ``bad_utts`` in the data dir's ``LC_ALL=C`` order.

Guarantees
----------
* Atomic outputs: a job deletes its own stale scps first, writes the arks, then writes each
  scp atomically (feats scp last); the merge writes ``feats.scp`` last.  A job that crashes or
  is killed leaves no scp, and the merge refuses to run with a job's scp missing, so no
  complete-looking ``feats.scp`` can point into a partial ark.
* Bad audio (missing, empty, corrupt, shorter than one frame, a rate we refuse to resample)
  fails the job with an ``ERROR`` line naming the utterance and the reason; with
  ``skip_bad`` the utterance is left out, logged as ``WARNING`` and listed with its reason in
  ``bad_utts`` (``utt<TAB>reason``), and the copied data dir is filtered to match, so
  ``utt2spk``/``spk2utt`` agree with ``feats.scp``.  Never a silent hole.
* ``cmvn_utt.scp`` holds Kaldi CMVN statistics (``compute-cmvn-stats`` format: a 2 x (F+1)
  double matrix of sums, sums of squares and the count) per utterance over all frames;
  ``cmvn_utt_voiced.scp`` the same over voiced frames (``--weights`` = VAD; all frames when no
  frame is voiced, as :func:`spkflow.features.select_voiced`).  The loader takes the
  per-utterance mean from them without reading whole utterances.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from spkflow.atomic import atomic_write
from spkflow.datadir import read_kv, read_kv_lines, read_spk2utt, write_kv
from spkflow.errors import InputError, UtteranceError

if TYPE_CHECKING:  # torch is imported by the extraction job only, so split and merge start fast
    from spkflow.features import FbankOptions
    from spkflow.vad import VadOptions

__all__ = [
    "utterance_durations",
    "split_by_duration",
    "write_split",
    "job_paths",
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
#: Kaldi CompressionMethod used by ``compress=True`` unless told otherwise: kTwoByteAuto (3), a
#: linear 16-bit code over the matrix's range, row-major: half the size of float32, error at most
#: range / 131070 (about 3e-4 on log-mel), and the loader decodes just a crop's rows with one
#: multiply-add.  Kaldi's own default (copy-feats --compress=true: kAutomaticMethod, 1, i.e. the
#: 1-byte per-column "CM" code) is a quarter of the size but about 1% of each bin's range off,
#: and decoding a crop costs about 10x more; pass 1 (or 2) to get it.
DEFAULT_COMPRESSION_METHOD = 3
COMPRESSION_METHODS = {1: "kAutomaticMethod", 2: "kSpeechFeature", 3: "kTwoByteAuto", 5: "kOneByteAuto"}


def _log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- split


def utterance_durations(data_dir: str | os.PathLike[str]) -> dict[str, float]:
    """Seconds per utterance (utt2spk order) for balancing jobs; exactness is not needed.

    :func:`spkflow.audio.known_durations` (utt2dur, utt2num_frames, file headers, segment
    times); entries whose duration cannot be known cheaply (pipes, unreadable headers) get the
    mean of the others: the job will read them and report errors.
    """
    from spkflow.audio import known_durations

    utts = list(read_kv(Path(data_dir) / "utt2spk"))
    known = known_durations(data_dir, utts)
    given = [v for v in known.values() if v is not None and v > 0]
    fill = float(np.mean(given)) if given else 1.0
    return {u: (known[u] or fill) for u in utts}


def split_by_duration(utts: list[str], durations: dict[str, float], nj: int) -> list[list[str]]:
    """Cut ``utts`` (kept in order) into ``nj`` consecutive non-empty parts of about equal total
    duration: part j ends at the utterance whose cumulative duration first reaches
    (j+1)/nj of the total.  Each part's total is within one utterance of the ideal."""
    if nj < 1:
        raise ValueError(f"nj must be >= 1, got {nj}")
    if len(utts) < nj:
        raise ValueError(f"cannot split {len(utts)} utterances into {nj} non-empty jobs")
    w = np.array([max(float(durations[u]), 1e-6) for u in utts])
    cum = np.cumsum(w)
    total = cum[-1]
    bounds = [0]
    for j in range(1, nj):
        # first index whose cumulative sum reaches the target, nearest of the two neighbours
        target = total * j / nj
        i = int(np.searchsorted(cum, target))
        if i > 0 and abs(cum[i - 1] - target) < abs(cum[i] - target):
            i -= 1
        end = i + 1
        end = max(end, bounds[-1] + 1)  # non-empty
        end = min(end, len(utts) - (nj - j))  # leave one for each remaining part
        bounds.append(end)
    bounds.append(len(utts))
    return [utts[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def write_split(data_dir: str | os.PathLike[str], split_dir: str | os.PathLike[str], nj: int) -> list[Path]:
    """Write ``split_dir/utts.<j>`` (j = 1..nj, one utterance id per line) split by duration.
    Returns the paths; logs each part's size and duration."""
    durs = utterance_durations(data_dir)
    parts = split_by_duration(list(durs), durs, nj)
    out = []
    for j, part in enumerate(parts, 1):
        p = Path(split_dir) / f"utts.{j}"
        with atomic_write(p) as f:
            f.write("".join(u + "\n" for u in part))
        out.append(p)
        _log(f"job {j}: {len(part)} utterances, {sum(durs[u] for u in part):.1f} s of audio")
    return out


# --------------------------------------------------------------------------- extraction


def job_paths(ark_dir: str | os.PathLike[str], name: str, job: int | str, kind: str) -> tuple[Path, Path]:
    """(ark, scp) of one output kind of one job."""
    base = Path(ark_dir) / f"{kind}_{name}.{job}"
    return base.with_name(base.name + ".ark"), base.with_name(base.name + ".scp")


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


class _ArkWriter:
    """Appends kaldiio arrays to an ark, remembering ``utt -> ark:offset`` for the scp."""

    def __init__(self, ark: Path, compression_method: int | None) -> None:
        import kaldiio.matio

        self._write_array = kaldiio.matio.write_array
        self.path = ark
        self.method = compression_method
        self.f = open(ark, "wb")
        self.entries: list[tuple[str, int]] = []

    def write(self, utt: str, array: np.ndarray) -> None:
        self.f.write((utt + " ").encode("utf-8"))
        offset = self.f.tell()
        self._write_array(self.f, array, compression_method=self.method)
        self.entries.append((utt, offset))

    def close(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()

    def write_scp(self, scp: Path) -> None:
        ark = os.path.abspath(self.path)
        with atomic_write(scp) as f:
            f.write("".join(f"{u} {ark}:{o}\n" for u, o in self.entries))


def _read_list(path: str | os.PathLike[str]) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.split()[0] for line in f if line.strip()]


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
    plus ``utt2num_frames_<name>.<job>`` and ``bad_utts_<name>.<job>`` (empty unless
    ``skip_bad``).  Raises :class:`UtteranceError` on the first bad utterance unless
    ``skip_bad``.  ``compress``: feature matrices Kaldi-compressed with ``compression_method``
    (see :data:`DEFAULT_COMPRESSION_METHOD`).
    """
    from spkflow.audio import AudioReader
    from spkflow.features import check_resample_rate, compute_fbank
    from spkflow.vad import compute_vad

    if compress and compression_method not in COMPRESSION_METHODS:
        raise ValueError(f"compression method must be one of {COMPRESSION_METHODS}, got {compression_method}")

    ark_dir = Path(ark_dir)
    ark_dir.mkdir(parents=True, exist_ok=True)
    aux = {k: ark_dir / f"{k}_{name}.{job}" for k in ("utt2num_frames", "bad_utts")}
    # Stale results of an earlier run must not survive a crash of this one.
    for kind in OUTPUT_KINDS:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(job_paths(ark_dir, name, job, kind)[1])
    for p in aux.values():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)

    utts = _read_list(utt_list)
    reader = AudioReader(data_dir, sample_rate=None)
    target = int(fbank_opts.sample_frequency)
    method = compression_method if compress else None
    writers = {
        k: _ArkWriter(job_paths(ark_dir, name, job, k)[0], method if k == "raw_fbank" else None) for k in OUTPUT_KINDS
    }
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
                _log(
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
                    _log(f"ERROR: {exc}")
                    _log("ERROR: rerun with --skip-bad true to leave bad utterances out (listed in bad_utts)")
                    raise
                _log(f"WARNING: skipping {exc}")
                bad.append((utt, exc.message.replace("\n", " ").replace("\t", " ")))
                summary.num_bad += 1
                continue
            vad = compute_vad(feats, vad_opts)
            writers["raw_fbank"].write(utt, feats)
            writers["vad"].write(utt, vad)
            writers["cmvn_utt"].write(utt, _cmvn_stats(feats, None))
            writers["cmvn_utt_voiced"].write(utt, _cmvn_stats(feats, vad))
            nframes.append((utt, str(len(feats))))
            summary.num_done += 1
            summary.audio_seconds += len(wave) / rate
            summary.frames += len(feats)
            summary.voiced_frames += int(vad.sum())
    finally:
        for w in writers.values():
            w.close()
    write_kv(aux["utt2num_frames"], nframes, sort=False)
    if bad:
        write_kv(aux["bad_utts"], bad, sort=False)
    else:
        with atomic_write(aux["bad_utts"]) as f:
            f.write("")
    for kind in OUTPUT_KINDS:  # raw_fbank last: its scp means "this job is complete"
        writers[kind].write_scp(job_paths(ark_dir, name, job, kind)[1])
    summary.wall_seconds = time.perf_counter() - t0
    rtf = summary.wall_seconds / max(summary.audio_seconds, 1e-9)
    voiced = summary.voiced_frames / max(summary.frames, 1)
    _log(
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
) -> tuple[int, int]:
    """Merge job outputs into ``out_dir``; returns (utterances with features, bad utterances).

    Raises ``RuntimeError`` naming the job (and its log) when a job's outputs are missing,
    and naming utterances that are missing or appear twice.
    """
    out_dir, ark_dir = Path(out_dir), Path(ark_dir)
    utts = list(read_kv(Path(data_dir) / "utt2spk"))
    want = set(utts)
    tables: dict[str, dict[str, str]] = {k: {} for k in OUTPUT_KINDS}
    frames: dict[str, str] = {}
    bad: dict[str, str] = {}
    seen_in: dict[str, int] = {}
    for job in range(1, nj + 1):
        feats_scp = job_paths(ark_dir, name, job, "raw_fbank")[1]
        if not feats_scp.is_file():
            where = f"; see {Path(log_dir) / f'make_fbank_{name}.{job}.log'}" if log_dir else ""
            raise RuntimeError(f"job {job} did not finish: {feats_scp} is missing{where}")
        for kind in OUTPUT_KINDS:
            scp = job_paths(ark_dir, name, job, kind)[1]
            if not scp.is_file():
                raise RuntimeError(f"job {job}: {scp} is missing")
            tables[kind].update(read_kv(scp))
        job_feats = list(read_kv(feats_scp))
        job_bad = (
            read_kv(ark_dir / f"bad_utts_{name}.{job}") if (ark_dir / f"bad_utts_{name}.{job}").stat().st_size else {}
        )
        for u in job_feats + list(job_bad):
            if u in seen_in:
                raise RuntimeError(f"utterance '{u}' was processed by jobs {seen_in[u]} and {job}")
            if u not in want:
                raise RuntimeError(f"job {job} produced utterance '{u}', which is not in {data_dir}/utt2spk")
            seen_in[u] = job
        frames.update(read_kv(ark_dir / f"utt2num_frames_{name}.{job}"))
        bad.update(job_bad)
    missing = [u for u in utts if u not in seen_in]
    if missing:
        show = ", ".join(missing[:10]) + (f" ... ({len(missing)} in all)" if len(missing) > 10 else "")
        raise RuntimeError(f"{len(missing)} utterances of {data_dir} are neither in feats.scp nor in bad_utts: {show}")
    good = [u for u in utts if u not in bad]
    for kind in OUTPUT_KINDS:
        if set(tables[kind]) != set(good):
            raise RuntimeError(f"{kind} scps do not cover the same utterances as feats.scp")
    if bad:
        write_kv(out_dir / "bad_utts", [(u, bad[u]) for u in utts if u in bad])
    write_kv(out_dir / "utt2num_frames", [(u, frames[u]) for u in good])
    for kind in OUTPUT_KINDS:  # raw_fbank -> feats.scp last
        write_kv(out_dir / MERGED_NAME[kind], [(u, tables[kind][u]) for u in good])
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
