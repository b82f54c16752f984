"""N x M batch plans that a loader can serve by reading shards front to back.

:func:`plan_shard_epoch` plans one epoch over a shard set (:mod:`spkflow.data.shards`): the
shards are put in a random order per (seed, epoch), cut into consecutive *windows* of ``pool``
shards, and each window's utterances are planned with the random-access planner
(:mod:`spkflow.train.batches`, its packing and guarantees a, b and g within the window).  A batch
then only needs the shards of its window, so a loader holds at most ``pool`` shards (plus what
it prefetches) and reads every shard once per epoch, in order.  With ``streams`` S > 1 the
windows are dealt to S streams and the batch list interleaves them (line i is batch i // S of
stream i % S): with S = ranks x loader workers, each worker of each rank reads its own shards.

The six guarantees of the random-access plan, here:

a. N distinct speakers x M distinct utterances, speaker-major: kept (the same packing).
b. Each utterance at most once per epoch: kept (windows are disjoint).
c. Coverage: **weaker**.  A speaker can fill a group only with the utterances it has in the
   window, and a batch only with speakers of its window, so fewer groups are possible than over
   the whole set; streams are cut to the shortest.  Printed per epoch like stage 3's
   (``coverage``, utterances in batches / those the random-access plan could use); measured in
   ``test/bench/bench_slow_storage.py`` and docs/batches.md.
d. Deterministic: a pure function of (shard plan, spk2utt, N, M, seed, epoch, pool, streams);
   every random draw is the random-access planner's own or a PCG64 stream seeded by SeedSequence
   of (seed, epoch, purpose, window).  Ranks take lines r::W as today, so a rank's batches are a
   function of (seed, epoch, rank) too.
e. Disjoint ranks: kept (a rank's share of the list, :func:`spkflow.train.batches.rank_share`).
f. Exact resume at batch k: kept; the loader reads only the shards batch k onward needs.
Different grouping every epoch: the window order and every window's plan change with the
epoch; which utterances *can* meet is limited to those sharing a window.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from spkflow.core.errors import InputError
from spkflow.train.batches import EpochPlan, PlanStats, plan_table
from spkflow.train.spk2utt import Spk2Utt, as_spk2utt

__all__ = ["plan_shard_epoch", "read_utt2shard"]

_PURPOSE_ORDER = 0x73686470  # "shdp": shard order per epoch
_PURPOSE_WINDOW = 0x7368646D  # seeds of the windows' plans


def read_utt2shard(path: str | os.PathLike[str]) -> dict[str, str]:
    """``utt -> shard name`` from a shard folder's ``utt2shard``."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2:
                raise InputError(path, lineno, f"expected '<utt> <shard>', got '{line.strip()}'")
            out[parts[0]] = parts[1]
    return out


def _word(*words: int) -> int:
    return int(np.random.SeedSequence(list(words)).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def plan_shard_epoch(
    spk2utt: Spk2Utt | Mapping[str, Sequence[str]] | str | os.PathLike[str],
    utt2shard: Mapping[str, str],
    num_spk: int,
    num_utt: int,
    seed: int,
    epoch: int,
    pool: int = 8,
    streams: int = 1,
    world_size: int = 1,
    rank: int = 0,
) -> EpochPlan:
    """One epoch's batches for ``rank`` of ``world_size`` (see the module doc); its ``stats``
    count over the whole epoch, coverage against the random-access plan's denominator."""
    for name, v in (("num_spk", num_spk), ("num_utt", num_utt), ("pool", pool), ("streams", streams)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
    table = as_spk2utt(spk2utt)
    N, M = int(num_spk), int(num_utt)
    eligible = int(np.count_nonzero(table.counts >= M))
    if eligible < N:  # no pool can help: say what to set
        raise InputError(
            table.path,
            None,
            f"--num-spk {N} is more than the {eligible} speakers with at least {M} utterances "
            f"(of {table.num_speakers}), whatever the pool: lower it to at most {eligible} (spk.sh --num_spk)",
        )
    spk_of = table.speaker_of()
    names = sorted(set(utt2shard.values()))
    shard_index = {n: i for i, n in enumerate(names)}
    where = np.empty(table.num_utts, dtype=np.int64)
    for i, u in enumerate(table.utts):
        s = utt2shard.get(u)
        if s is None:
            raise InputError(table.path, None, f"utterance '{u}' is in no shard (shards of another data set?)")
        where[i] = shard_index[s]
    order = np.argsort(
        np.random.PCG64(np.random.SeedSequence([seed, epoch, _PURPOSE_ORDER])).random_raw(len(names)), kind="stable"
    )
    rank_of_shard = np.empty(len(names), dtype=np.int64)
    rank_of_shard[order] = np.arange(len(names))
    window_of_utt = rank_of_shard[where] // pool
    num_windows = -(-len(names) // pool)
    stream_batches: list[list[np.ndarray]] = [[] for _ in range(streams)]
    for w in range(num_windows):
        pos = np.flatnonzero(window_of_utt == w)  # positions in table.utts, speaker-major
        spk = spk_of[pos]
        uniq, start = np.unique(spk, return_index=True)
        if len(uniq) < N:
            continue
        counts = np.diff(np.append(start, len(pos)))
        if int(np.count_nonzero(counts >= M)) < N:
            continue
        offsets = np.zeros(len(uniq) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(counts)
        sub = Spk2Utt(
            path=table.path,
            speakers=[table.speakers[s] for s in uniq],
            offsets=offsets,
            utts=[table.utts[p] for p in pos],
        )
        idx = plan_table(sub, N, M, _word(seed, epoch, _PURPOSE_WINDOW, w), 0)
        stream_batches[w % streams].extend(pos[idx])
    per_stream = min(len(b) for b in stream_batches)
    total = per_stream * streams
    if total < world_size:
        raise InputError(
            table.path,
            None,
            f"only {total} batches of {N} x {M} from windows of {pool} shards (a window must hold {N} speakers "
            f"with {M} utterances each): raise the pool (--shard_pool) or lower N, M",
        )
    indices = np.empty((total, N * M), dtype=np.int64)
    for s in range(streams):
        if per_stream:
            indices[s::streams] = np.stack(stream_batches[s][:per_stream])
    per_rank = total // world_size
    groups = table.counts // M
    stats = PlanStats(
        num_utt=M,
        num_speakers=table.num_speakers,
        num_utts=table.num_utts,
        eligible_speakers=int(np.count_nonzero(groups)),
        dropped_speakers=int(np.count_nonzero(table.counts < M)),
        repeated_speakers=0,
        groups_possible=int(groups.sum()),
        groups_used=per_rank * world_size * N,
        batches_global=total,
        batches_per_rank=per_rank,
        remainder_batches_dropped=total - per_rank * world_size,
        utts_used=per_rank * world_size * N * M,
    )
    return EpochPlan(
        table=table,
        indices=np.ascontiguousarray(indices[rank : per_rank * world_size : world_size]),
        num_spk=N,
        num_utt=M,
        seed=int(seed),
        epoch=int(epoch),
        world_size=int(world_size),
        rank=int(rank),
        short_speakers="drop",
        stats=stats,
    )
