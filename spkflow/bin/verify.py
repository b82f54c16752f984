"""Same speaker or not: score pairs of recordings with a model, one JSON line per pair.

    python -m spkflow.bin.verify --model MODEL A.wav B.wav
    python -m spkflow.bin.verify --model MODEL --pairs pairs.txt [--data DATA_DIR | --xvector-scp SCP] \\
        [--domain-mean auto|pairs|train|DATA_DIR|SCP] [--p-target 0.5] [--out scores.jsonl] [--skip-bad true]

MODEL is a model dir, a packed ``.zip`` or an ``.onnx`` file (:meth:`spkflow.Embedder.from_pretrained`).
``--pairs``: lines ``a b`` or ``a b target|nontarget`` naming audio files, or with ``--data``
utterance ids of a data dir, or with ``--xvector-scp`` keys of an embedding scp (stage 5's: no
audio read).  Each line of the output: ``a``, ``b``, ``score`` (the model's plain cosine),
``norm_score`` (after the model's backend, centring and AS-norm: stage 6's score), ``llr`` (the
calibrated log-likelihood ratio) and ``same_speaker`` (``llr`` above the threshold for
``--p-target``), plus ``label`` for labelled pairs; a summary goes to the log (for labelled
pairs: EERs, Cllr and the decisions' error rates).  A model without a calibration (an older
pack, ONNX) gives ``llr`` and ``same_speaker`` null and says so.  Work and guarantees:
:mod:`spkflow.deploy.verify`.  Exit status 1 with a line naming the file on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import IO

from spkflow.api import Embedder
from spkflow.bin import setup_logging
from spkflow.bin.argtypes import add_bool_option, probability
from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError, UtteranceError
from spkflow.deploy.verify import DOMAINS, Recordings, domain_embeddings, pairs_from, verify_pairs
from spkflow.score.scoring import read_pairs
from spkflow.score.verification import MIN_DOMAIN, Decision


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.verify", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, packed .zip or .onnx file")
    p.add_argument("recordings", nargs="*", metavar="A B", help="two audio files (or use --pairs)")
    p.add_argument("--pairs", default=None, help="file of pairs: 'a b' or 'a b target|nontarget' per line")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", default=None, metavar="DATA_DIR", help="pairs name utterances of this data dir")
    src.add_argument("--xvector-scp", default=None, help="pairs name keys of this embedding scp (no audio read)")
    p.add_argument(
        "--domain-mean",
        default="auto",
        metavar="auto|pairs|train|PATH",
        help=f"centre on the mean of the pairs' recordings (pairs), the training mean (train), pairs when they name "
        f">= {MIN_DOMAIN} recordings (auto, default), or the recordings of a data dir or embedding scp PATH like "
        "the scored ones (for one pair of recordings unlike the training data)",
    )
    p.add_argument(
        "--p-target", type=probability, default=None, help="target prior of the decision (default: the model's)"
    )
    p.add_argument("--out", default=None, help="write the JSON lines here (atomically) instead of standard output")
    add_bool_option(p, "--skip-bad", default=False, help="leave out pairs whose audio cannot be read")
    add_bool_option(p, "--progress", default=True, help="progress bar while embedding")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    return p


@contextlib.contextmanager
def json_output(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    with atomic_write(path) as f:
        yield f


def main(argv: list[str] | None = None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if not ((args.pairs is not None and not args.recordings) or (args.pairs is None and len(args.recordings) == 2)):
        parser.error("give two recordings A B, or --pairs FILE")
    try:
        emb = Embedder.from_pretrained(args.model, device=args.device)
        logging.info("%s", emb.scoring_note)
        scoring = emb.scoring if args.p_target is None else emb.scoring.with_decision(Decision(args.p_target))
        pairs = read_pairs(args.pairs) if args.pairs else pairs_from(args.recordings)
        domain = args.domain_mean
        if domain not in DOMAINS:
            domain = domain_embeddings(emb, domain, progress=args.progress)
        with json_output(args.out) as out:
            s = verify_pairs(
                emb,
                pairs,
                out,
                source=Recordings(args.data, args.xvector_scp),
                domain=domain,
                scoring=scoring,
                skip_bad=args.skip_bad,
                progress=args.progress,
            )
    except (InputError, UtteranceError, ValueError, OSError) as err:
        logging.error("%s", err)
        return 1
    msg = f"{s['pairs']} pairs of {s['recordings']} recordings ({s['scoring']}, centred on {s['centred_on']})"
    if s["skipped_pairs"]:
        msg += f"; {s['skipped_pairs']} pairs left out: unreadable {', '.join(s['bad_recordings'])}"
    if "eer" in s:
        msg += f"; labelled: EER {s['eer']:.2f}% (plain cosine {s['eer_cosine']:.2f}%)"
    if "hter" in s:
        msg += (
            f"; decisions (LLR > {s['llr_threshold']:.3g}): miss {s['p_miss']:.2f}%, false alarm {s['p_fa']:.2f}%, "
            f"HTER {s['hter']:.2f}%; Cllr {s['cllr']:.3f}, actDCF(0.01) {s['act_dcf_p0.01']:.4f}"
        )
    logging.info("%s%s", msg, f" -> {args.out}" if args.out else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
