"""Speaker identification (SID) on stage-5 embeddings: a seeded enrolment/test split, speaker
models, closed-set top-N accuracy and open-set detection-and-identification (DIR) at a FAR.

Guarantees:

* :func:`make_split` is a pure function of (spk2utt, K, seed, folds). A speaker's utterances are
  shuffled by a generator seeded from (seed, speaker id) alone, so adding or removing other
  speakers never changes which of its utterances enrol; the first K enrol, the rest are test
  utterances. Speakers with fewer than K + 1 utterances are left out and listed. Enrolment and
  test utterances are disjoint (checked again when a split is read back).
* A speaker model is the mean of the K L2-normalised enrolment embeddings, renormalised (what
  cosine scoring sees); a backend (``lda``) is fitted on the enrolment embeddings only, never on
  test utterances, and in the open-set folds only on the speakers enrolled in that fold.
* Open set: the speakers are dealt into ``folds`` seeded groups; fold f enrols every speaker
  outside group f, whose test utterances are the impostor trials. The threshold is the lowest
  value that lets at most ``floor(far * n_impostor)`` impostor trials through (accept when the
  best score is strictly above it), so the achieved FAR (reported) never exceeds the target.
  DIR(FAR) = fraction of known-speaker trials whose best-scoring speaker is right *and* above
  the threshold (ISO/IEC 19795-1's DIR; Kaldi, SpeechBrain and NeMo ship closed-set only).
* Every file is written atomically; a bad embedding or split line names file and line.

Design notes and the comparison with Kaldi, SpeechBrain and NeMo: egs/speechocean762/sid1/README.md.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError
from spkflow.score.backend import Backend, fit_backend, l2_rows

__all__ = [
    "Split",
    "closed_set",
    "enrol",
    "make_split",
    "open_set",
    "read_split",
    "threshold_at_far",
    "top_k_accuracy",
    "write_split",
]


# ----------------------------------------------------------------------------- split


@dataclass(frozen=True)
class Split:
    """Enrolment utterances per speaker, test utterances ``(utt, spk)``, open-set fold per speaker."""

    enrol: dict[str, list[str]]
    test: list[tuple[str, str]]
    fold: dict[str, int]
    dropped: list[str] = field(default_factory=list)

    @property
    def speakers(self) -> list[str]:
        return list(self.enrol)


def _speaker_rng(seed: int, spk: str) -> np.random.Generator:
    digest = hashlib.sha256(spk.encode("utf-8")).digest()
    return np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])


def make_split(spk2utt: Mapping[str, Sequence[str]], num_enrol: int, seed: int = 0, folds: int = 5) -> Split:
    """The documented split rule (module docstring). ``spk2utt`` order does not matter: speakers
    and utterances are taken in LC_ALL=C (byte) order before shuffling."""
    if num_enrol < 1:
        raise ValueError(f"num_enrol must be >= 1, got {num_enrol}")
    if folds < 2:
        raise ValueError(f"folds must be >= 2 (fold f holds out 1/folds of the speakers), got {folds}")
    enrol: dict[str, list[str]] = {}
    test: list[tuple[str, str]] = []
    dropped: list[str] = []
    for spk in sorted(spk2utt, key=str.encode):
        utts = sorted(spk2utt[spk], key=str.encode)
        if len(utts) < num_enrol + 1:
            dropped.append(spk)
            continue
        order = _speaker_rng(seed, spk).permutation(len(utts))
        enrol[spk] = sorted((utts[i] for i in order[:num_enrol]), key=str.encode)
        test.extend((utts[i], spk) for i in sorted(order[num_enrol:]))
    if len(enrol) < folds:
        raise ValueError(f"{len(enrol)} speakers with >= {num_enrol + 1} utterances: fewer than folds={folds}")
    perm = np.random.default_rng(seed).permutation(len(enrol))
    spks = list(enrol)
    fold = {spks[j]: i % folds for i, j in enumerate(perm)}
    test.sort(key=lambda us: us[0].encode())
    return Split(enrol, test, fold, dropped)


def write_split(split: Split, outdir: str | os.PathLike[str]) -> None:
    """``enrol`` and ``test`` (``utt spk``), ``folds`` (``spk fold``), ``dropped_spks``."""
    out = os.fspath(outdir)
    enrol_lines = sorted((f"{u} {s}\n" for s, us in split.enrol.items() for u in us), key=str.encode)
    write_text_atomic(os.path.join(out, "enrol"), "".join(enrol_lines))
    write_text_atomic(os.path.join(out, "test"), "".join(f"{u} {s}\n" for u, s in split.test))
    write_text_atomic(os.path.join(out, "folds"), "".join(f"{s} {f}\n" for s, f in split.fold.items()))
    write_text_atomic(os.path.join(out, "dropped_spks"), "".join(f"{s}\n" for s in split.dropped))


def _pairs(path: str) -> list[tuple[str, str, int]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            parts = line.split()
            if len(parts) != 2:
                raise InputError(path, n, f"expected two fields, got {line.rstrip()!r}")
            out.append((parts[0], parts[1], n))
    return out


def read_split(splitdir: str | os.PathLike[str]) -> Split:
    """Read what :func:`write_split` wrote; an utterance in both lists, twice in one, or a test
    speaker that is not enrolled names the file and line."""
    d = os.fspath(splitdir)
    enrol: dict[str, list[str]] = {}
    seen: dict[str, str] = {}
    for name in ("enrol", "test"):
        path = os.path.join(d, name)
        for utt, spk, n in _pairs(path):
            if utt in seen:
                raise InputError(
                    path, n, f"utterance {utt!r} already listed in {seen[utt]}: enrol/test must be disjoint"
                )
            seen[utt] = f"{name}:{n}"
            if name == "enrol":
                enrol.setdefault(spk, []).append(utt)
            elif spk not in enrol:
                raise InputError(path, n, f"speaker {spk!r} of {utt!r} has no enrolment utterance")
    enrol = {s: enrol[s] for s in sorted(enrol, key=str.encode)}  # speakers in LC_ALL=C order, as written
    test = [(u, s) for u, s, _ in _pairs(os.path.join(d, "test"))]
    fold = {}
    for spk, f, n in _pairs(os.path.join(d, "folds")):
        if spk not in enrol or not f.isdigit():
            raise InputError(
                os.path.join(d, "folds"), n, f"expected an enrolled speaker and a fold number, got {spk} {f}"
            )
        fold[spk] = int(f)
    missing = [s for s in enrol if s not in fold]
    if missing:
        raise InputError(os.path.join(d, "folds"), None, f"no fold for speakers {missing[:5]}")
    dropped_path = os.path.join(d, "dropped_spks")
    dropped = []
    if os.path.exists(dropped_path):
        with open(dropped_path, encoding="utf-8") as f:
            dropped = f.read().split()
    return Split(enrol, test, fold, dropped)


# ----------------------------------------------------------------------------- speaker models


def enrol(
    backend: Backend,
    emb: Mapping[str, np.ndarray],
    enrol_utts: Mapping[str, Sequence[str]],
    where: str = "embeddings",
) -> tuple[list[str], np.ndarray]:
    """Speaker models in the backend's space: mean of the transformed enrolment embeddings,
    renormalised. Returns (speakers, [S, D'])."""
    spks = list(enrol_utts)
    models = np.stack([backend.transform(gather(emb, enrol_utts[s], where)).mean(axis=0) for s in spks])
    return spks, l2_rows(models)


def gather(emb: Mapping[str, np.ndarray], utts: Iterable[str], where: str) -> np.ndarray:
    """Stack the embeddings of ``utts``; a missing one names ``where`` and the utterance."""
    utts = list(utts)
    missing = [u for u in utts if u not in emb]
    if missing:
        raise InputError(where, None, f"{len(missing)} utterances have no embedding, e.g. {missing[:3]}")
    return np.stack([emb[u] for u in utts])


# ----------------------------------------------------------------------------- metrics


def top_k_accuracy(scores: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Fraction of rows whose true column is among the ``k`` highest scores (ties count against)."""
    true_score = scores[np.arange(len(truth)), truth]
    rivals = (scores >= true_score[:, None]).sum(axis=1) - 1  # other speakers scoring as high or higher
    return float(np.mean(rivals < k))


def closed_set(
    backend: Backend,
    spks: Sequence[str],
    models: np.ndarray,
    emb: Mapping[str, np.ndarray],
    test: Sequence[tuple[str, str]],
    where: str = "embeddings",
) -> tuple[dict[str, float | int], np.ndarray, np.ndarray]:
    """Cosine of each test utterance to every speaker model. Returns (metrics, scores [T, S],
    true speaker index [T]); ``where`` (the scp) names the source of a missing embedding."""
    index = {s: i for i, s in enumerate(spks)}
    truth = np.array([index[s] for _, s in test])
    scores = backend.transform(gather(emb, (u for u, _ in test), where)) @ models.T
    metrics: dict[str, float | int] = {
        "top1": top_k_accuracy(scores, truth, 1),
        "top5": top_k_accuracy(scores, truth, 5),
        "n_speakers": len(spks),
        "n_test": len(test),
    }
    return metrics, scores, truth


def threshold_at_far(impostor: np.ndarray, far: float) -> tuple[float, float]:
    """(threshold, achieved FAR): accept when score > threshold; at most floor(far * n)
    impostor scores lie above it."""
    s = np.sort(np.asarray(impostor, dtype=np.float64))[::-1]
    if s.size == 0:
        raise ValueError("no impostor trials: the open-set threshold needs held-out speakers")
    allowed = math.floor(far * s.size + 1e-9)
    thr = float(s[min(allowed, s.size - 1)])
    return thr, float(np.mean(s > thr))


def open_set(
    backend_name: str,
    emb: Mapping[str, np.ndarray],
    split: Split,
    fars: Sequence[float] = (0.01, 0.05, 0.1),
    lda_dim: int = 0,
    where: str = "embeddings",
) -> tuple[dict[str, object], list[tuple[int, str, str, str, float, str]]]:
    """Open-set identification over the split's folds (module docstring). Returns (metrics,
    trials) with one trial per (fold, test utterance): fold, utt, true speaker, best enrolled
    speaker, best score, ``known`` | ``impostor``."""
    folds = sorted(set(split.fold.values()))
    trials: list[tuple[int, str, str, str, float, str]] = []
    for f in folds:
        gallery = {s: u for s, u in split.enrol.items() if split.fold[s] != f}
        utts = [u for s in gallery for u in gallery[s]]
        labels = [s for s in gallery for _ in gallery[s]]
        backend = fit_backend(backend_name, gather(emb, utts, where), labels, lda_dim)
        spks, models = enrol(backend, emb, gallery, where)
        scores = backend.transform(gather(emb, (u for u, _ in split.test), where)) @ models.T
        best = scores.argmax(axis=1)
        for (utt, spk), b, row in zip(split.test, best, scores, strict=True):
            kind = "impostor" if split.fold[spk] == f else "known"
            trials.append((f, utt, spk, spks[b], float(row[b]), kind))
    known = [t for t in trials if t[5] == "known"]
    imp = np.array([t[4] for t in trials if t[5] == "impostor"])
    k_score = np.array([t[4] for t in known])
    k_right = np.array([t[2] == t[3] for t in known])
    metrics: dict[str, object] = {
        "folds": len(folds),
        "n_known_trials": len(known),
        "n_impostor_trials": int(imp.size),
        "open_top1": float(k_right.mean()),
    }
    for far in fars:
        thr, achieved = threshold_at_far(imp, far)
        key = f"far{far * 100:g}".replace(".", "p")
        metrics[f"dir_at_{key}"] = float(np.mean(k_right & (k_score > thr)))
        metrics[f"threshold_at_{key}"] = thr
        metrics[f"achieved_{key}"] = achieved
    return metrics, trials


def confusion(truth: np.ndarray, pred: np.ndarray, n: int) -> np.ndarray:
    """Counts [true, predicted] over ``n`` speakers."""
    out = np.zeros((n, n), dtype=np.int64)
    np.add.at(out, (truth, pred), 1)
    return out
