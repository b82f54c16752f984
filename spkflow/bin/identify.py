"""Who is speaking: rank enrolled speakers for new recordings, "unknown" below the open-set threshold.

    python -m spkflow.bin.identify --model MODEL --enrol DATA_DIR FILE... [--top-k 3] [--p-known 0.5]
    python -m spkflow.bin.identify --model MODEL --enrol DATA_DIR --data TEST_DIR [--list utts.txt]
    python -m spkflow.bin.identify --model MODEL --enrol DATA_DIR --save GALLERY    # enrol once
    python -m spkflow.bin.identify --model MODEL --gallery GALLERY FILE...          # identify after
    python -m spkflow.bin.identify --model MODEL --gallery G [--enrol NEW_DIR] [--remove SPK,...] --save G

MODEL is a model dir, a packed ``.zip`` or an ``.onnx`` file.  Each speaker of the enrolment
data dir (its spk2utt: ``python -m spkflow.bin.make_data_dir`` makes one from a folder per
speaker) is the mean of its utterances in the model's scoring space.  ``--save`` keeps the
enrolment (:mod:`spkflow.deploy.gallery`: every utterance's embedding and the model's stamp) and
``--gallery`` uses it without embedding it again; a gallery made with another model is refused;
``--enrol`` with ``--gallery`` adds (or replaces) speakers, ``--remove`` takes them out.  Each
test recording (files, or the utterances of ``--data``, or those ``--list`` names) gets one
JSON line: ``speaker`` (the best one, ``unknown``, or null with a ``warning`` when it holds too
little voiced speech, ``--min-speech``), ``file``, ``top`` (the ``--top-k`` speakers with ``llr``,
``norm_score`` and ``posterior``), ``p_unknown``, and ``note`` for a file cut short.  "unknown"
is Bayes' decision with the prior ``--p-known`` that the speaker is enrolled (or a fixed
``--threshold`` on the best LLR): see :mod:`spkflow.deploy.decisions`.  Without a calibration the
ranking is by score and no "unknown" is decided (said in the log).  Exit status 1 with a line
naming the file on bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.api import Embedder
from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import add_decision_options, int_at_least, probability
from spkflow.bin.verify import json_output
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.datadir import DataDir
from spkflow.deploy.decisions import Recordings, domain_choice, enrolment, identify, read_list
from spkflow.features.speech import MIN_SPEECH


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.identify", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, packed .zip or .onnx file")
    p.add_argument("--enrol", default=None, metavar="DATA_DIR", help="data dir of the enrolled speakers (spk2utt)")
    p.add_argument("--gallery", default=None, help="a saved enrolment (--save) to identify against")
    p.add_argument("--save", default=None, metavar="GALLERY", help="save the enrolment here (atomically)")
    p.add_argument("--remove", default=None, metavar="SPK,...", help="speakers to take out of the gallery (--save)")
    p.add_argument("files", nargs="*", metavar="FILE", help="recordings to identify (or --data)")
    p.add_argument("--data", default=None, metavar="TEST_DIR", help="identify the utterances of this data dir")
    p.add_argument("--list", default=None, help="with --data: only the utterances listed (one per line)")
    p.add_argument("--top-k", type=int_at_least(1), default=3, help="speakers listed per recording")
    p.add_argument("--p-known", type=probability, default=0.5, help="prior that a recording's speaker is enrolled")
    p.add_argument("--threshold", type=float, default=None, help="fixed LLR below which the speaker is unknown")
    p.add_argument(
        "--domain-mean",
        default="auto",
        metavar="auto|pairs|calibration|train|PATH",
        help="centre on the enrolment and test recordings' mean (pairs), the mean of the model's calibration set "
        "(calibration), the training mean (train), pairs when there are >= 10 recordings and calibration "
        "otherwise (auto, default), or the recordings of a data dir or embedding scp PATH",
    )
    add_decision_options(p, min_speech=MIN_SPEECH, skip_bad="leave out recordings that cannot be read")
    return p


@exits_on(InputError, UtteranceError, ValueError, OSError)
def main(argv: list[str] | None = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if (args.files and args.data) or not (args.files or args.data or args.save):
        parser.error("give recordings FILE..., or --data TEST_DIR (or only --save GALLERY to enrol)")
    if not (args.enrol or args.gallery):
        parser.error("give --enrol DATA_DIR or --gallery GALLERY")
    if args.remove and not args.save:
        parser.error("--remove changes a gallery: give --save GALLERY")
    if args.list and not args.data:
        parser.error("--list needs --data")
    emb = Embedder.from_pretrained(args.model, device=args.device)
    logging.info("%s", emb.scoring_note)
    enrol = enrolment(
        emb,
        enrol_dir=args.enrol,
        gallery=args.gallery,
        remove=args.remove.split(",") if args.remove else (),
        save=args.save,
        skip_bad=args.skip_bad,
        progress=args.progress,
    )
    if not (args.files or args.data):
        enrol()
        return 0
    if args.data:
        tests = read_list(args.list) if args.list else DataDir(args.data).utts()
    else:
        tests = list(args.files)
    domain = domain_choice(emb, args.domain_mean, progress=args.progress)
    with json_output(args.out) as out:
        s = identify(
            emb,
            tests,
            out,
            enrol=enrol,
            test_source=Recordings(args.data),
            top_k=args.top_k,
            p_known=args.p_known,
            threshold=args.threshold,
            domain=domain,
            skip_bad=args.skip_bad,
            progress=args.progress,
            min_speech=args.min_speech,
        )
    rule = (
        "no calibration: closed-set ranking by score, no 'unknown'"
        if s["threshold"] is None
        else f"'unknown' when the best LLR <= {s['threshold']:.3g}"
    )
    bad = f"; {len(s['bad_recordings'])} unreadable left out" if s["bad_recordings"] else ""
    if s["little_speech"]:
        bad += f"; {s['little_speech']} with too little speech: no decision ('warning' in their lines)"
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
