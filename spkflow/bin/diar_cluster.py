"""Cluster each recording's window embeddings into speakers: one RTTM for the set (diar.sh stage 4).

    python -m spkflow.bin.diar_cluster --work-dir DIR --xvector-scp SCP [--scoring-dir MODEL_DIR]
        [--method spectral|ahc|gmm] [--num-speakers K | --reco2num-spk FILE] [--max-speakers 8]
        [--backend true] [--centre set|none|recording] [--resegment auto|true|false] [--threshold LLR]
        [--overlap-rttm RTTM] --out RTTM

``DIR`` holds ``speech/`` and ``windows/`` of ``spkflow.bin.diar_windows``; ``SCP`` the windows'
embeddings (stage 5); ``MODEL_DIR`` the model's ``scoring.yaml`` (none: plain cosine, and
``ahc`` then needs the speaker count or a ``--threshold``); ``--overlap-rttm``: where this RTTM
has two or more speakers at once, a second speaker is added (the reference RTTM: oracle overlap,
:mod:`spkflow.diar.overlap`).  :func:`spkflow.diar.recipe_stages.cluster_set`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import add_bool_option, finite_float, int_at_least
from spkflow.core.errors import InputError
from spkflow.core.threads import job_threads, limit_threads
from spkflow.data.tables import read_kv
from spkflow.diar.overlap import overlap_regions
from spkflow.diar.pipeline import CENTRES, METHODS, DiarOptions
from spkflow.diar.recipe_stages import cluster_set
from spkflow.diar.rttm import read_rttm, turns_by_recording
from spkflow.score.model_scoring import Scoring, has_scoring


@exits_on(InputError, ValueError, OSError, RuntimeError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.diar_cluster", description=__doc__.split("\n")[0])
    p.add_argument("--work-dir", required=True)
    p.add_argument("--xvector-scp", default=None)
    p.add_argument("--scoring-dir", default=None, help="model dir with scoring.yaml (default: plain cosine)")
    p.add_argument("--method", default="spectral", choices=METHODS)
    p.add_argument("--num-speakers", type=int_at_least(1), default=None)
    p.add_argument("--reco2num-spk", default=None, help="'recording count' per line (oracle speaker counts)")
    p.add_argument("--max-speakers", type=int_at_least(1), default=8)
    add_bool_option(p, "--backend", default=True, help="cluster in the scoring's space (its backend)")
    p.add_argument(
        "--centre",
        default="set",
        choices=CENTRES,
        help="centre on every window of the set, on none (the scoring's training mean) or on the recording's own",
    )
    p.add_argument(
        "--resegment",
        default="auto",
        choices=("auto", "true", "false"),
        help="reassign windows to the nearest speaker, smoothed (auto: when the count is given or from 600 windows)",
    )
    p.add_argument(
        "--threshold",
        type=finite_float,
        default=None,
        help="stop AHC (and the LLR merge) here: an LLR, or a score without calibration "
        "(default: the model's calibrated decision threshold)",
    )
    p.add_argument(
        "--overlap-rttm",
        default=None,
        help="add a second speaker where this RTTM has two or more at once (the reference: oracle overlap)",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    setup_logging()
    limit_threads(job_threads())  # torch, OpenMP and BLAS pools: the job's share
    scoring = Scoring.load(args.scoring_dir) if args.scoring_dir and has_scoring(args.scoring_dir) else Scoring()
    opts = DiarOptions(
        args.method,
        args.num_speakers,
        args.max_speakers,
        args.backend,
        args.centre,
        {"auto": None, "true": True, "false": False}[args.resegment],
        args.threshold,
    )
    counts = None
    if args.reco2num_spk:
        counts = {k: int(v) for k, v in read_kv(args.reco2num_spk, num_fields=2).items()}
    overlap = None
    if args.overlap_rttm:
        if not os.path.isfile(args.overlap_rttm):
            raise InputError(args.overlap_rttm, None, "no such file: oracle overlap needs the reference turns")
        turns = turns_by_recording(read_rttm(args.overlap_rttm).turns)
        overlap = {rec: overlap_regions(t) for rec, t in turns.items()}
    n = cluster_set(args.work_dir, args.xvector_scp, args.out, scoring, opts, counts, overlap)
    extra = f", a second speaker in {n['overlap_turns']} overlap turns" if overlap is not None else ""
    logging.info(
        "%s (%s)%s: %d recordings, %d speakers -> %s",
        opts.describe(),
        scoring.label,
        extra,
        n["recordings"],
        n["speakers"],
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
