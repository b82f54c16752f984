"""Turn-taking statistics of real meetings from their reference RTTMs, as JSON (for the simulator).

    python -m spkflow.bin.turn_statistics [--source TEXT] --out STATS.json RTTM...

Stores the statistics (turn, pause and overlap histograms; :mod:`spkflow.sim.conversations`), never
the RTTMs.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.core.errors import InputError
from spkflow.diar.rttm import read_rttm, turns_by_recording
from spkflow.sim.conversations import save_statistics, turn_statistics


@exits_on(InputError, OSError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.turn_statistics", description=__doc__.split("\n")[0])
    p.add_argument("rttms", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--source", default="", help="where the RTTMs come from (stored in the JSON)")
    args = p.parse_args(argv)
    setup_logging()
    turns = [t for f in args.rttms for t in read_rttm(f).turns]
    st = turn_statistics(turns_by_recording(turns), source=args.source)
    save_statistics(args.out, st)
    logging.info(
        "%d recordings: next turn same speaker %.2f, overlap at a change %.2f, mean pause %.2f / %.2f s, "
        "mean overlap %.2f s, mean turn %.2f s -> %s",
        len({t.recording for t in turns}), st.same_speaker, st.overlap, st.pause_same.mean(), st.pause_other.mean(),
        st.overlap_length.mean(), st.turn_length.mean(), args.out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
