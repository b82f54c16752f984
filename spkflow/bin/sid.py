"""Speaker identification stages on stage-5 embeddings (the work is in :mod:`spkflow.score.sid`).

    python -m spkflow.bin.sid split --spk2utt data/test/spk2utt --num-enrol 2 --seed 0 --folds 5 \\
        --outdir exp/spk_x/sid/test
    python -m spkflow.bin.sid enrol --xvector-scp exp/spk_x/embed/test/xvector.scp \\
        --sid-dir exp/spk_x/sid/test [--backend cosine|wccn|lda]
    python -m spkflow.bin.sid closed --xvector-scp ... --sid-dir exp/spk_x/sid/test
    python -m spkflow.bin.sid open --xvector-scp ... --sid-dir exp/spk_x/sid/test [--far 0.01]
    python -m spkflow.bin.sid results --sid-root exp/spk_x/sid

``split`` writes enrol / test / folds / dropped_spks (the speakers left out are named on the
console with their number of utterances); ``enrol`` backend.npz + spk_model.{ark,scp} (speaker
models, kaldi_ark); ``closed`` closed.json, predictions, confusion.png; ``open`` open.json,
open_trials; both (re)write metrics.json (closed + open figures); ``results`` RESULTS.md.
Before it reads anything, each of split / enrol / closed / open removes what it writes and what
the stages after it (in this order) wrote: their files, their figures in metrics.json, and the
sid root's RESULTS.md; after a failure no figure of an earlier run looks current.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import os
import sys
from typing import Any

from spkflow.bin import setup_logging
from spkflow.bin.argtypes import boolean, int_at_least
from spkflow.core import jsonsafe
from spkflow.core.atomic import atomic_write, write_text_atomic
from spkflow.core.errors import InputError
from spkflow.data.tables import read_spk2utt
from spkflow.score.backend import BACKENDS, Backend, fit_backend
from spkflow.score.plots import plot_confusion
from spkflow.score.scoring import read_embeddings
from spkflow.score.sid import closed_set, confusion, enrol, gather, make_split, open_set, read_split, write_split

log = logging.getLogger("spkflow.score.sid")


# What each stage writes into a set's dir, and the metrics.json keys it sets (prefixes end in
# "_"), in the recipe's order (sid.sh stages 6, 6, 7, 8): rerunning one makes the later ones stale.
_STAGES = ("split", "enrol", "closed", "open")
_OUTPUTS = {
    "split": (("enrol", "test", "folds", "dropped_spks"), ("num_enrol", "split_seed", "n_dropped_speakers")),
    "enrol": (("backend.npz", "spk_model.scp", "spk_model.ark"), ("n_enrol_utts",)),
    "closed": (("predictions", "closed.json", "confusion.png"), ("top1", "top5", "n_speakers", "n_test")),
    "open": (
        ("open_trials", "open.json"),
        ("folds", "n_known_trials", "n_impostor_trials", "open_top1", "open_backend", "dir_at_", "threshold_at_")
        + ("achieved_",),
    ),
}


def _forget(sid_dir: str, stage: str) -> None:
    """Remove what ``stage`` and the stages after it wrote (files, metrics.json keys; the backend
    key goes with enrol) and the sid root's RESULTS.md: what follows is rewritten or left absent."""
    later = _STAGES[_STAGES.index(stage) :]
    keys: list[str] = ["backend"] if "enrol" in later else []
    for st in later:
        files, stage_keys = _OUTPUTS[st]
        keys += stage_keys
        for name in files:
            path = os.path.join(sid_dir, name)
            if name.endswith(".json") and os.path.exists(path):  # the figures it merged, whatever they are
                with contextlib.suppress(ValueError, OSError), open(path, encoding="utf-8") as f:
                    keys += list(json.load(f))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(os.path.dirname(os.path.normpath(sid_dir)), "RESULTS.md"))
    path = os.path.join(sid_dir, "metrics.json")
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        current = json.load(f)
    kept = {k: v for k, v in current.items() if not any(k == x or (x.endswith("_") and k.startswith(x)) for x in keys)}
    write_text_atomic(path, json.dumps(kept, indent=2, sort_keys=True) + "\n")


def _split(args: argparse.Namespace) -> None:

    _forget(args.outdir, "split")
    spk2utt = read_spk2utt(args.spk2utt)
    split = make_split(spk2utt, args.num_enrol, args.seed, args.folds)
    write_split(split, args.outdir)
    if split.dropped:
        shown = ", ".join(f"{s} ({len(spk2utt[s])})" for s in split.dropped[:20])
        more = f" and {len(split.dropped) - 20} more" if len(split.dropped) > 20 else ""
        log.warning(
            "%s: %d speaker(s) left out, with fewer than K + 1 = %d utterances (K = %d to enrol, at least one "
            "to test): %s%s (utterances in brackets); listed in %s",
            args.spk2utt,
            len(split.dropped),
            args.num_enrol + 1,
            args.num_enrol,
            shown,
            more,
            os.path.join(args.outdir, "dropped_spks"),
        )
    _merge(
        args.outdir, {"num_enrol": args.num_enrol, "split_seed": args.seed, "n_dropped_speakers": len(split.dropped)}
    )
    log.info(
        "%s: %d speakers x %d enrolment utterances, %d test utterances, %d speakers left out "
        "(< %d utterances), %d open-set folds",
        args.outdir,
        len(split.enrol),
        args.num_enrol,
        len(split.test),
        len(split.dropped),
        args.num_enrol + 1,
        args.folds,
    )


def _load(args: argparse.Namespace):

    return read_embeddings(args.xvector_scp), read_split(args.sid_dir)


def _enrol(args: argparse.Namespace) -> None:
    import kaldiio
    import numpy as np

    _forget(args.sid_dir, "enrol")
    emb, split = _load(args)
    utts = [u for s in split.enrol for u in split.enrol[s]]
    labels = [s for s in split.enrol for _ in split.enrol[s]]
    backend = fit_backend(args.backend, gather(emb, utts, args.xvector_scp), labels, args.lda_dim)
    spks, models = enrol(backend, emb, split.enrol, args.xvector_scp)
    backend.save(os.path.join(args.sid_dir, "backend.npz"))
    # Old scp removed first, then the ark, then the new scp written atomically: an scp on disk
    # always points into a complete ark of the same run (a kill in between leaves no scp).
    ark, scp = os.path.join(args.sid_dir, "spk_model.ark"), os.path.join(args.sid_dir, "spk_model.scp")
    if os.path.exists(scp):
        os.unlink(scp)
    offsets = []
    with atomic_write(ark, "wb") as f:
        for s, m in zip(spks, models, strict=True):
            f.write(f"{s} ".encode())
            offsets.append(f.tell())
            kaldiio.save_mat(f, m.astype(np.float32))
    write_text_atomic(scp, "".join(f"{s} {ark}:{o}\n" for s, o in zip(spks, offsets, strict=True)))
    _merge(args.sid_dir, {"backend": args.backend, "n_enrol_utts": len(utts)})
    log.info(
        "%s: %d speaker models (%s backend, dim %d) -> %s", args.sid_dir, len(spks), args.backend, models.shape[1], scp
    )


def _closed(args: argparse.Namespace) -> None:
    import kaldiio
    import numpy as np

    _forget(args.sid_dir, "closed")
    spk_scp, backend_npz = os.path.join(args.sid_dir, "spk_model.scp"), os.path.join(args.sid_dir, "backend.npz")
    for path in (spk_scp, backend_npz):
        if not os.path.exists(path):
            raise InputError(path, None, "not found: run the enrolment stage (sid enrol) first")
    emb, split = _load(args)
    backend = Backend.load(backend_npz)
    loaded = dict(kaldiio.load_scp(spk_scp))
    missing = [s for s in split.enrol if s not in loaded]
    if missing:
        raise InputError(spk_scp, None, f"no model for {missing[:5]} (rerun the enrolment stage)")
    spks = list(split.enrol)
    models = np.stack([np.asarray(loaded[s], dtype=np.float64) for s in spks])
    metrics, scores, truth = closed_set(backend, spks, models, emb, split.test, args.xvector_scp)
    pred = scores.argmax(axis=1)
    lines = [
        f"{u} {s} {spks[p]} {scores[i, p]:.6f}\n" for i, ((u, s), p) in enumerate(zip(split.test, pred, strict=True))
    ]
    write_text_atomic(os.path.join(args.sid_dir, "predictions"), "".join(lines))
    name = os.path.basename(os.path.normpath(args.sid_dir))
    if args.plots:
        plot_confusion(
            confusion(truth, pred, len(spks)),
            spks,
            os.path.join(args.sid_dir, "confusion.png"),
            title=f"{name}: {len(spks)}-way, top-1 {100 * metrics['top1']:.1f}% ({backend.name})",
        )
    write_text_atomic(os.path.join(args.sid_dir, "closed.json"), jsonsafe.dumps(metrics, indent=2) + "\n")
    _merge(args.sid_dir, {**metrics, "backend": backend.name})
    log.info(
        "%s: closed set %d-way, %d test utterances: top-1 %.2f%%, top-5 %.2f%%",
        name,
        metrics["n_speakers"],
        metrics["n_test"],
        100 * metrics["top1"],
        100 * metrics["top5"],
    )


def _open(args: argparse.Namespace) -> None:

    _forget(args.sid_dir, "open")
    emb, split = _load(args)
    fars = sorted({0.01, 0.05, 0.1, args.far})
    metrics, trials = open_set(args.backend, emb, split, fars, args.lda_dim, args.xvector_scp)
    write_text_atomic(
        os.path.join(args.sid_dir, "open_trials"),
        "".join(f"{f} {u} {s} {b} {sc:.6f} {k}\n" for f, u, s, b, sc, k in trials),
    )
    metrics["open_backend"] = args.backend
    write_text_atomic(os.path.join(args.sid_dir, "open.json"), jsonsafe.dumps(metrics, indent=2) + "\n")
    _merge(args.sid_dir, metrics)
    key = f"far{args.far * 100:g}".replace(".", "p")
    log.info(
        "%s: open set, %d folds, %d known / %d impostor trials: DIR %.2f%% at FAR %.2f%% (target %g%%)",
        os.path.basename(os.path.normpath(args.sid_dir)),
        metrics["folds"],
        metrics["n_known_trials"],
        metrics["n_impostor_trials"],
        100 * metrics[f"dir_at_{key}"],
        100 * metrics[f"achieved_{key}"],
        100 * args.far,
    )


def _merge(sid_dir: str, update: dict[str, Any]) -> None:
    """metrics.json = what earlier stages wrote + ``update`` (atomically)."""

    path = os.path.join(sid_dir, "metrics.json")
    current: dict[str, Any] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            current = json.load(f)
    current.update(update)
    current["set"] = os.path.basename(os.path.normpath(sid_dir))
    write_text_atomic(path, json.dumps(current, indent=2, sort_keys=True) + "\n")


def _results(args: argparse.Namespace) -> None:

    rows = []
    for path in sorted(glob.glob(os.path.join(args.sid_root, "*", "metrics.json"))):
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
        if "top1" not in m:
            continue

        def pct(key: str, m: dict[str, Any] = m) -> str:
            return f"{100 * m[key]:.2f}" if key in m else "-"

        rows.append(
            f"| {m['set']} | {m['n_speakers']} | {m.get('num_enrol', '-')} | {m['n_test']} | {m.get('backend', '-')} "
            f"| {pct('top1')} | {pct('top5')} | {m.get('n_known_trials', '-')} / {m.get('n_impostor_trials', '-')} "
            f"| {pct('dir_at_far1')} | {pct('achieved_far1')} | {pct('dir_at_far5')} |"
        )
    text = (
        f"# Speaker identification: {args.title or os.path.dirname(os.path.normpath(args.sid_root))}\n\n"
        "Closed set: every speaker enrolled (mean of K utterance embeddings), top-N accuracy of the other\n"
        "utterances. Open set: speakers dealt into seeded folds, each fold's speakers never enrolled\n"
        "(impostors); threshold for FAR <= 1% on the impostor trials; DIR = identified and accepted.\n\n"
        "| set | speakers (N-way) | K | test utts | backend | top-1 % | top-5 % | known / impostor trials "
        "| DIR @ FAR 1% | FAR achieved % | DIR @ FAR 5% |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    out = os.path.join(args.sid_root, "RESULTS.md")
    write_text_atomic(out, text)
    log.info("%s: %d sets", out, len(rows))


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.sid", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="seeded enrolment/test split and open-set folds")
    s.add_argument("--spk2utt", required=True)
    s.add_argument("--num-enrol", type=int_at_least(1), default=2, help="K enrolment utterances per speaker")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--folds", type=int_at_least(2), default=5, help="open-set folds (1/folds of speakers held out)")
    s.add_argument("--outdir", required=True)
    s.set_defaults(func=_split)
    for name, func, help_ in (
        ("enrol", _enrol, "fit the backend on enrolment embeddings, write speaker models"),
        ("closed", _closed, "closed-set identification of the test utterances"),
        ("open", _open, "open-set identification over the folds"),
    ):
        c = sub.add_parser(name, help=help_)
        c.add_argument("--xvector-scp", required=True, help="stage-5 utterance embeddings of the set")
        c.add_argument("--sid-dir", required=True, help="the split's directory (outputs go there too)")
        if name != "closed":
            c.add_argument("--backend", choices=BACKENDS, default="cosine")
            c.add_argument("--lda-dim", type=int_at_least(0), default=0, help="0: min(D, speakers - 1)")
        if name == "open":
            c.add_argument("--far", type=float, default=0.01, help="false-alarm rate the threshold is set for")
        if name == "closed":
            c.add_argument("--plots", type=boolean, default=True)
        c.set_defaults(func=func)
    r = sub.add_parser("results", help="RESULTS.md from <sid-root>/*/metrics.json")
    r.add_argument("--sid-root", required=True)
    r.add_argument("--title", default="")
    r.set_defaults(func=_results)
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()

    try:
        args.func(args)
    except (InputError, ValueError) as err:
        log.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
