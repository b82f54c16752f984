"""Verification trial lists: every target pair plus a seeded sample of non-target pairs.

A trial is an unordered pair of two different utterances, written once as
``utt1 utt2 target|nontarget`` with ``utt1 < utt2`` in ``LC_ALL=C`` order; the file is sorted
(``LC_ALL=C sort``) and has no duplicate pair and no self-pair.  Cosine scoring is symmetric,
so listing ``(b, a)`` next to ``(a, b)`` would only count the same comparison twice.

Guarantees of :func:`make_trials`:

* **all** target pairs (same speaker) are present: ``sum_s C(n_s, 2)`` of them, unless
  ``max_targets_per_spk`` caps them: a speaker with more keeps a seeded uniform sample of that
  many of its pairs (drawn from the pair indices, without listing the pairs, by a generator
  seeded from (seed, speaker): a speaker's choice does not depend on the others);
* non-target pairs are a uniform sample without replacement of all cross-speaker pairs, of size
  ``min(#non-target pairs, floor(nontarget_ratio * #targets))`` (all of them when there are
  fewer);
* the list is a pure function of (utterance -> speaker map, ratio, seed, max_per_spk,
  max_targets_per_spk): same inputs, same bytes, on any machine (numpy's PCG64 ``default_rng``);
* ``max_per_spk`` bounds a big set (a training set calibrating stage 6): each speaker keeps a
  seeded sample of that many utterances (chosen by a generator seeded from (seed, speaker), so a
  speaker's choice does not depend on the others) before pairs are made.

Why a cap (the commands' default, :data:`DEFAULT_MAX_TARGETS_PER_SPK`): every pair of a folder
of 4,000 recordings of 10 speakers is about 800,000 target trials (and ten times as many others)
where a few thousand measure an EER to a few tenths of a percent; VoxCeleb1-O, the list most
papers report, has 18,860 target trials over 40 speakers (472 per speaker on average, 1,040 at
most) and as many non-target ones.  500 per speaker keeps every pair of a speaker with up to 32
recordings (the shipped recipes' test sets: at most 40 per speaker, 780 pairs, are listed by
``prepare_corpus``, which does not cap).  The library's default stays every pair.

Anchor: the VoxCeleb1 trial lists and Kaldi's ``egs/sre*/`` trials (``utt1 utt2 target``,
each pair once).  Unlike lists sampled with Python's ``random`` over all O(n^2) pairs, the
sampler here draws pairs directly (rejection of same-speaker and repeated pairs), so a set
with 10^5 utterances never materialises its 5 * 10^9 pairs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

import numpy as np

from spkflow.core.errors import InputError
from spkflow.data.tables import c_key, read_lines, split_fields, write_lines

Trial = tuple[str, str, bool]  # (utt1, utt2, is_target), utt1 < utt2 in C order

#: target trials per speaker that ``make_trials`` and ``make_data_dir`` keep by default (module doc)
DEFAULT_MAX_TARGETS_PER_SPK = 500


def _ordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if c_key(a) < c_key(b) else (b, a)


def make_trials(
    utt2spk: Mapping[str, str],
    nontarget_ratio: float = 10.0,
    seed: int = 0,
    max_per_spk: int | None = None,
    max_targets_per_spk: int | None = None,
) -> list[Trial]:
    """All target pairs (at most ``max_targets_per_spk`` per speaker) and a seeded uniform sample
    of non-target pairs (see module doc), sorted like ``LC_ALL=C sort`` sorts the written lines."""
    if nontarget_ratio < 0:
        raise ValueError(f"nontarget_ratio must be >= 0, got {nontarget_ratio}")
    if max_targets_per_spk is not None and max_targets_per_spk < 1:
        raise ValueError(f"max_targets_per_spk must be >= 1, got {max_targets_per_spk}")
    if max_per_spk is not None:
        if max_per_spk < 2:
            raise ValueError(f"max_per_spk must be >= 2 (a target pair), got {max_per_spk}")
        utt2spk = _at_most_per_speaker(utt2spk, max_per_spk, seed)
    utts = sorted(utt2spk, key=c_key)
    n = len(utts)
    spk_names = sorted(set(utt2spk.values()), key=c_key)
    spk_index = {s: i for i, s in enumerate(spk_names)}
    spk = np.fromiter((spk_index[utt2spk[u]] for u in utts), dtype=np.int64, count=n)

    order = np.argsort(spk, kind="stable")  # utterances grouped by speaker, sorted inside
    bounds = np.flatnonzero(np.diff(spk[order])) + 1
    tgt_i: list[np.ndarray] = []
    tgt_j: list[np.ndarray] = []
    same_speaker = 0  # every same-speaker pair, listed or not
    for members in np.split(order, bounds):
        m = len(members)
        if m < 2:
            continue
        pairs = m * (m - 1) // 2
        same_speaker += pairs
        if max_targets_per_spk is not None and pairs > max_targets_per_spk:
            rng = np.random.default_rng([seed, _digest(spk_names[spk[members[0]]]), 1])
            a, b = _pairs_at(np.sort(rng.choice(pairs, size=max_targets_per_spk, replace=False)), m)
        else:
            a, b = np.triu_indices(m, k=1)
        tgt_i.append(members[a])
        tgt_j.append(members[b])
    ti = np.concatenate(tgt_i) if tgt_i else np.zeros(0, np.int64)
    tj = np.concatenate(tgt_j) if tgt_j else np.zeros(0, np.int64)
    num_target = len(ti)
    num_nontarget = n * (n - 1) // 2 - same_speaker
    want = min(num_nontarget, int(np.floor(nontarget_ratio * num_target + 1e-9)))
    ni, nj = _sample_nontarget(spk, want, num_nontarget, seed)

    # Line order of LC_ALL=C sort: utts are C-sorted and i < j, and ids contain no byte below
    # the separating space, so ordering by (i, j) is ordering by the text "utt_i utt_j ...".
    all_i, all_j = np.concatenate([ti, ni]), np.concatenate([tj, nj])
    is_target = np.concatenate([np.ones(num_target, bool), np.zeros(len(ni), bool)])
    rank = np.lexsort((all_j, all_i))
    trials = [
        (utts[i], utts[j], t)
        for i, j, t in zip(all_i[rank].tolist(), all_j[rank].tolist(), is_target[rank].tolist(), strict=True)
    ]
    if any(min(u) < " " for u in utts):  # control characters in ids: sort the text itself
        trials.sort(key=lambda t: c_key(format_trial(t)))
    return trials


def _digest(spk: str) -> int:
    return int.from_bytes(hashlib.sha256(spk.encode("utf-8")).digest()[:8], "little")


def _pairs_at(index: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (i < j) of ``m`` items at positions ``index`` of the row-major list of all
    ``C(m, 2)`` pairs (what ``np.triu_indices(m, k=1)`` lists), without listing them."""
    rows = np.arange(m - 1, dtype=np.int64)
    first = rows * (2 * m - rows - 1) // 2  # position of (i, i + 1)
    i = np.searchsorted(first, index, side="right") - 1
    return i, i + 1 + (index - first[i])


def _at_most_per_speaker(utt2spk: Mapping[str, str], k: int, seed: int) -> dict[str, str]:
    """A seeded sample of at most ``k`` utterances per speaker (of the C-sorted utterances)."""
    by_spk: dict[str, list[str]] = {}
    for u in sorted(utt2spk, key=c_key):
        by_spk.setdefault(utt2spk[u], []).append(u)
    keep: dict[str, str] = {}
    for spk, utts in by_spk.items():
        if len(utts) > k:
            pick = np.random.default_rng([seed, _digest(spk)]).choice(len(utts), size=k, replace=False)
            utts = [utts[i] for i in sorted(pick)]
        keep.update((u, spk) for u in utts)
    return keep


def _sample_nontarget(spk: np.ndarray, want: int, available: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``want`` distinct index pairs (i < j) with different speakers, uniformly at random."""
    n = len(spk)
    if want <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rng = np.random.default_rng(seed)
    if want * 2 >= available:
        # dense case: enumerate the (at most 2 * want) non-target pairs, then choose
        ii, jj = np.triu_indices(n, k=1)
        keep = spk[ii] != spk[jj]
        ii, jj = ii[keep], jj[keep]
        pick = rng.choice(len(ii), size=want, replace=False)
        return ii[pick].astype(np.int64), jj[pick].astype(np.int64)
    # sparse case: draw ordered pairs uniformly, drop same-speaker pairs, keep the first
    # occurrence of each unordered pair (i * n + j code) until ``want`` are collected
    codes = np.zeros(0, np.int64)
    while len(codes) < want:
        batch = max(1024, int(1.5 * (want - len(codes))) + 64)
        a = rng.integers(0, n, size=batch)
        b = rng.integers(0, n, size=batch)
        keep = spk[a] != spk[b]  # also drops a == b
        lo, hi = np.minimum(a[keep], b[keep]), np.maximum(a[keep], b[keep])
        codes = np.concatenate([codes, lo.astype(np.int64) * n + hi])
        _, first = np.unique(codes, return_index=True)
        codes = codes[np.sort(first)][:want]
    return codes // n, codes % n


def format_trial(t: Trial) -> str:
    return f"{t[0]} {t[1]} {'target' if t[2] else 'nontarget'}"


def write_trials(path: str | os.PathLike[str], trials: list[Trial]) -> None:
    """Write ``trials`` atomically, one ``utt1 utt2 target|nontarget`` per line, C-sorted."""
    lines = sorted((format_trial(t) + "\n" for t in trials), key=c_key)
    write_lines(path, lines)


def read_trials(path: str | os.PathLike[str], utts: Mapping[str, object] | None = None) -> list[Trial]:
    """Read a trials file; InputError (file:line) on a malformed line, a self-pair, a repeated
    pair (in either order) or, when ``utts`` is given, an utterance not in it."""
    out: list[Trial] = []
    seen: dict[tuple[str, str], int] = {}
    for n, line in enumerate(read_lines(path), 1):
        f = split_fields(line)
        if len(f) != 3 or f[2] not in ("target", "nontarget"):
            raise InputError(path, n, f"expected 'utt1 utt2 target|nontarget', got {line.rstrip()!r}")
        if f[0] == f[1]:
            raise InputError(path, n, f"trial compares {f[0]!r} with itself")
        key = _ordered(f[0], f[1])
        if key in seen:
            raise InputError(path, n, f"pair {f[0]} {f[1]} already listed on line {seen[key]}")
        seen[key] = n
        if utts is not None:
            for u in f[:2]:
                if u not in utts:
                    raise InputError(path, n, f"utterance {u!r} is not in the data dir")
        out.append((f[0], f[1], f[2] == "target"))
    return out
