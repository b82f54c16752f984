"""Same speaker or not: score pairs of recordings with a model, one JSON line per pair.

    python -m spkflow.bin.verify --model MODEL A.wav B.wav
    python -m spkflow.bin.verify --model MODEL --pairs pairs.txt [--data DATA_DIR] [--xvector-scp SCP] \\
        [--domain-mean auto|pairs|calibration|train|PATH] [--calibration auto|batch|model] [--p-target 0.5] \\
        [--out scores.jsonl] [--skip-bad true]

MODEL is a model dir, a packed ``.zip`` or an ``.onnx`` file (:meth:`spkflow.Embedder.from_pretrained`).
``--pairs``: lines ``a b`` or ``a b target|nontarget`` naming audio files, or with ``--data``
utterance ids (or files) of a data dir, or with ``--xvector-scp`` keys of an embedding scp (stage
5's: no audio read); with both, files of the data dir are looked up in the scp by their
utterance ids (its ``wav.scp``), so a pairs file of paths takes the fast route.  Paths with
spaces: quote them (``"my file.wav" b.wav``) or separate the fields by tabs.

Each line of the output: ``a``, ``b``, ``score`` (the model's plain cosine),
``norm_score`` (after the model's backend, centring and AS-norm: stage 6's score), ``llr`` (the
calibrated log-likelihood ratio) and ``same_speaker`` (``llr`` above the threshold for
``--p-target``), plus ``label`` for labelled pairs and ``warning`` (with ``same_speaker`` null) for a
pair with a recording of too little voiced speech (``--min-speech``), and ``note`` for a file cut short
(scored on what decodes); a summary goes to the log (for labelled pairs: EERs, Cllr and the
decisions' error rates).  A model without a calibration (an older
pack, ONNX) gives ``llr`` and ``same_speaker`` null and says so.  ``--calibration auto``: a batch
of >= 200 pairs of >= 10 recordings whose own scores put the model's threshold too low is decided
by its own calibration (no labels read); else the model's decides (the log says which, and why).
Work and guarantees: :mod:`spkflow.deploy.decisions`.  Exit status 1 with a line naming the file on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import IO

from spkflow.api import Embedder
from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import add_decision_options, probability
from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError, UtteranceError
from spkflow.deploy.decisions import Recordings, domain_choice, file_ids, pairs_from, verify_pairs
from spkflow.features.speech import MIN_SPEECH
from spkflow.score.model_scoring import CALIBRATIONS, MIN_DOMAIN, Decision
from spkflow.score.trial_scoring import read_pairs


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.verify", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, packed .zip or .onnx file")
    p.add_argument("recordings", nargs="*", metavar="A B", help="two audio files (or use --pairs)")
    p.add_argument("--pairs", default=None, help="file of pairs: 'a b' or 'a b target|nontarget' per line")
    p.add_argument("--data", default=None, metavar="DATA_DIR", help="pairs name utterances (or files) of this data dir")
    p.add_argument(
        "--xvector-scp",
        default=None,
        help="embeddings of the pairs' recordings (no audio read): keys, or with --data files of DATA_DIR",
    )
    p.add_argument(
        "--domain-mean",
        default="auto",
        metavar="auto|pairs|calibration|train|PATH",
        help=f"centre on the mean of the pairs' recordings (pairs, >= {MIN_DOMAIN} of them), the mean of the "
        "recordings the model's calibration was fitted on (calibration), the training mean (train), pairs when they "
        f"name >= {MIN_DOMAIN} recordings and calibration otherwise (auto, default), or the recordings of a data "
        "dir, an embedding scp or a saved gallery (identify --save, .npz) PATH like the scored ones",
    )
    p.add_argument("--calibration", default="auto", choices=CALIBRATIONS, help="auto: the batch's own (no labels) "
                   "when it puts the model's threshold too low; batch: when it fits; model: the model's")  # fmt: skip
    p.add_argument(
        "--p-target", type=probability, default=None, help="target prior of the decision (default: the model's)"
    )
    add_decision_options(p, min_speech=MIN_SPEECH, skip_bad="leave out pairs whose audio cannot be read")
    return p


@contextlib.contextmanager
def json_output(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    with atomic_write(path) as f:
        yield f


@exits_on(InputError, UtteranceError, ValueError, OSError)
def main(argv: list[str] | None = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if not ((args.pairs is not None and not args.recordings) or (args.pairs is None and len(args.recordings) == 2)):
        parser.error("give two recordings A B, or --pairs FILE")
    emb = Embedder.from_pretrained(args.model, device=args.device)
    logging.info("%s", emb.scoring_note)
    scoring = emb.scoring if args.p_target is None else emb.scoring.with_decision(Decision(args.p_target))
    pairs = read_pairs(args.pairs) if args.pairs else pairs_from(args.recordings)
    aliases = file_ids(args.data, [*pairs.enroll, *pairs.test]) if args.data else {}
    domain = domain_choice(emb, args.domain_mean, progress=args.progress)
    with json_output(args.out) as out:
        s = verify_pairs(
            emb,
            pairs,
            out,
            source=Recordings(args.data, args.xvector_scp, aliases=aliases),
            domain=domain,
            scoring=scoring,
            skip_bad=args.skip_bad,
            progress=args.progress,
            min_speech=args.min_speech,
            calibration=args.calibration,
        )
    msg = f"{s['pairs']} pairs of {s['recordings']} recordings ({s['scoring']}, centred on {s['centred_on']})"
    if s["skipped_pairs"]:
        msg += f"; {s['skipped_pairs']} pairs left out: unreadable {', '.join(s['bad_recordings'])}"
    if s["little_speech_pairs"]:
        msg += (
            f"; {s['little_speech_pairs']} pairs with a recording of fewer than {s['min_speech']:g} s of voiced "
            "speech: no decision ('warning' in their lines)"
        )
    msg += f"; calibration: {s['calibration']['reason']}" if s["calibration"]["by"] else ""
    if "eer" in s:
        msg += f"; labelled: EER {s['eer']:.2f}% (plain cosine {s['eer_cosine']:.2f}%)"
    if "hter" in s:
        msg += (
            f"; decisions (LLR > {s['llr_threshold']:.3g}): miss {s['p_miss']:.2f}%, false alarm {s['p_fa']:.2f}%, "
            f"HTER {s['hter']:.2f}%; Cllr {s['cllr']:.3f}, actDCF(0.01) {s['act_dcf_p0.01']:.4f}"
        )
    logging.info("%s%s", msg, f" -> {args.out}" if args.out else "")
    if args.domain_mean == "auto" and s["recordings"] < MIN_DOMAIN and s["calibrated"] and emb.scoring.centres:
        logging.warning(
            "%d recordings are too few to centre on: the decisions hold for recordings like the %s's (on corpora "
            "unlike it, measured: up to 2.6 x a batch's half total error); for yours give --domain-mean with >= %d "
            "recordings like them (a data dir, an embedding scp, or a gallery saved by identify --save)",
            s["recordings"],
            "calibration set" if "calibration" in s["centred_on"] else "training set",
            MIN_DOMAIN,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
