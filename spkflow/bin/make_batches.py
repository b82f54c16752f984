"""Write one epoch's N x M batch list from a spk2utt file.

    python -m spkflow.bin.make_batches --spk2utt data/train/spk2utt --num-spk 64 --num-utt 10 \\
        --seed 0 --epoch 1 [--world-size W --rank R] [--short-speakers drop|repeat] --out batches.txt
        [--shards SHARD_DIR [--pool P] [--streams S]]

One batch per line, N*M utterance ids, speaker-major; written atomically.  A summary
(batches, coverage, dropped or repeated speakers, remainder batches) goes to stderr.
Exit status 1 on bad input (the message names file and line), 2 on bad arguments.
The planning itself is :func:`spkflow.train.batches.plan_epoch`; with ``--shards`` (a shard
folder from ``make_shards``) :func:`spkflow.train.shard_plan.plan_shard_epoch`, whose batches a
loader serves reading each shard once, front to back, ``--pool`` shards in memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from spkflow.bin.argtypes import int_at_least
from spkflow.core.errors import InputError
from spkflow.train.batches import SHORT_SPEAKER_POLICIES, format_summary, plan_epoch, write_batch_list
from spkflow.train.shard_plan import plan_shard_epoch, read_utt2shard
from spkflow.train.spk2utt import load_spk2utt


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spkflow.bin.make_batches",
        description="Plan one epoch of N x M batches (N speakers x M utterances).",
    )
    p.add_argument("--spk2utt", required=True, help="Kaldi spk2utt file")
    p.add_argument("--num-spk", type=int_at_least(1), required=True, help="N: speakers per batch")
    p.add_argument("--num-utt", type=int_at_least(1), required=True, help="M: utterances per speaker")
    p.add_argument("--seed", type=int_at_least(0), required=True, help="seed of the plan")
    p.add_argument("--epoch", type=int_at_least(0), required=True, help="epoch (recipes count from 1)")
    p.add_argument("--world-size", type=int_at_least(1), default=1, help="number of ranks (default 1)")
    p.add_argument("--rank", type=int_at_least(0), default=0, help="this rank, 0 <= rank < world size")
    p.add_argument(
        "--short-speakers",
        choices=SHORT_SPEAKER_POLICIES,
        default="drop",
        help="speakers with fewer than M utterances: drop (default) or repeat utterances",
    )
    p.add_argument("--out", required=True, help="batch-list file to write")
    p.add_argument(
        "--shards", default=None, help="plan for this shard folder (its utt2shard): windows of --pool shards"
    )
    p.add_argument("--pool", type=int_at_least(1), default=8, help="with --shards: shards per window (in memory)")
    p.add_argument(
        "--streams", type=int_at_least(1), default=1, help="with --shards: interleaved window streams (ranks x workers)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    if args.rank >= args.world_size:
        parser.error(f"--rank {args.rank} must be below --world-size {args.world_size}")
    t0 = time.perf_counter()
    try:
        table = load_spk2utt(args.spk2utt)
        t1 = time.perf_counter()
        if args.shards:
            if args.short_speakers != "drop":
                parser.error("--shards plans drop short speakers (--short-speakers drop)")
            utt2shard = read_utt2shard(os.path.join(args.shards, "utt2shard"))
            plan = plan_shard_epoch(
                table, utt2shard, args.num_spk, args.num_utt, args.seed, args.epoch, args.pool, args.streams,
                args.world_size, args.rank,
            )  # fmt: skip
        else:
            plan = plan_epoch(
                table,
                args.num_spk,
                args.num_utt,
                args.seed,
                args.epoch,
                args.world_size,
                args.rank,
                args.short_speakers,
            )
        t2 = time.perf_counter()
        write_batch_list(args.out, plan)
    except (InputError, OSError) as e:
        print(f"make_batches: error: {e}", file=sys.stderr)
        return 1
    t3 = time.perf_counter()
    print(f"make_batches: read {t1 - t0:.2f}s, plan {t2 - t1:.2f}s, write {t3 - t2:.2f}s", file=sys.stderr)
    print(f"make_batches: {args.spk2utt} -> {args.out}: {format_summary(plan)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
