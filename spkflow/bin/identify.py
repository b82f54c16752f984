"""Who is speaking: rank enrolled speakers for new recordings, "unknown" below the open-set threshold.

    python -m spkflow.bin.identify --model MODEL --enrol DATA_DIR FILE... [--top-k 3] [--p-known 0.5]
    python -m spkflow.bin.identify --model MODEL --enrol DATA_DIR --data TEST_DIR [--list utts.txt]

MODEL is a model dir, a packed ``.zip`` or an ``.onnx`` file.  Each speaker of the enrolment
data dir (its spk2utt: ``python -m spkflow.bin.make_data_dir`` makes one from a folder per
speaker) is the mean of its utterances in the model's scoring space; each test recording (files,
or the utterances of ``--data``, or those ``--list`` names) gets one JSON line: ``file``,
``speaker`` (the best one, or ``unknown``), ``top`` (the ``--top-k`` speakers with ``llr``,
``norm_score`` and ``posterior``) and ``p_unknown``.  "unknown" is Bayes' decision with the prior
``--p-known`` that the speaker is enrolled (or a fixed ``--threshold`` on the best LLR): see
:mod:`spkflow.deploy.verify`.  Without a calibration the ranking is by score and no "unknown" is
decided (said in the log).  Exit status 1 with a line naming the file on bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.api import Embedder
from spkflow.bin import setup_logging
from spkflow.bin.argtypes import add_bool_option, int_at_least, probability
from spkflow.bin.verify import json_output
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.datadir import DataDir
from spkflow.deploy.verify import DOMAINS, Recordings, domain_embeddings, identify, read_list


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.identify", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, packed .zip or .onnx file")
    p.add_argument("--enrol", required=True, metavar="DATA_DIR", help="data dir of the enrolled speakers (spk2utt)")
    p.add_argument("files", nargs="*", metavar="FILE", help="recordings to identify (or --data)")
    p.add_argument("--data", default=None, metavar="TEST_DIR", help="identify the utterances of this data dir")
    p.add_argument("--list", default=None, help="with --data: only the utterances listed (one per line)")
    p.add_argument("--top-k", type=int_at_least(1), default=3, help="speakers listed per recording")
    p.add_argument("--p-known", type=probability, default=0.5, help="prior that a recording's speaker is enrolled")
    p.add_argument("--threshold", type=float, default=None, help="fixed LLR below which the speaker is unknown")
    p.add_argument(
        "--domain-mean",
        default="auto",
        metavar="auto|pairs|train|PATH",
        help="centre on the enrolment and test recordings' mean (pairs), the training mean (train), the former "
        "when there are >= 10 of them (auto, default), or the recordings of a data dir or embedding scp PATH",
    )
    p.add_argument("--out", default=None, help="write the JSON lines here (atomically) instead of standard output")
    add_bool_option(p, "--skip-bad", default=False, help="leave out recordings that cannot be read")
    add_bool_option(p, "--progress", default=True, help="progress bar while embedding")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if bool(args.files) == bool(args.data):
        parser.error("give recordings FILE..., or --data TEST_DIR")
    if args.list and not args.data:
        parser.error("--list needs --data")
    try:
        emb = Embedder.from_pretrained(args.model, device=args.device)
        logging.info("%s", emb.scoring_note)
        if args.data:
            tests = read_list(args.list) if args.list else DataDir(args.data).utts()
        else:
            tests = list(args.files)
        domain = args.domain_mean
        if domain not in DOMAINS:
            domain = domain_embeddings(emb, domain, progress=args.progress)
        with json_output(args.out) as out:
            s = identify(
                emb,
                DataDir(args.enrol),
                tests,
                out,
                enrol_source=Recordings(args.enrol),
                test_source=Recordings(args.data),
                top_k=args.top_k,
                p_known=args.p_known,
                threshold=args.threshold,
                domain=domain,
                skip_bad=args.skip_bad,
                progress=args.progress,
            )
    except (InputError, UtteranceError, ValueError, OSError) as err:
        logging.error("%s", err)
        return 1
    rule = (
        "no calibration: closed-set ranking by score, no 'unknown'"
        if s["threshold"] is None
        else f"'unknown' when the best LLR <= {s['threshold']:.3g}"
    )
    bad = f"; {len(s['bad_recordings'])} unreadable left out" if s["bad_recordings"] else ""
    logging.info(
        "%d recordings against %d enrolled speakers (%d enrolment utterances, %s, centred on %s): %d unknown, %s%s%s",
        s["tests"],
        s["speakers"],
        s["enrolment_utterances"],
        s["scoring"],
        s["centred_on"],
        s["unknown"],
        rule,
        bad,
        f" -> {args.out}" if args.out else "",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
