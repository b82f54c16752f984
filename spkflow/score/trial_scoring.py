"""Trial scoring: cosine similarity of L2-normalised embeddings, optional adaptive s-norm.

Inputs are the project's contracts: a Kaldi trials file (``utt1 utt2 target|nontarget``)
and kaldiio scp files of float32 vectors (``xvector.scp``; a cohort from a training set's
``spk_xvector.scp``).  Guarantees:

* A malformed trials line is an :class:`~spkflow.core.errors.InputError` naming the trials file
  and 1-based line; so is a trial list without both target and non-target trials (also
  when skipping trials leaves only one kind); so is a trials line naming an utterance without an embedding, unless
  ``skip_missing`` is set, in which case such trials are left out and counted
  (``ScoreResult.n_skipped``, ``ScoreResult.missing``).
* A bad scp line (unreadable ark, not a vector, wrong dimension, non-finite or all-zero
  vector, duplicate key) is an ``InputError`` naming the scp file and line.
* An scp read from another folder still finds its arks: a relative ark path that does not
  exist from the working directory is looked up against the scp's own folder and the folders
  above it (stage 5 writes ``exp/spk_x/embed/train/xvector.ark`` relative to the recipe dir,
  which is an ancestor of the scp's folder), as Kaldi's tables would not.
* Unlabelled pairs (``utt1 utt2`` lines, :func:`read_pairs`) score like trials; only EER and
  minDCF need both labels.
* Only the embeddings a trial list needs are read; each is read once.
* AS-norm (adaptive symmetric score normalisation over the ``cohort_size`` best cohort
  scores, population std as WeSpeaker; formula in docs/scoring.md), statistics computed once
  per utterance, in chunks.
* Optional centring: a mean vector (e.g. of the training speakers' embeddings) is
  subtracted from every embedding, trial and cohort alike, before L2 normalisation.
* Memory stays bounded: cosine scores are computed in chunks of trials (measured: docs/scoring.md).
* :func:`score_trials` takes any ``Mapping[str, np.ndarray]``, so validation during training
  (:mod:`spkflow.train.validation`) scores with this same code.  Compared with WeSpeaker's scoring
  scripts: docs/scoring.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, NamedTuple

import numpy as np

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError

__all__ = [
    "Trial",
    "Trials",
    "ScoreResult",
    "read_trials",
    "read_pairs",
    "read_scores",
    "resolve_ark",
    "check_both_labels",
    "read_embeddings",
    "read_cohort",
    "read_mean",
    "score_trials",
    "asnorm_stats",
    "write_scores",
]

log = logging.getLogger(__name__)

LABELS = {"target": True, "nontarget": False}


class Trial(NamedTuple):
    """One trial, as iterating over :class:`Trials` yields it."""

    enroll: str
    test: str
    target: bool
    line: int  # 1-based line in the trials file


@dataclass
class Trials:
    """A trial list, column-wise (cheap for millions of trials).

    ``enroll[i] test[i]`` is trial i, ``target[i]`` its label, ``lines[i]`` its 1-based line
    in ``path`` (for error messages; ``path`` is ``"<trials>"`` for lists built in memory).
    Iterating yields :class:`Trial` tuples.
    """

    enroll: list[str]
    test: list[str]
    target: np.ndarray  # bool [n]
    lines: np.ndarray  # int [n]
    path: str = "<trials>"
    labelled: bool = True  # False: pairs without labels (``target`` is all False then)

    def __len__(self) -> int:
        return len(self.enroll)

    def __iter__(self) -> Iterator[Trial]:
        for e, t, y, n in zip(self.enroll, self.test, self.target.tolist(), self.lines.tolist(), strict=True):
            yield Trial(e, t, y, n)

    @classmethod
    def from_pairs(
        cls, pairs: Iterable[tuple[str, str, bool]], path: str = "<trials>", labelled: bool = True
    ) -> Trials:
        """Build from ``(utt1, utt2, is_target)`` tuples (line numbers are 1, 2, ...);
        ``labelled=False``: the third item means nothing (pairs to score, not to evaluate)."""
        rows = list(pairs)
        return cls(
            [r[0] for r in rows],
            [r[1] for r in rows],
            np.array([bool(r[2]) for r in rows], dtype=bool),
            np.arange(1, len(rows) + 1),
            path,
            labelled,
        )

    def subset(self, keep: np.ndarray) -> Trials:
        idx = np.flatnonzero(keep)
        return Trials(
            [self.enroll[i] for i in idx],
            [self.test[i] for i in idx],
            self.target[idx],
            self.lines[idx],
            self.path,
            self.labelled,
        )


@dataclass
class ScoreResult:
    """Scores of the trials that could be scored, in trials-file order."""

    trials: Trials
    scores: np.ndarray  # float64 [n]; AS-normalised when a cohort was given
    raw_scores: np.ndarray  # float64 [n]; plain cosine
    labels: np.ndarray  # int [n], 1 target / 0 non-target
    n_skipped: int = 0
    missing: list[str] = field(default_factory=list)  # utterances without an embedding
    score_norm: str = "none"  # "none" | "asnorm"
    cohort_size: int = 0  # cohort entries actually used (top-K)
    enroll_mu: np.ndarray | None = None  # float64 [n]: AS-norm's cohort mean of each trial's sides
    test_mu: np.ndarray | None = None  # (the 'imposter mean' quality measure of spkflow.score.qmf)


def read_trials(path: str | os.PathLike[str]) -> Trials:
    """Parse ``utt1 utt2 target|nontarget`` lines (a blank line is an error too)."""
    return _read_labelled(path, with_score=False)[0]


def read_pairs(path: str | os.PathLike[str]) -> Trials:
    """Parse ``utt1 utt2`` or ``utt1 utt2 target|nontarget`` lines (all of one form; a blank line
    is an error): the pairs verification scores.  ``labelled`` says which form it was; one label
    only is allowed here (decisions need no EER).  Names with spaces: a line with a tab is split
    at tabs only, one with a quote as the shell splits it (``"my file.wav" b.wav``)."""
    path = os.fspath(path)
    enroll: list[str] = []
    test: list[str] = []
    target: list[bool] = []
    width: tuple[int, int] | None = None  # (fields per line, first line)
    with _utf8_text(path) as f:
        for n, line in enumerate(f, start=1):
            fields = _pair_fields(path, n, line)
            if len(fields) not in (2, 3):
                raise InputError(
                    path,
                    n,
                    f"expected 'a b' or 'a b target|nontarget', got {line.rstrip()!r} ({len(fields)} fields; quote "
                    "names with spaces or separate the fields by tabs)",
                )
            if width is None:
                width = (len(fields), n)
            elif len(fields) != width[0]:
                raise InputError(
                    path, n, f"{len(fields)} fields, line {width[1]} has {width[0]}: label every pair or none"
                )
            if len(fields) == 3:
                label = LABELS.get(fields[2])
                if label is None:
                    raise InputError(path, n, f"label must be 'target' or 'nontarget', got {fields[2]!r}")
                target.append(label)
            enroll.append(fields[0])
            test.append(fields[1])
    if not enroll:
        raise InputError(path, None, "no pairs")
    labelled = width is not None and width[0] == 3
    tgt = np.array(target, dtype=bool) if labelled else np.zeros(len(enroll), dtype=bool)
    return Trials(enroll, test, tgt, np.arange(1, len(enroll) + 1), path, labelled)


def _pair_fields(path: str, lineno: int, line: str) -> list[str]:
    """One pairs line's fields: split at tabs if it has one, as the shell splits if it holds a
    quote, else at white space."""
    text = line.rstrip("\r\n")
    if "\t" in text:
        return [x.strip() for x in text.split("\t") if x.strip()]
    if '"' in text or "'" in text:
        try:
            return shlex.split(text)
        except ValueError as exc:
            raise InputError(path, lineno, f"{exc} in {text!r}") from None
    return text.split()


def read_scores(path: str | os.PathLike[str]) -> tuple[Trials, np.ndarray]:
    """Parse a scores file as :func:`write_scores` (stage 6) writes it, ``utt1 utt2 score
    target|nontarget`` lines: its trials and the float64 scores, checked like :func:`read_trials`."""
    return _read_labelled(path, with_score=True)


def _read_labelled(path: str | os.PathLike[str], *, with_score: bool) -> tuple[Trials, np.ndarray]:
    path = os.fspath(path)
    form = "utt1 utt2 score target|nontarget" if with_score else "utt1 utt2 target|nontarget"
    enroll: list[str] = []
    test: list[str] = []
    target: list[bool] = []
    scores: list[float] = []
    with _utf8_text(path) as f:
        for n, line in enumerate(f, start=1):
            fields = line.split()
            if len(fields) != 3 + with_score:
                raise InputError(path, n, f"expected '{form}', got {line.rstrip()!r}")
            label = LABELS.get(fields[-1])
            if label is None:
                raise InputError(path, n, f"label must be 'target' or 'nontarget', got {fields[-1]!r}")
            if with_score:
                try:
                    scores.append(float(fields[2]))
                except ValueError:
                    raise InputError(path, n, f"score must be a number, got {fields[2]!r}") from None
            enroll.append(fields[0])
            test.append(fields[1])
            target.append(label)
    if not enroll:
        raise InputError(path, None, "no trials")
    trials = Trials(enroll, test, np.array(target, dtype=bool), np.arange(1, len(enroll) + 1), path)
    check_both_labels(trials)
    return trials, np.array(scores, dtype=np.float64)


def check_both_labels(trials: Trials, why: str = "") -> None:
    """InputError naming the trials file unless it has target and non-target trials (EER and
    minDCF are undefined otherwise).  ``why`` explains a reduced list (skipped trials)."""
    n_tar = int(np.count_nonzero(trials.target))
    n_non = len(trials) - n_tar
    if n_tar and n_non:
        return
    raise InputError(
        trials.path,
        None,
        f"{n_tar} target and {n_non} non-target trials{why}: EER and minDCF need both "
        "(a trials file lists 'utt1 utt2 target|nontarget' pairs of both kinds)",
    )


@contextlib.contextmanager
def _utf8_text(path: str) -> Iterator[IO[str]]:
    """``open(path)`` as UTF-8 text; bytes that are not UTF-8 are an InputError naming the line."""
    try:
        with open(path, encoding="utf-8") as f:
            yield f
    except UnicodeDecodeError:
        with open(path, "rb") as b:
            data = b.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:  # offsets into the whole file this time
            line = data.count(b"\n", 0, err.start) + 1
            bad = data[err.start : err.end].hex(" ")
            raise InputError(path, line, f"not UTF-8 (byte {bad}); ids must be UTF-8 text") from None
        raise


_ARK_SPEC = re.compile(r"(?P<path>.+?)(?P<rest>:\d+(?:\[[^\]]*\])?)")


def resolve_ark(spec: str, scp: str | os.PathLike[str], cache: dict[str, str] | None = None) -> str:
    """``spec`` (``file.ark:offset``, maybe with a ``[...]`` slice) with a relative ``file.ark``
    that is not found from the working directory looked up against ``scp``'s folder and each
    folder above it; the first that holds it wins.  Anything else (absolute paths, pipes, paths
    found nowhere: the reader names those) is returned as it is.  ``cache`` maps ark paths
    already looked up (one look-up per ark, not per line)."""
    m = _ARK_SPEC.fullmatch(spec.strip())
    if m is None:
        return spec
    ark = m["path"]
    if cache is not None and ark in cache:
        return cache[ark] + m["rest"]
    found = ark
    if not os.path.isabs(ark) and not os.path.exists(ark):
        folder = os.path.dirname(os.path.abspath(os.fspath(scp)))
        while True:
            if os.path.exists(os.path.join(folder, ark)):
                found = os.path.join(folder, ark)
                break
            up = os.path.dirname(folder)
            if up == folder:
                break
            folder = up
    if cache is not None:
        cache[ark] = found
    return found + m["rest"]


def _scp_lines(path: str) -> dict[str, tuple[int, str]]:
    """``key -> (line, ark spec)``, relative ark paths resolved (:func:`resolve_ark`)."""
    entries: dict[str, tuple[int, str]] = {}
    arks: dict[str, str] = {}
    with _utf8_text(path) as f:
        for n, line in enumerate(f, start=1):
            parts = line.rstrip("\n").split(maxsplit=1)
            if len(parts) != 2:
                raise InputError(path, n, f"expected 'key ark:offset', got {line.rstrip()!r}")
            if parts[0] in entries:
                raise InputError(path, n, f"duplicate key {parts[0]!r} (first on line {entries[parts[0]][0]})")
            entries[parts[0]] = (n, resolve_ark(parts[1], path, arks))
    return entries


def read_embeddings(
    scp: str | os.PathLike[str], keys: Iterable[str] | None = None, normalize: bool = False
) -> dict[str, np.ndarray]:
    """Read (the ``keys`` of) a kaldiio vector scp as float64 ``[D]`` arrays, L2-normalised
    when ``normalize`` (scoring normalises anyway, after optional centring).

    Keys absent from the scp are simply not in the result (the caller decides whether that
    is an error).  Every vector read must be 1-D (or ``[1, D]``), finite, non-zero and of
    one common dimension; otherwise :class:`InputError` names the scp line.
    """
    import kaldiio

    scp = os.fspath(scp)
    entries = _scp_lines(scp)
    keyset = None if keys is None else set(keys)
    wanted = [k for k in entries if keyset is None or k in keyset]  # scp order: sequential reads
    out: dict[str, np.ndarray] = {}
    dim: tuple[int, str] | None = None
    for key in wanted:
        n, spec = entries[key]
        try:
            vec = np.asarray(kaldiio.load_mat(spec), dtype=np.float64)
        except Exception as err:  # kaldiio raises many types for a bad ark/offset
            raise InputError(scp, n, f"cannot read embedding of {key!r} from {spec!r}: {err}") from err
        if vec.ndim == 2 and vec.shape[0] == 1:
            vec = vec[0]
        if vec.ndim != 1:
            raise InputError(scp, n, f"embedding of {key!r} is not a vector (shape {vec.shape})")
        if dim is None:
            dim = (vec.shape[0], key)
        elif vec.shape[0] != dim[0]:
            raise InputError(scp, n, f"embedding of {key!r} has dimension {vec.shape[0]}, {dim[1]!r} has {dim[0]}")
        if not np.all(np.isfinite(vec)):
            raise InputError(scp, n, f"embedding of {key!r} has non-finite values")
        norm = np.linalg.norm(vec)
        if norm == 0.0:
            raise InputError(scp, n, f"embedding of {key!r} is all zeros (cosine undefined)")
        out[key] = vec / norm if normalize else vec
    return out


def read_cohort(scp: str | os.PathLike[str]) -> np.ndarray:
    """All vectors of a cohort scp (e.g. a training set's ``spk_xvector.scp``) as a raw
    ``[S, D]`` matrix (scoring centres and L2-normalises it like the trial embeddings)."""
    emb = read_embeddings(scp)
    if not emb:
        raise InputError(os.fspath(scp), None, "empty cohort")
    return np.stack(list(emb.values()))


def read_mean(scp: str | os.PathLike[str]) -> np.ndarray:
    """Mean of all vectors of an scp (not L2-normalised first: the raw embedding mean that
    centring subtracts), as a float64 ``[D]`` array."""
    import kaldiio

    scp = os.fspath(scp)
    total: np.ndarray | None = None
    count = 0
    for key, (n, spec) in _scp_lines(scp).items():
        try:
            vec = np.asarray(kaldiio.load_mat(spec), dtype=np.float64).reshape(-1)
        except Exception as err:
            raise InputError(scp, n, f"cannot read {key!r} from {spec!r}: {err}") from err
        if total is None:
            total = np.zeros_like(vec)
        if vec.shape != total.shape or not np.all(np.isfinite(vec)):
            raise InputError(scp, n, f"vector of {key!r} is non-finite or of another dimension")
        total += vec
        count += 1
    if total is None:
        raise InputError(scp, None, "empty scp: no mean to subtract")
    return total / count


def asnorm_stats(
    emb: np.ndarray, cohort: np.ndarray, top_k: int, chunk: int = 4096, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population std of each row's ``top_k`` largest cosine scores against ``cohort``.

    ``emb [U, D]`` and ``cohort [S, D]`` L2-normalised; returns ``(mu [U], sigma [U])``.
    ``exclude [U]``: a cohort row each row must not use (its own speaker), -1 for none.
    """
    if not 2 <= top_k <= cohort.shape[0]:
        raise ValueError(f"AS-norm needs 2 <= top_k <= cohort size ({cohort.shape[0]}), got {top_k}")
    mu = np.empty(emb.shape[0])
    sigma = np.empty(emb.shape[0])
    for start in range(0, emb.shape[0], chunk):
        s = emb[start : start + chunk] @ cohort.T  # [c, S]
        if exclude is not None:
            own = exclude[start : start + chunk]
            rows = np.flatnonzero(own >= 0)
            s[rows, own[rows]] = -np.inf
        top = np.partition(s, s.shape[1] - top_k, axis=1)[:, -top_k:]  # k largest, unordered
        mu[start : start + chunk] = top.mean(axis=1)
        sigma[start : start + chunk] = top.std(axis=1)
    return mu, np.maximum(sigma, 1e-8)


def score_trials(
    trials: Trials,
    embeddings: Mapping[str, np.ndarray],
    *,
    emb_source: str = "<embeddings>",
    skip_missing: bool = False,
    cohort: np.ndarray | None = None,
    cohort_size: int = 200,
    mean: np.ndarray | None = None,
    cohort_exclude: Mapping[str, int] | None = None,
) -> ScoreResult:
    """Cosine-score ``trials`` with ``embeddings`` (L2-normalised here again, so any
    mapping of utterance id to vector works), AS-normalised against ``cohort [S, D]`` when
    given (top ``min(cohort_size, S)``).  ``mean [D]``, when given, is subtracted from every
    embedding and cohort vector first (centring).  Raises :class:`InputError` naming the trials file,
    line and utterance at the first trial whose utterance has no embedding, unless
    ``skip_missing``; and, for labelled trials (``trials.labelled``), unless both labels are
    left.  ``cohort_exclude``: utterance -> the cohort row it must not use (its own speaker, when
    the trials come from the cohort's speakers: the QMF's calibration trials)."""
    n = len(trials)
    index: dict[str, int] = {}
    e_idx = np.fromiter((index.setdefault(u, len(index)) for u in trials.enroll), dtype=np.int64, count=n)
    t_idx = np.fromiter((index.setdefault(u, len(index)) for u in trials.test), dtype=np.int64, count=n)
    utts = list(index)
    have = np.fromiter((u in embeddings for u in utts), dtype=bool, count=len(utts))
    ok = have[e_idx] & have[t_idx]
    missing = sorted(u for u, h in zip(utts, have, strict=True) if not h)
    n_bad = int(n - ok.sum())
    if n_bad and not skip_missing:
        i = int(np.argmin(ok))
        utt = trials.enroll[i] if not have[e_idx[i]] else trials.test[i]
        more = (
            f" ({n_bad - 1} more trial(s) and {len(missing) - 1} more utterance(s) lack one; "
            f"--skip-missing leaves them out)"
            if n_bad > 1
            else ""
        )
        raise InputError(trials.path, int(trials.lines[i]), f"utterance {utt!r} has no embedding in {emb_source}{more}")
    if n_bad == n:
        raise InputError(trials.path, None, f"no trial has both embeddings in {emb_source}")
    if n_bad:
        log.warning(
            "%s: skipped %d of %d trials: %d utterance(s) without an embedding in %s (e.g. %r)",
            trials.path,
            n_bad,
            n,
            len(missing),
            emb_source,
            missing[0],
        )
        trials, e_idx, t_idx = trials.subset(ok), e_idx[ok], t_idx[ok]
        if trials.labelled:
            check_both_labels(trials, f" left after skipping {n_bad} trial(s) without an embedding in {emb_source}")
    elif trials.labelled:
        check_both_labels(trials)

    dim = None
    mat = np.zeros((len(utts), 0))
    for i, u in enumerate(utts):
        if not have[i]:
            continue
        v = np.asarray(embeddings[u], dtype=np.float64).reshape(-1)
        if dim is None:
            dim = v.shape[0]
            mat = np.zeros((len(utts), dim))
        if v.shape[0] != dim or not np.all(np.isfinite(v)) or not np.any(v):
            raise InputError(emb_source, None, f"embedding of {u!r} is zero, non-finite or not of dimension {dim}")
        mat[i] = v
    if mean is not None:
        mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        if mean.shape[0] != mat.shape[1]:
            raise ValueError(f"mean has dimension {mean.shape[0]}, embeddings {mat.shape[1]}")
        mat[have] -= mean
    norms = np.linalg.norm(mat[have], axis=1, keepdims=True)
    if np.any(norms == 0):
        bad = [u for u, h in zip(utts, have, strict=True) if h][int(np.flatnonzero(norms[:, 0] == 0)[0])]
        raise InputError(emb_source, None, f"embedding of {bad!r} equals the mean (cosine undefined)")
    mat[have] /= norms
    raw = np.empty(len(e_idx))
    step = max(1024, 2**22 // max(mat.shape[1], 1))  # ~32 MiB of gathered rows per chunk
    for a in range(0, len(e_idx), step):
        raw[a : a + step] = np.einsum("nd,nd->n", mat[e_idx[a : a + step]], mat[t_idx[a : a + step]])
    result = ScoreResult(trials, raw, raw, trials.target.astype(int), n_skipped=n_bad, missing=missing)
    if cohort is not None:
        cohort = np.asarray(cohort, dtype=np.float64)
        if cohort.ndim != 2 or cohort.shape[1] != mat.shape[1]:
            raise ValueError(f"cohort must be [S, {mat.shape[1]}], got {cohort.shape}")
        if mean is not None:
            cohort = cohort - mean
        cohort = cohort / np.linalg.norm(cohort, axis=1, keepdims=True)
        # leaving each utterance's own speaker out (QMF's training trials) leaves one entry fewer
        room = cohort.shape[0] - (cohort_exclude is not None)
        if room < 1:
            raise ValueError(f"leaving a speaker out of the cohort needs more than {cohort.shape[0]} cohort entries")
        k = min(cohort_size, room)
        if k < cohort_size:
            log.warning(
                "cohort has %d entries, fewer than cohort_size=%d: using top-%d%s",
                cohort.shape[0],
                cohort_size,
                k,
                " (each trial's own speaker left out)" if cohort_exclude is not None else " (all)",
            )
        used = np.flatnonzero(have)
        mu = np.zeros(len(utts))
        sigma = np.ones(len(utts))
        excl = None
        if cohort_exclude is not None:
            excl = np.array([cohort_exclude.get(utts[i], -1) for i in used], dtype=np.int64)
        mu[used], sigma[used] = asnorm_stats(mat[used], cohort, k, exclude=excl)
        result.scores = 0.5 * ((raw - mu[e_idx]) / sigma[e_idx] + (raw - mu[t_idx]) / sigma[t_idx])
        result.score_norm = "asnorm"
        result.cohort_size = k
        result.enroll_mu, result.test_mu = mu[e_idx], mu[t_idx]
    return result


def write_scores(path: str | os.PathLike[str], result: ScoreResult) -> None:
    """Write ``utt1 utt2 score target|nontarget`` lines (trials order), atomically."""

    t = result.trials
    labels = ["target" if x else "nontarget" for x in t.target.tolist()]
    scores = result.scores.tolist()
    with atomic_write(path) as f:
        for start in range(0, len(t), 65536):
            stop = min(start + 65536, len(t))
            f.write("".join(f"{t.enroll[i]} {t.test[i]} {scores[i]:.6f} {labels[i]}\n" for i in range(start, stop)))
