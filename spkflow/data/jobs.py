"""The parallel-job toolkit of stage 2 (features, :mod:`spkflow.features.jobs`) and stage 5
(embeddings, :mod:`spkflow.embed.run`): split, per-job arks, commit logs, merge.

A stage is ``nj`` jobs started by ``run.pl`` / ``queue.pl`` / ``slurm.pl`` (through the sourced
shell helper ``scripts/lib/jobs.sh``, which also takes the output dir's lock,
:mod:`spkflow.core.lock`) and one merge.  This module holds what both stages do the same way.

What it guarantees
------------------
* **Balanced split.**  :func:`split_by_duration` cuts the data dir's utterances, in order, into
  ``nj`` consecutive non-empty parts of about equal audio duration (Kaldi's ``split_data.sh``
  balances the number of utterances, so one job can get all the long recordings).
* **Durable before committed.**  :class:`ArkWriter` appends kaldiio records; a job's list of
  finished keys (a stage-2 job's scps, a stage-5 job's commit log, :class:`CommitLog`) is
  written only after the records are fsync'ed.  A killed job leaves at most an unreferenced
  ark tail, and :func:`read_commit_log` ignores a torn last line: resume recomputes exactly
  what was not committed.
* **Stamped parts.**  Every job records the stamp of what made its outputs (stage 2: the
  fbank/VAD options, stage 5: the model's files) beside them; :func:`check_stamps` makes the
  merge refuse parts made by different configurations or models, naming them.
* **All or nothing.**  A merge writes through :class:`StagedOutputs`: every output goes to a
  temporary beside its final name, and only when all are written are they renamed into place
  (the file that marks completion last).  Any failure, a full disk included, removes the
  temporaries; stale final outputs are removed first, so none is left from an earlier run.
* **One line for a full disk.**  :func:`writing` turns an ``OSError`` without a file name
  (ENOSPC, EDQUOT, EFBIG from ``write``/``fsync``) into :class:`~spkflow.core.errors.OutputError`
  naming the file being written.

Compared with the anchors: Kaldi's ``split_data.sh`` and WeSpeaker's ``extract_embedding.sh``
split by utterance count; their extraction scripts merge the jobs' scps with ``cat`` (no key,
model or completeness check), a killed job starts over, and nothing stops two runs writing
into one directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from spkflow.core.atomic import atomic_write, umask
from spkflow.core.errors import InputError, OutputError
from spkflow.data.durations import known_durations
from spkflow.data.tables import RAW_BYTE_RE, read_kv

__all__ = [
    "log_line",
    "show_keys",
    "read_list",
    "utterance_durations",
    "split_by_duration",
    "write_split",
    "writing",
    "ArkWriter",
    "CommitLog",
    "read_commit_log",
    "committed_entries",
    "MergeError",
    "missing_and_extra",
    "StagedOutputs",
    "file_sha256",
    "write_stamp",
    "read_stamp",
    "check_stamps",
]

log = logging.getLogger("spkflow.data.jobs")
_SHOW = 20  # keys shown in an error message
_SCP_RE = re.compile(r"^(\S+)[ \t]+(.+):(\d+)$")
#: errors of a write that mean "the disk (or quota, or file size limit) is full"
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: what a byte that is not UTF-8 becomes when read with ``surrogateescape``


def log_line(msg: str) -> None:
    """One time-stamped line on stderr (a job's log under run.pl)."""
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def show_keys(keys: Sequence[str], limit: int = _SHOW) -> str:
    """The first ``limit`` keys and how many more there are."""
    shown = " ".join(keys[:limit])
    return shown + (f" ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def read_list(path: str | os.PathLike[str]) -> list[str]:
    """First fields of the non-blank lines of ``path`` (a job's utterance list)."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return [line.split()[0] for line in f if line.strip()]


# --------------------------------------------------------------------------- split


def utterance_durations(data_dir: str | os.PathLike[str]) -> dict[str, float]:
    """Seconds per utterance (utt2spk order) for balancing jobs; exactness is not needed.

    :func:`spkflow.data.durations.known_durations` (utt2dur, else utt2num_frames, else file headers and
    segment times); entries whose duration cannot be known cheaply (pipes, unreadable headers)
    get the mean of the others: the job will read them and report errors.
    """

    utt2spk = Path(data_dir) / "utt2spk"
    utts = list(read_kv(utt2spk))
    for n, u in enumerate(utts, 1):  # (the data-dir validator says the same where it checks ids)
        if not u.isprintable() and RAW_BYTE_RE.search(u):
            shown = u.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise InputError(utt2spk, n, f"id '{shown}' holds bytes that are not UTF-8; utterance ids must be UTF-8")
    known = known_durations(data_dir, utts)
    given = [v for v in known.values() if v is not None and v > 0]
    fill = float(np.mean(given)) if given else 1.0
    return {u: (known[u] or fill) for u in utts}


def split_by_duration(utts: list[str], durations: dict[str, float], nj: int) -> list[list[str]]:
    """Cut ``utts`` (kept in order) into ``nj`` consecutive non-empty parts of about equal total
    duration.  Part j (0-based) ends after the utterance whose cumulative duration is nearest
    to (j+1)/nj of the total (the first one to reach it, or the one before when that is
    nearer), moved only as far as needed to leave every part at least one utterance.  Each
    part's total is then within one utterance of the ideal."""
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
    return [utts[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def write_split(data_dir: str | os.PathLike[str], split_dir: str | os.PathLike[str], nj: int) -> list[Path]:
    """Write ``split_dir/utts.<j>`` (j = 1..nj, one utterance id per line) split by duration.
    Returns the paths; logs each part's size and duration."""
    durs = utterance_durations(data_dir)
    parts = split_by_duration(list(durs), durs, nj)
    out = []
    for j, part in enumerate(parts, 1):
        p = Path(split_dir) / f"utts.{j}"
        with writing(p), atomic_write(p) as f:
            f.write("".join(u + "\n" for u in part))
        out.append(p)
        log_line(f"job {j}: {len(part)} utterances, {sum(durs[u] for u in part):.1f} s of audio")
    return out


# --------------------------------------------------------------------------- job outputs


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Inside the block, a full disk / quota / file-size limit raises :class:`OutputError`
    naming ``path`` (``write`` and ``fsync`` errors carry no file name)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _FULL and not isinstance(exc, OutputError):
            raise OutputError(exc.filename or path, os.strerror(exc.errno).lower()) from None
        raise


class ArkWriter:
    """Appends kaldiio records to one ark; :meth:`write` returns the record's ``path:offset``.

    ``compression_method`` (Kaldi's CompressionMethod) compresses matrices; ``scp_path`` is
    the ark's name in the returned specs (default: as given).  :meth:`sync` makes everything
    written so far durable."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        append: bool = False,
        compression_method: int | None = None,
        scp_path: str | None = None,
    ) -> None:
        import kaldiio.matio

        self._write_array = kaldiio.matio.write_array
        self.path = os.fspath(path)
        self.scp_path = scp_path or self.path
        self.method = compression_method
        with writing(self.path):
            self._f = open(self.path, "ab" if append else "wb")

    def write(self, key: str, array: np.ndarray) -> str:
        with writing(self.path):
            self._f.write(f"{key} ".encode("utf-8", "surrogateescape"))
            offset = self._f.tell()
            self._write_array(self._f, array, compression_method=self.method)
        return f"{self.scp_path}:{offset}"

    def sync(self) -> None:
        with writing(self.path):
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self, sync: bool = True) -> None:
        if self._f.closed:
            return
        try:
            if sync:
                self.sync()
        finally:
            with writing(self.path):
                self._f.close()  # flushes what is buffered

    def abort(self) -> None:
        """Close without raising (an error is already on its way; the ark is garbage)."""
        with contextlib.suppress(OSError, OutputError):
            self._f.close()


def read_commit_log(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``(key, "ark:offset")`` of every complete line of a job's commit log.

    A last line without its newline (the job was killed while appending) is ignored, as is a
    line whose ark is missing; both keys count as not done.
    """
    raw = Path(path).read_bytes().decode("utf-8", "surrogateescape")
    lines = raw.split("\n")[:-1]  # the part after the last newline is incomplete (or empty)
    out = []
    for n, line in enumerate(lines, 1):
        m = _SCP_RE.match(line)
        if m is None:
            log.warning("%s:%d: ignoring malformed commit line %r", path, n, line[:80])
            continue
        if not os.path.isfile(m.group(2)):
            log.warning("%s:%d: ark %s is gone; %s will be recomputed", path, n, m.group(2), m.group(1))
            continue
        out.append((m.group(1), f"{m.group(2)}:{m.group(3)}"))
    return out


def committed_entries(job_dir: str | os.PathLike[str], pattern: str) -> dict[str, str]:
    """Every committed ``key -> ark:offset`` in the commit logs ``job_dir/pattern`` (all jobs,
    all attempts; the first commit of a key wins)."""
    out: dict[str, str] = {}
    for p in sorted(Path(job_dir).glob(pattern)):
        for key, spec in read_commit_log(p):
            out.setdefault(key, spec)
    return out


class CommitLog:
    """Append-only outputs of one job attempt: ``PREFIX.JOB.ATTEMPT.ark`` (a new file per attempt,
    so a killed attempt's tail never sits in front of new records) and the job's commit log
    ``PREFIX.JOB.scp``.  :meth:`commit` makes the records durable before it appends their keys.
    With ``stamp``, ``PREFIX.JOB.ATTEMPT.stamp`` records what made the records (for
    :func:`check_stamps`) before the first commit."""

    def __init__(
        self, job_dir: str | os.PathLike[str], prefix: str, job_id: int | str, stamp: str | None = None
    ) -> None:
        self.job_dir = os.fspath(job_dir)
        os.makedirs(self.job_dir, exist_ok=True)
        attempts = [
            int(m.group(1))
            for p in Path(self.job_dir).glob(f"{prefix}.{job_id}.*.ark")
            if (m := re.search(r"\.(\d+)\.ark$", p.name))
        ]
        self.attempt = max(attempts, default=0) + 1
        self.ark_path = os.path.join(self.job_dir, f"{prefix}.{job_id}.{self.attempt}.ark")
        self.scp_path = os.path.join(self.job_dir, f"{prefix}.{job_id}.scp")
        if stamp is not None:
            write_stamp(self.ark_path[: -len(".ark")] + ".stamp", stamp)
        if os.path.exists(self.scp_path):  # cut a torn last line, or the next commit would extend it
            with open(self.scp_path, "rb+") as f:
                data = f.read()
                cut = data.rfind(b"\n") + 1
                if cut != len(data):
                    log.warning("%s: dropping an incomplete last line (an earlier run was killed)", self.scp_path)
                    f.truncate(cut)
        self._ark = ArkWriter(self.ark_path, append=True)
        with writing(self.scp_path):
            self._scp = open(self.scp_path, "ab")
        self.written = 0

    def commit(self, items: Sequence[tuple[str, np.ndarray]]) -> None:
        lines = [f"{key} {self._ark.write(key, array)}\n" for key, array in items]
        self._ark.sync()
        with writing(self.scp_path):
            self._scp.write("".join(lines).encode("utf-8", "surrogateescape"))
            self._scp.flush()
            os.fsync(self._scp.fileno())
        self.written += len(items)

    def close(self) -> None:
        self._ark.close(sync=False)
        with writing(self.scp_path):
            self._scp.close()

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
            return
        self._ark.abort()  # what is committed is durable; the rest is an unreferenced tail
        with contextlib.suppress(OSError):
            self._scp.close()


# --------------------------------------------------------------------------- merge


class MergeError(RuntimeError):
    """The jobs' outputs do not add up to the data dir (the message lists the keys or parts)."""


def missing_and_extra(want: Sequence[str], have: Iterable[str]) -> tuple[list[str], list[str]]:
    """Keys of ``want`` not in ``have`` (in ``want``'s order), and keys of ``have`` not in
    ``want`` (sorted)."""
    have = set(have)
    wanted = set(want)
    return [k for k in want if k not in have], sorted(have - wanted)


class StagedOutputs:
    """The output files of one merge, published all at once or not at all.

    ``names`` are every file the merge may write in ``out_dir``, in publishing order (the one
    that marks completion last).  On entry the existing ones are removed (last first).
    :meth:`open` gives a temporary beside the final name; on a clean exit every written file
    is fsync'ed and renamed into place in ``names`` order (names not written stay absent); on
    an error the temporaries are removed, so none of ``names`` exists afterwards."""

    def __init__(self, out_dir: str | os.PathLike[str], names: Sequence[str]) -> None:
        self.out_dir = os.fspath(out_dir)
        self.names = list(names)
        self._tmp: dict[str, str] = {}

    def path(self, name: str) -> str:
        """The final path of ``name``."""
        return os.path.join(self.out_dir, name)

    def __enter__(self) -> StagedOutputs:
        os.makedirs(self.out_dir, exist_ok=True)
        for name in reversed(self.names):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(name))
        return self

    @contextlib.contextmanager
    def open(self, name: str, mode: str = "w") -> Iterator[IO[Any]]:
        if name not in self.names:
            raise ValueError(f"{name} is not one of this merge's outputs {self.names}")
        final = self.path(name)
        with writing(final):
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.out_dir)
            self._tmp[name] = tmp
            os.fchmod(fd, 0o666 & ~umask())
            kw = {} if "b" in mode else {"encoding": "utf-8", "errors": "surrogateescape"}
            with os.fdopen(fd, mode, **kw) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())

    def write_text(self, name: str, text: str) -> None:
        with self.open(name) as f:
            f.write(text)

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            try:
                for name in self.names:
                    if name in self._tmp:
                        os.replace(self._tmp.pop(name), self.path(name))
                return
            except BaseException:
                for name in self.names:  # a failed rename: take back what was published
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path(name))
                raise
            finally:
                self._discard()
        self._discard()

    def _discard(self) -> None:
        for tmp in self._tmp.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._tmp.clear()


# --------------------------------------------------------------------------- stamps


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_stamp(path: str | os.PathLike[str], stamp: str) -> None:
    """Write ``stamp`` (one line) atomically under a temporary name of its own, so that runs
    writing the same stamp at the same moment never trip over each other's temporary."""
    with writing(path), atomic_write(path) as f:
        f.write(stamp.rstrip("\n") + "\n")


def read_stamp(path: str | os.PathLike[str]) -> str | None:
    """The stamp in ``path`` (None when there is no such file)."""
    try:
        return Path(path).read_text(encoding="utf-8").rstrip("\n")
    except FileNotFoundError:
        return None


def check_stamps(stamps: Mapping[str, str | None], expected: str | None, what: str, remedy: str) -> None:
    """Raise :class:`MergeError` unless every part's stamp (``part -> stamp``, None: none
    recorded) equals ``expected`` (or, with ``expected`` None, each other).  ``what`` names
    the stamped thing ("model", "fbank/VAD options"), ``remedy`` what to do."""
    if not stamps:
        return
    ref = expected if expected is not None else next(iter(stamps.values()))
    odd = [p for p, s in stamps.items() if s != ref]
    if not odd:
        return
    lines = [f"the job outputs were made with different {what}: {len(odd)} of {len(stamps)} part(s) differ"]
    for p in odd[:5]:
        lines.append(f"  {p}: {stamps[p] or '(no stamp recorded)'}")
    lines.append(f"  expected: {ref or '(no stamp)'}")
    lines.append(f"  (another run wrote into the same directory?) {remedy}")
    raise MergeError("\n".join(lines))
