"""N x M batch plans from a spk2utt file: exhaustive, deterministic, distributed, resumable.

A GE2E-family loss wants batches of N distinct speakers with M utterances each, in
speaker-major order.  :func:`plan_epoch` plans one whole epoch at once, vectorised in
numpy; :class:`NxMBatchSampler` serves the plan to a ``torch.utils.data.DataLoader``;
``python -m spkflow.bin.make_batches`` writes it as a batch-list file (one batch per
line, N*M utterance ids, speaker-major).

Guarantees (each is tested with hypothesis on random spk2utt shapes in
``test/train/test_batches_properties.py``):

a. Every batch holds exactly N distinct speakers and M distinct utterances of each,
   speaker-major (the M utterances of its first speaker, then the second, ...).  With
   ``short_speakers="repeat"`` a speaker with fewer than M utterances is the one
   exception to "distinct utterances": see b.
b. Within an epoch no utterance is used twice.  A speaker with fewer than M utterances
   is dropped (``"drop"``, the default) or, with ``"repeat"``, enters the epoch at most
   once, with all of its utterances filled up to M by drawing from them with
   replacement.
   Either count is reported (``EpochPlan.stats``, the command's stderr).
c. Coverage: each speaker s offers floor(n_s / M) groups of M utterances (its
   utterances are reshuffled every epoch, so the n_s mod M left over change).  The
   plan packs the largest number B of batches that is possible at all: B is the
   largest number with sum_s min(groups_s, B) >= N * B (a speaker can be in a batch
   only once), so fewer than N groups are left over unless a speaker holds more than
   B groups.  ``stats.coverage`` = groups used / groups offered = utterances used /
   sum_s M * floor(n_s / M).  On VoxCeleb2-dev-like skew it is above 99.9%
   (``test/bench/bench_batches.py``).
d. The plan is a pure function of (spk2utt, N, M, seed, epoch, world size, rank,
   short-speaker policy).  Speakers are put in LC_ALL=C order first, so the order of
   the lines does not matter; the order of the utterances within a line does (Kaldi
   writes them sorted).  All randomness is the raw 64-bit output of numpy's PCG64 bit
   generator seeded by ``SeedSequence([seed, epoch, purpose])``, turned into
   permutations by sorting distinct integer keys and into bounded integers by integer
   multiply-shift.  Both algorithms are fixed by their published definitions; no
   ``Generator`` method (whose streams NEP 19 lets numpy change between versions), no
   floating point, no Python ``random`` or ``hash()``.  So the same inputs give the
   same plan on any machine, numpy >= 1.17 and Python version.  Different epochs
   reshuffle the utterance groups and the speaker combinations.
e. Distributed: the global plan of an epoch does not depend on the world size; rank r
   of W gets the global batches r, r + W, r + 2W, ... (the lines r::W of the W = 1
   batch list), cut to floor(B / W) batches, so ranks are disjoint and all have the
   same number of batches.  The B mod W remainder batches are dropped and reported.
f. Resume: the sampler state is (seed, epoch, position = batches yielded).  Loading a
   state computes the epoch's plan once - the same O(total) vectorised pass as
   starting the epoch, about 0.1 s on VoxCeleb2 - and then starts at row ``position``
   of the plan array, O(1).  No earlier batch is rebuilt, yielded, or turned into
   utterance ids, and no random draw depends on how many batches were consumed.
g. :func:`crop_frames` gives the per-batch crop length (GE2E draws one segment length
   per batch) as a pure function of (seed, epoch, batch index), from its own seed
   stream, so it never depends on the plan or on which batches were skipped.

How the packing reaches c, and how this compares with pytorch-metric-learning,
voxceleb_trainer, ESPnet and lhotse samplers: docs/batches.md.

Epochs are numbered from 1 in recipes (ESPnet convention; ``egs/*/spk1`` stage 3
writes ``epoch1.txt`` ... ``epoch<num_epochs>.txt``); the planner accepts any epoch >= 0.

The planner, its counter-based random streams, the batch-list files and the sampler are one
concern and share private helpers (``_Stream``, ``_rank_plan``, ``_check_params``); the
spk2utt table they plan from is :mod:`spkflow.train.spk2utt`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError
from spkflow.train.spk2utt import Spk2Utt, as_spk2utt

__all__ = [
    "PlanStats",
    "EpochPlan",
    "NxMBatchSampler",
    "plan_epoch",
    "plan_table",
    "num_batches",
    "crop_frames",
    "read_batch_list",
    "write_batch_list",
    "rank_share",
    "format_summary",
    "SHORT_SPEAKER_POLICIES",
]

SHORT_SPEAKER_POLICIES = ("drop", "repeat")

# Purposes mixed into the seed so that the streams of the plan and of the crop
# lengths never overlap ("plan" and "crop" in ASCII).
_PURPOSE_PLAN = 0x706C616E
_PURPOSE_CROP = 0x63726F70

_U64 = np.uint64
_CHUNK = 1 << 18  # elements per chunk of the large vectorised passes


# --------------------------------------------------------------------------- randomness


def _check_nonneg_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


class _Stream:
    """Raw 64-bit words of PCG64 seeded by SeedSequence(words); nothing else of numpy.random."""

    def __init__(self, *words: int) -> None:
        self._bg = np.random.PCG64(np.random.SeedSequence([int(w) for w in words]))

    def raw(self, n: int) -> np.ndarray:
        return self._bg.random_raw(int(n)).astype(_U64, copy=False) if n else np.zeros(0, _U64)

    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random permutation of range(n): sort distinct keys (random high bits, index low bits)."""
        if n <= 1:
            return np.arange(n, dtype=np.int64)
        bits = int(n - 1).bit_length()
        keys = (self.raw(n) >> _U64(bits)) << _U64(bits)
        keys |= np.arange(n, dtype=_U64)
        keys.sort()
        return (keys & _U64((1 << bits) - 1)).astype(np.int64)

    def below(self, bounds: np.ndarray) -> np.ndarray:
        """One integer uniformly in [0, bound) per bound (bound < 2**32), by 32x32-bit multiply-shift."""
        hi = self.raw(len(bounds)) >> _U64(32)
        return ((hi * bounds.astype(_U64)) >> _U64(32)).astype(np.int64)


def crop_frames(seed: int, epoch: int, batch_index: int, min_frames: int, max_frames: int) -> int:
    """Crop length in frames, uniform in [min_frames, max_frames], for one batch.

    A pure function of (seed, epoch, batch_index) and the bounds (guarantee g).
    ``batch_index`` is the 0-based position of the batch in the list the loader walks
    (the line number - 1 in a batch-list file, a rank's own position under DDP, so all
    ranks crop their k-th batch to the same length and step in lockstep).
    """
    seed = _check_nonneg_int("seed", seed)
    epoch = _check_nonneg_int("epoch", epoch)
    batch_index = _check_nonneg_int("batch_index", batch_index)
    if (
        isinstance(min_frames, bool)
        or isinstance(max_frames, bool)
        or int(min_frames) != min_frames
        or int(max_frames) != max_frames
        or not 1 <= min_frames <= max_frames
    ):
        raise ValueError(f"need 1 <= min_frames <= max_frames, got {min_frames!r}, {max_frames!r}")
    span = int(max_frames) - int(min_frames) + 1
    if span == 1:  # a fixed length: the draw could give nothing else (a seeded stream costs ~30 us)
        return int(min_frames)
    word = int(_Stream(seed, epoch, _PURPOSE_CROP, batch_index).raw(1)[0])
    return int(min_frames) + ((word * span) >> 64)


# --------------------------------------------------------------------------- planning


@dataclasses.dataclass(frozen=True)
class PlanStats:
    """What an epoch plan used and left out (global over ranks unless said otherwise)."""

    num_utt: int  # M
    num_speakers: int  # speakers in spk2utt
    num_utts: int  # utterances in spk2utt
    eligible_speakers: int  # speakers that enter the epoch (>= M utterances, or repeated)
    dropped_speakers: int  # speakers with < M utterances left out ("drop")
    repeated_speakers: int  # speakers with < M utterances filled by repetition ("repeat")
    groups_possible: int  # sum_s floor(n_s / M) (+1 per repeated speaker)
    groups_used: int  # groups in the batches of all ranks
    batches_global: int  # B: batches the packing made before the rank split
    batches_per_rank: int  # floor(B / W)
    remainder_batches_dropped: int  # B mod W
    utts_used: int  # distinct real utterances in the batches of all ranks

    @property
    def utts_possible(self) -> int:
        """The denominator of the coverage: M * groups_possible."""
        return self.num_utt * self.groups_possible

    @property
    def coverage(self) -> float:
        """groups used / groups possible (= utterances used / sum_s M * floor(n_s / M) under "drop")."""
        return self.groups_used / self.groups_possible if self.groups_possible else 0.0


@dataclasses.dataclass(frozen=True, eq=False)
class EpochPlan:
    """One rank's batches of one epoch.

    ``indices[i]`` are the N*M utterance positions (into ``table.utts``) of batch i,
    speaker-major; ``batches`` gives the same as utterance ids.
    """

    table: Spk2Utt
    indices: np.ndarray
    num_spk: int
    num_utt: int
    seed: int
    epoch: int
    world_size: int
    rank: int
    short_speakers: str
    stats: PlanStats

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    @property
    def batches(self) -> list[list[str]]:
        """All batches as lists of utterance ids (built on first use, then cached)."""
        b = self.__dict__.get("_batches")
        if b is None:
            b = self.table.utt_array()[self.indices].tolist()
            object.__setattr__(self, "_batches", b)
        return b

    def batch(self, i: int) -> list[str]:
        """Batch ``i`` as utterance ids, without building the others."""
        return self.table.utt_array()[self.indices[i]].tolist()

    def batch_speakers(self, i: int) -> list[str]:
        """The N speakers of batch ``i``, in batch order."""
        spk = np.searchsorted(self.table.offsets, self.indices[i, :: self.num_utt], side="right") - 1
        return [self.table.speakers[s] for s in spk]


def _check_params(num_spk: int, num_utt: int, world_size: int, rank: int, short_speakers: str) -> None:
    for name, v in (("num_spk", num_spk), ("num_utt", num_utt), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")
    if short_speakers not in SHORT_SPEAKER_POLICIES:
        raise ValueError(f"short_speakers must be one of {SHORT_SPEAKER_POLICIES}, got {short_speakers!r}")


def _groups(counts: np.ndarray, num_utt: int, short_speakers: str) -> np.ndarray:
    groups = counts // num_utt
    if short_speakers == "repeat":
        groups = np.where(counts < num_utt, 1, groups)
    return groups


def _max_batches(groups: np.ndarray, num_spk: int) -> int:
    """Largest B with sum_s min(groups_s, B) >= num_spk * B (0 if none).

    sum_s min(g_s, B) / B does not increase with B, so the feasible B form a prefix
    and a binary search finds its end.
    """
    lo, hi = 0, int(groups.sum()) // num_spk
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.minimum(groups, mid).sum()) >= num_spk * mid:
            lo = mid
        else:
            hi = mid - 1
    return lo


def num_batches(
    spk2utt: Spk2Utt | Mapping[str, Sequence[str]] | str | os.PathLike[str],
    num_spk: int,
    num_utt: int,
    world_size: int = 1,
    short_speakers: str = "drop",
) -> int:
    """Batches each rank gets per epoch (the same for every epoch and seed)."""
    table = as_spk2utt(spk2utt)
    _check_params(num_spk, num_utt, world_size, 0, short_speakers)
    return _max_batches(_groups(table.counts, num_utt, short_speakers), num_spk) // world_size


def _plan_global(
    table: Spk2Utt, num_spk: int, num_utt: int, seed: int, epoch: int, short_speakers: str
) -> tuple[np.ndarray, np.ndarray]:
    """The epoch's global plan: ([B, N*M] utterance positions, groups per speaker)."""
    N, M = num_spk, num_utt
    counts = table.counts
    S, U = table.num_speakers, table.num_utts
    groups = _groups(counts, M, short_speakers)
    eligible = int(np.count_nonzero(groups))
    if eligible < N:
        why = f"at least {M} utterances" if short_speakers == "drop" else "utterances"
        raise InputError(table.path, None, f"--num-spk {N} is more than the {eligible} speakers with {why}")
    B = _max_batches(groups, N)
    rs = _Stream(seed, epoch, _PURPOSE_PLAN)

    # 1. Shuffle every speaker's utterances: one sort of distinct 64-bit keys
    #    (speaker | random | position), so the result does not depend on numpy's sort
    #    algorithm.  The random field has 64 - sbits - ubits >= 16 bits (30 at
    #    VoxCeleb2 scale); ties in it keep file order, a bias below n_s / 2**bits.
    sbits, ubits = max(int(S - 1).bit_length(), 1), max(int(U - 1).bit_length(), 1)
    rbits = 64 - sbits - ubits
    if rbits >= 16:
        keys = table.speaker_of().view(_U64)
        keys <<= _U64(64 - sbits)
        for lo in range(0, U, _CHUNK):  # chunks keep temporaries small and cache-warm
            hi = min(lo + _CHUNK, U)
            r = rs.raw(hi - lo)
            r >>= _U64(64 - rbits)
            r <<= _U64(ubits)
            r |= np.arange(lo, hi, dtype=_U64)
            keys[lo:hi] |= r
        keys.sort()
        keys &= _U64((1 << ubits) - 1)
        pool = keys.view(np.int64)
    else:  # beyond any corpus we know: a two-key stable sort gives the same kind of result
        pool = np.lexsort((rs.raw(U), table.speaker_of())).astype(np.int64)
    seg_start = table.offsets[:-1].copy()

    # 1b. "repeat": a short speaker's single group = its utterances, then draws among them.
    short = np.flatnonzero(counts < M) if short_speakers == "repeat" else np.zeros(0, np.int64)
    if short.size:
        n_s = counts[short]
        J = np.arange(M, dtype=np.int64)[None, :]
        own = pool[table.offsets[short][:, None] + np.minimum(J, n_s[:, None] - 1)]
        draws = table.offsets[short][:, None] + rs.below(np.repeat(n_s, M)).reshape(short.size, M)
        fill = np.where(J < n_s[:, None], own, draws)
        seg_start[short] = U + np.arange(short.size, dtype=np.int64) * M
        pool = np.concatenate([pool, fill.ravel()])

    # 2. Groups each speaker gives: at most B, and E < N more dropped at random.
    cap = np.minimum(groups, B)
    excess = int(cap.sum()) - N * B
    if excess:
        gspk = np.repeat(np.arange(S, dtype=np.int64), cap)
        drop = rs.permutation(gspk.size)[:excess]
        cap = cap - np.bincount(gspk[drop], minlength=S)
    # 3. Speakers in random order, as consecutive runs of N rows x B columns.
    order = rs.permutation(S)
    order = order[cap[order] > 0]
    run = cap[order]
    start = np.zeros(order.size, dtype=np.int64)
    np.cumsum(run[:-1], out=start[1:])
    # 4. A random permutation of the batches per row; a run wrapping into the next row
    #    continues on batches it has not used in this row (McNaughton wrap-around).
    sigma = np.empty((N, B), dtype=np.int64)
    sigma[0] = rs.permutation(B)
    for k in range(1, N):
        p0 = k * B
        i = int(np.searchsorted(start, p0, side="right")) - 1
        s0, s1 = int(start[i]), int(start[i] + run[i])
        prev = sigma[k - 1]
        if s0 < p0 < s1:
            a, r = s0 - (k - 1) * B, s1 - p0  # r <= a because run <= B
            head = prev[:a][rs.permutation(a)]
            rest = np.concatenate([head[r:], prev[a:]])
            sigma[k, :r] = head[:r]
            sigma[k, r:] = rest[rs.permutation(rest.size)]
        else:
            sigma[k] = prev[rs.permutation(B)]
    slot_spk = np.repeat(order, run)
    slot_group = np.arange(N * B, dtype=np.int64) - np.repeat(start, run)
    # 5. Batch-major: every row of sigma holds each batch once, so the slot in row k of
    #    batch b is found by a scatter, not a sort; then the N speakers of each batch are
    #    put in random order (a per-row sort of N random keys).
    grid = np.empty((B, N), dtype=np.int64)
    grid[sigma, np.arange(N, dtype=np.int64)[:, None]] = np.arange(N * B, dtype=np.int64).reshape(N, B)
    nbits = max(int(N - 1).bit_length(), 1)
    within = (rs.raw(N * B).reshape(B, N) >> _U64(nbits)) << _U64(nbits)
    within |= np.arange(N, dtype=_U64)[None, :]
    within.sort(axis=1)
    slots = np.take_along_axis(grid, (within & _U64((1 << nbits) - 1)).astype(np.int64), axis=1).ravel()
    del grid, within
    base = seg_start[slot_spk[slots]] + slot_group[slots] * M
    indices = np.empty((B * N, M), dtype=np.int64)
    step = max(_CHUNK // M, 1)
    for lo in range(0, B * N, step):
        np.take(pool, base[lo : lo + step, None] + np.arange(M, dtype=np.int64)[None, :], out=indices[lo : lo + step])
    return indices.reshape(B, N * M), groups


def plan_table(table: Spk2Utt, num_spk: int, num_utt: int, seed: int, epoch: int) -> np.ndarray:
    """The ``[B, N*M]`` utterance positions (into ``table.utts``) of one global plan, short
    speakers dropped: the packing of :func:`plan_epoch` for planners that plan parts of a set
    one by one (:mod:`spkflow.train.shard_plan`)."""
    _check_params(num_spk, num_utt, 1, 0, "drop")
    return _plan_global(table, int(num_spk), int(num_utt), int(seed), int(epoch), "drop")[0]


def plan_epoch(
    spk2utt: Spk2Utt | Mapping[str, Sequence[str]] | str | os.PathLike[str],
    num_spk: int,
    num_utt: int,
    seed: int,
    epoch: int,
    world_size: int = 1,
    rank: int = 0,
    short_speakers: str = "drop",
) -> EpochPlan:
    """Plan one epoch of ``num_spk`` x ``num_utt`` batches for ``rank`` of ``world_size``.

    ``spk2utt`` is a :class:`Spk2Utt`, a path to a spk2utt file, or a mapping
    ``{speaker: [utterance, ...]}``.  Raises :class:`~spkflow.core.errors.InputError` for bad
    input (including more speakers per batch than eligible speakers, or fewer batches
    than ranks) and ``ValueError`` for bad parameters.  See the module docstring for
    what the plan guarantees.
    """
    _check_params(num_spk, num_utt, world_size, rank, short_speakers)
    seed = _check_nonneg_int("seed", seed)
    epoch = _check_nonneg_int("epoch", epoch)
    table = as_spk2utt(spk2utt)
    indices, groups = _plan_global(table, int(num_spk), int(num_utt), seed, epoch, short_speakers)
    return _rank_plan(
        table, indices, groups, int(num_spk), int(num_utt), seed, epoch, int(world_size), int(rank), short_speakers
    )


def _rank_plan(
    table: Spk2Utt,
    indices: np.ndarray,
    groups: np.ndarray,
    N: int,
    M: int,
    seed: int,
    epoch: int,
    W: int,
    rank: int,
    short_speakers: str,
) -> EpochPlan:
    B = indices.shape[0]
    per_rank = B // W
    if per_rank == 0:
        raise InputError(table.path, None, f"only {B} batches of {N} x {M} per epoch, fewer than the {W} ranks")
    counts = table.counts
    n_short = int(np.count_nonzero(counts < M))
    used = indices[: per_rank * W]
    stats = PlanStats(
        num_utt=M,
        num_speakers=table.num_speakers,
        num_utts=table.num_utts,
        eligible_speakers=int(np.count_nonzero(groups)),
        dropped_speakers=n_short if short_speakers == "drop" else 0,
        repeated_speakers=n_short if short_speakers == "repeat" else 0,
        groups_possible=int(groups.sum()),
        groups_used=per_rank * W * N,
        batches_global=B,
        batches_per_rank=per_rank,
        remainder_batches_dropped=B - per_rank * W,
        utts_used=int(np.unique(used).size) if short_speakers == "repeat" else int(used.size),
    )
    mine = np.ascontiguousarray(indices[rank : per_rank * W : W])
    return EpochPlan(
        table=table,
        indices=mine,
        num_spk=N,
        num_utt=M,
        seed=seed,
        epoch=epoch,
        world_size=W,
        rank=rank,
        short_speakers=short_speakers,
        stats=stats,
    )


def format_summary(plan: EpochPlan) -> str:
    """One line for logs: batches, coverage, dropped or repeated speakers, remainder batches."""
    s = plan.stats
    parts = [
        f"epoch {plan.epoch} seed {plan.seed}: {len(plan)} batches of {plan.num_spk} x {plan.num_utt}"
        f" for rank {plan.rank} of {plan.world_size}",
        f"coverage {100.0 * s.coverage:.2f}% ({s.groups_used * plan.num_utt} of {s.utts_possible} utterances"
        f" in full groups; {s.utts_used} of {s.num_utts} utterances used)",
    ]
    if plan.short_speakers == "drop":
        parts.append(f"speakers with < {plan.num_utt} utterances dropped: {s.dropped_speakers}")
    else:
        parts.append(f"speakers with < {plan.num_utt} utterances repeated: {s.repeated_speakers}")
    parts.append(f"remainder batches dropped for equal ranks: {s.remainder_batches_dropped}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- batch-list files


def write_batch_list(path: str | os.PathLike[str], plan: EpochPlan) -> None:
    """Write ``plan`` atomically: one batch per line, N*M ids separated by spaces."""
    ids = plan.table.utt_array()
    with atomic_write(path) as f:
        step = 256
        for i in range(0, len(plan), step):
            rows = ids[plan.indices[i : i + step]]
            f.write("".join(" ".join(r) + "\n" for r in rows.tolist()))


def read_batch_list(path: str | os.PathLike[str], batch_size: int | None = None) -> list[list[str]]:
    """Read a batch-list file: one batch per line, utterance ids separated by spaces.

    All lines must have the same number of ids (``batch_size`` when given); an empty line
    or a line of another length is an :class:`~spkflow.core.errors.InputError` naming it.
    """
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    batches: list[list[str]] = []
    for lineno, line in enumerate(lines, start=1):
        toks = line.split()
        if not toks:
            raise InputError(path, lineno, "empty line")
        if batch_size is None:
            batch_size = len(toks)
        elif len(toks) != batch_size:
            raise InputError(path, lineno, f"{len(toks)} utterance ids, expected {batch_size}")
        batches.append(toks)
    return batches


def rank_share(batches: Sequence[Any], world_size: int, rank: int) -> list[Any]:
    """Rank ``rank``'s share of one epoch's single-rank batch list (guarantee e).

    ``rank_share(plan_epoch(..., world_size=1).batches, W, r)`` equals
    ``plan_epoch(..., world_size=W, rank=r).batches``: batches r, r + W, ..., cut so that
    every rank has ``len(batches) // W``.  A DDP trainer reading stage 3's
    ``epoch<E>.txt`` takes its share with this.
    """
    _check_params(1, 1, world_size, rank, "drop")
    per_rank = len(batches) // world_size
    return list(batches[rank : per_rank * world_size : world_size])


# --------------------------------------------------------------------------- sampler


class NxMBatchSampler:
    """A DataLoader ``batch_sampler`` yielding N x M batches of utterance ids (or positions).

    >>> sampler = NxMBatchSampler("data/train/spk2utt", num_spk=64, num_utt=10, seed=0)  # doctest: +SKIP
    >>> loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=...)           # doctest: +SKIP
    >>> for epoch in range(start_epoch, num_epochs + 1):                                # doctest: +SKIP
    ...     sampler.set_epoch(epoch)
    ...     for step, batch in enumerate(loader): ...
    ...     ckpt["sampler"] = sampler.state_dict(position=step + 1)

    Each item is a ``list[str]`` of N*M utterance ids, speaker-major, so a map-style
    dataset keyed by utterance id (``dataset[utt_id]``) works unchanged; with
    ``yield_indices=True`` it is a ``list[int]`` of positions in ``sampler.table.utts``.
    It does not subclass ``torch.utils.data.Sampler`` so that importing it (and the
    make_batches command) does not import torch; the DataLoader only needs
    ``__iter__`` and ``__len__``.

    State: ``state_dict()`` is ``{"seed", "epoch", "position"}`` plus the settings it
    must be restored with (checked on load).  ``position`` counts batches yielded in the
    current epoch; with DataLoader workers the iterator runs ahead of training, so pass
    the number of finished steps: ``state_dict(position=steps_done)``.  After
    ``load_state_dict`` the next iteration starts at batch ``position`` without rebuilding
    the batches before it (guarantee f).  ``set_epoch(e)`` with a new ``e`` starts that
    epoch at 0; with the current epoch it keeps the position, so "load state, then
    ``set_epoch(saved epoch)``" resumes.  Iterating an epoch that was finished starts
    it over.
    """

    def __init__(
        self,
        spk2utt: Spk2Utt | Mapping[str, Sequence[str]] | str | os.PathLike[str],
        num_spk: int,
        num_utt: int,
        seed: int = 0,
        epoch: int = 1,
        world_size: int = 1,
        rank: int = 0,
        short_speakers: str = "drop",
        yield_indices: bool = False,
    ) -> None:
        _check_params(num_spk, num_utt, world_size, rank, short_speakers)
        self.table = as_spk2utt(spk2utt)
        self.num_spk, self.num_utt = int(num_spk), int(num_utt)
        self.world_size, self.rank = int(world_size), int(rank)
        self.short_speakers = short_speakers
        self.seed = _check_nonneg_int("seed", seed)
        self.epoch = _check_nonneg_int("epoch", epoch)
        self.position = 0
        self.yield_indices = yield_indices
        self._len = num_batches(self.table, self.num_spk, self.num_utt, self.world_size, short_speakers)
        self._plan: EpochPlan | None = None
        if self._len == 0:
            self._make_plan()  # raises the InputError that says why

    def __len__(self) -> int:
        return self._len

    @property
    def plan(self) -> EpochPlan:
        """This rank's plan of the current epoch (computed once per epoch)."""
        if self._plan is None or self._plan.epoch != self.epoch or self._plan.seed != self.seed:
            self._plan = self._make_plan()
        return self._plan

    def _make_plan(self) -> EpochPlan:
        return plan_epoch(
            self.table,
            self.num_spk,
            self.num_utt,
            self.seed,
            self.epoch,
            self.world_size,
            self.rank,
            self.short_speakers,
        )

    def set_epoch(self, epoch: int) -> None:
        epoch = _check_nonneg_int("epoch", epoch)
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def __iter__(self) -> Iterator[list[str]] | Iterator[list[int]]:
        plan = self.plan
        if self.position >= len(plan):
            self.position = 0
        for i in range(self.position, len(plan)):
            self.position = i + 1
            yield plan.indices[i].tolist() if self.yield_indices else plan.batch(i)

    def crop_frames(self, batch_index: int, min_frames: int, max_frames: int) -> int:
        """:func:`crop_frames` for batch ``batch_index`` of the current epoch."""
        return crop_frames(self.seed, self.epoch, batch_index, min_frames, max_frames)

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        pos = self.position if position is None else int(position)
        if not 0 <= pos <= self._len:
            raise ValueError(f"position must be in [0, {self._len}], got {position!r}")
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": pos,
            "num_spk": self.num_spk,
            "num_utt": self.num_utt,
            "world_size": self.world_size,
            "short_speakers": self.short_speakers,
            "num_batches": self._len,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in ("num_spk", "num_utt", "world_size", "short_speakers", "num_batches"):
            if key in state and state[key] != getattr(self, key if key != "num_batches" else "_len"):
                raise ValueError(
                    f"sampler state has {key}={state[key]!r} but this sampler has "
                    f"{getattr(self, key if key != 'num_batches' else '_len')!r}"
                )
        position = int(state["position"])
        if not 0 <= position <= self._len:
            raise ValueError(f"sampler state position {position} is outside [0, {self._len}]")
        self.seed = _check_nonneg_int("seed", state["seed"])
        self.epoch = _check_nonneg_int("epoch", state["epoch"])
        self.position = position
