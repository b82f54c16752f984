"""Score a diarization: DER (forgiving, fair, full), JER, speaker-count error (diar.sh stage 5).

    python -m spkflow.bin.diar_score [--title T] [--plot RECORDING] RECO_DIR HYP_RTTM OUT_DIR

``RECO_DIR``: the recording dir with the reference ``rttm`` (and ``uem``).  Writes
``OUT_DIR/scores.md`` (per recording and total), ``scores.json`` and ``plot_<recording>.png``
(``--plot ''``: the first recording).  The conditions and the collar convention:
:mod:`spkflow.diar.metrics`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.core.errors import InputError
from spkflow.diar.recipe_stages import score_set


@exits_on(InputError, ValueError, OSError, RuntimeError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.diar_score", description=__doc__.split("\n")[0])
    p.add_argument("reco_dir")
    p.add_argument("hyp_rttm")
    p.add_argument("out_dir")
    p.add_argument("--title", default="")
    p.add_argument("--plot", default=None, help="recording to plot ('': the first; default: no plot)")
    args = p.parse_args(argv)
    setup_logging()
    t = score_set(args.reco_dir, args.hyp_rttm, args.out_dir, args.title, args.plot)
    logging.info(
        "%s: DER forgiving %.2f%%, fair %.2f%%, full %.2f%% (miss %.2f, FA %.2f, confusion %.2f); JER %.2f%%; "
        "speaker-count error %.2f (%d recordings) -> %s/scores.md",
        args.title or args.hyp_rttm, t["der_forgiving"], t["der_fair"], t["der_full"], t["miss"], t["fa"], t["conf"],
        t["jer"], t["spk_err"], t["recordings"], args.out_dir,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
