"""Merge the jobs of one make_fbank run and check that every utterance is accounted for.

    python -m spkflow.bin.merge_fbank [--fbank-conf F] [--vad-conf F] [--compress true|false]
        [--compression-method 3] DATA_DIR OUT_DIR ARK_DIR NAME NJ [LOG_DIR]

Writes OUT_DIR/{feats.scp,vad.scp,cmvn_utt.scp,cmvn_utt_voiced.scp,utt2num_frames} (LC_ALL=C
order) and OUT_DIR/bad_utts, all together or none; with bad utterances, filters the copied data
dir in OUT_DIR to leave them out.  Fails, naming them, when utterances are missing, and naming
the jobs, when a job was made with other options than these (the same as compute_fbank's).
"""

from __future__ import annotations

import argparse
import sys

from spkflow.bin import exits_on
from spkflow.bin.compute_fbank import add_options, stamp
from spkflow.core.errors import InputError, OutputError
from spkflow.features.jobs import filter_data_dir, merge_jobs


@exits_on(InputError, OutputError, RuntimeError, ValueError, say="merge_fbank: ERROR")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p)
    p.add_argument("data_dir")
    p.add_argument("out_dir")
    p.add_argument("ark_dir")
    p.add_argument("name")
    p.add_argument("nj", type=int)
    p.add_argument("log_dir", nargs="?")
    a = p.parse_args(argv)
    removed: dict[str, int] = {}
    good, bad = merge_jobs(
        a.data_dir,
        a.out_dir,
        a.ark_dir,
        a.name,
        a.nj,
        a.log_dir,
        stamp=stamp(a),
        on_bad=lambda drop: removed.update(filter_data_dir(a.out_dir, drop)),
    )
    if bad:
        what = ", ".join(f"{k} -{v}" for k, v in sorted(removed.items()))
        print(
            f"merge_fbank: WARNING: {bad} bad utterances left out (see {a.out_dir}/bad_utts); "
            f"data dir filtered: {what}",
            file=sys.stderr,
        )
    print(f"merge_fbank: {good} utterances in {a.out_dir}/feats.scp", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
