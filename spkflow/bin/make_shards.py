"""Write a training set's shards (spkflow.data.shard_jobs): prepare, one job, or the merge.

    python -m spkflow.bin.make_shards prepare [--shard-utts 1000] [--run 8] [--seed 0] [--audio false] \\
        [--voiced true] FEATS_DIR SHARD_DIR
    python -m spkflow.bin.make_shards job [--audio false] FEATS_DIR SHARD_DIR JOB NJ
    python -m spkflow.bin.make_shards merge SHARD_DIR NJ

FEATS_DIR is stage 2's output for the set (feats.scp, vad.scp, cmvn stats, utt2spk); with
``--audio true`` a data dir whose audio files (wav.scp) the shards hold as stored; ``--voiced
true`` (features): only the frames the VAD keeps, for training with the VAD.  ``prepare``
writes SHARD_DIR/plan (and removes the shards of an earlier, different plan); ``job`` writes the
missing shards JOB, JOB + NJ, ... atomically; ``merge`` writes utt2shard and shards.list once
every shard is there.  scripts/feats/make_shards.sh runs them through $train_cmd.
Exit status 1 with one line naming the file on bad input or a missing shard.
"""

from __future__ import annotations

import argparse
import sys

from spkflow.bin import exits_on
from spkflow.bin.argtypes import add_bool_option, int_at_least
from spkflow.core.errors import InputError, OutputError, UtteranceError
from spkflow.core.threads import job_threads, limit_threads
from spkflow.data.jobs import MergeError
from spkflow.data.shard_jobs import merge, prepare, write_job


@exits_on(InputError, OutputError, MergeError, UtteranceError, OSError, say="make_shards: ERROR")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    pp = sub.add_parser("prepare", help="decide the shards' contents")
    pp.add_argument("--shard-utts", type=int_at_least(1), default=1000, help="utterances per shard (about)")
    pp.add_argument("--run", type=int_at_least(1), default=8, help="utterances of one speaker kept together")
    pp.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the order")
    add_bool_option(pp, "--audio", default=False, help="shards of the audio files instead of the features")
    add_bool_option(pp, "--voiced", default=True, help="features: only the frames the VAD keeps (ignored with --audio)")
    pp.add_argument("feats_dir")
    pp.add_argument("shard_dir")
    pj = sub.add_parser("job", help="write one job's shards")
    add_bool_option(pj, "--audio", default=False, help="shards of the audio files instead of the features")
    pj.add_argument("feats_dir")
    pj.add_argument("shard_dir")
    pj.add_argument("job", type=int_at_least(1))
    pj.add_argument("nj", type=int_at_least(1))
    pm = sub.add_parser("merge", help="check the shards, write shards.list")
    pm.add_argument("shard_dir")
    pm.add_argument("nj", type=int_at_least(1))
    a = p.parse_args(argv)
    limit_threads(job_threads())  # torch, OpenMP and BLAS pools: the job's share
    if a.step == "prepare":
        n = prepare(a.feats_dir, a.shard_dir, a.shard_utts, a.run, a.seed, a.audio, a.voiced and not a.audio)
        print(f"make_shards: {n} shards planned in {a.shard_dir}/plan", file=sys.stderr)
    elif a.step == "job":
        n = write_job(a.feats_dir, a.shard_dir, a.job, a.nj, a.audio)
        print(f"make_shards: job {a.job}: {n} shards written", file=sys.stderr)
    else:
        n, size = merge(a.shard_dir, a.nj)
        print(f"make_shards: {n} shards, {size / 1e6:.1f} MB, in {a.shard_dir}/shards.list", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
