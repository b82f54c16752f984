"""The speaker identification stages' outputs: what each stage writes into a set's dir, and RESULTS.md.

``sid.sh`` runs, per test set, :func:`split_stage`, :func:`enrol_stage`, :func:`closed_stage`
and :func:`open_stage` (through ``python -m spkflow.bin.sid``), then :func:`write_results` over
the sets; the identification itself is :mod:`spkflow.score.sid`.

* ``split``: enrol / test / folds / dropped_spks (the speakers left out are named with their
  number of utterances); ``enrol``: backend.npz + spk_model.{ark,scp} (speaker models, Kaldi
  ark); ``closed``: closed.json, predictions, confusion.png; ``open``: open.json, open_trials;
  the figures of each go into the set's metrics.json too.
* Before it reads anything, each stage removes what it writes and what the stages after it (in
  this order) wrote: their files, their figures in metrics.json, and the sid root's RESULTS.md;
  after a failure no figure of an earlier run looks current.  Every file is written atomically,
  and a speaker-model scp on disk always points into a complete ark of the same run.

The comparison with Kaldi, SpeechBrain and NeMo (closed-set identification only, outputs
rewritten in place) is in egs/speechocean762/sid1/README.md; what these stages add is that a
rerun from any stage leaves only what it and the stages before it wrote.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
from typing import Any

from spkflow.core import jsonsafe
from spkflow.core.atomic import atomic_write, write_text_atomic
from spkflow.core.errors import InputError
from spkflow.data.tables import read_spk2utt
from spkflow.score.backend import Backend, fit_backend
from spkflow.score.plots import plot_confusion
from spkflow.score.sid import Split, closed_set, confusion, enrol, gather, make_split, open_set, read_split, write_split
from spkflow.score.trial_scoring import read_embeddings

__all__ = ["STAGES", "closed_stage", "enrol_stage", "forget", "open_stage", "split_stage", "write_results"]

log = logging.getLogger("spkflow.score.sid")

#: The stages in the recipe's order (sid.sh stages 6, 6, 7, 8): rerunning one makes the later ones stale.
STAGES = ("split", "enrol", "closed", "open")
# What each stage writes into a set's dir, and the metrics.json keys it sets (prefixes end in "_").
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


def forget(sid_dir: str, stage: str) -> None:
    """Remove what ``stage`` and the stages after it wrote (files, metrics.json keys; the backend
    key goes with enrol) and the sid root's RESULTS.md: what follows is rewritten or left absent."""
    later = STAGES[STAGES.index(stage) :]
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


def split_stage(spk2utt_path: str, outdir: str, num_enrol: int = 2, seed: int = 0, folds: int = 5) -> Split:
    """The seeded enrolment/test split of ``spk2utt_path`` and its open-set folds, into ``outdir``."""
    forget(outdir, "split")
    spk2utt = read_spk2utt(spk2utt_path)
    split = make_split(spk2utt, num_enrol, seed, folds)
    write_split(split, outdir)
    if split.dropped:
        shown = ", ".join(f"{s} ({len(spk2utt[s])})" for s in split.dropped[:20])
        more = f" and {len(split.dropped) - 20} more" if len(split.dropped) > 20 else ""
        log.warning(
            "%s: %d speaker(s) left out, with fewer than K + 1 = %d utterances (K = %d to enrol, at least one "
            "to test): %s%s (utterances in brackets); listed in %s",
            spk2utt_path,
            len(split.dropped),
            num_enrol + 1,
            num_enrol,
            shown,
            more,
            os.path.join(outdir, "dropped_spks"),
        )
    _merge(outdir, {"num_enrol": num_enrol, "split_seed": seed, "n_dropped_speakers": len(split.dropped)})
    log.info(
        "%s: %d speakers x %d enrolment utterances, %d test utterances, %d speakers left out "
        "(< %d utterances), %d open-set folds",
        outdir,
        len(split.enrol),
        num_enrol,
        len(split.test),
        len(split.dropped),
        num_enrol + 1,
        folds,
    )
    return split


def enrol_stage(xvector_scp: str, sid_dir: str, backend_name: str = "cosine", lda_dim: int = 0) -> None:
    """Fit the backend on the enrolment embeddings; write it and the speaker models (ark + scp)."""
    import kaldiio
    import numpy as np

    forget(sid_dir, "enrol")
    emb, split = read_embeddings(xvector_scp), read_split(sid_dir)
    utts = [u for s in split.enrol for u in split.enrol[s]]
    labels = [s for s in split.enrol for _ in split.enrol[s]]
    backend = fit_backend(backend_name, gather(emb, utts, xvector_scp), labels, lda_dim)
    spks, models = enrol(backend, emb, split.enrol, xvector_scp)
    backend.save(os.path.join(sid_dir, "backend.npz"))
    # Old scp removed first, then the ark, then the new scp written atomically: an scp on disk
    # always points into a complete ark of the same run (a kill in between leaves no scp).
    ark, scp = os.path.join(sid_dir, "spk_model.ark"), os.path.join(sid_dir, "spk_model.scp")
    if os.path.exists(scp):
        os.unlink(scp)
    offsets = []
    with atomic_write(ark, "wb") as f:
        for s, m in zip(spks, models, strict=True):
            f.write(f"{s} ".encode())
            offsets.append(f.tell())
            kaldiio.save_mat(f, m.astype(np.float32))
    write_text_atomic(scp, "".join(f"{s} {ark}:{o}\n" for s, o in zip(spks, offsets, strict=True)))
    _merge(sid_dir, {"backend": backend_name, "n_enrol_utts": len(utts)})
    log.info("%s: %d speaker models (%s backend, dim %d) -> %s", sid_dir, len(spks), backend_name, models.shape[1], scp)


def closed_stage(xvector_scp: str, sid_dir: str, plots: bool = True) -> dict[str, Any]:
    """Closed-set identification of the test utterances against the enrolled speaker models."""
    import kaldiio
    import numpy as np

    forget(sid_dir, "closed")
    spk_scp, backend_npz = os.path.join(sid_dir, "spk_model.scp"), os.path.join(sid_dir, "backend.npz")
    for path in (spk_scp, backend_npz):
        if not os.path.exists(path):
            raise InputError(path, None, "not found: run the enrolment stage (sid enrol) first")
    emb, split = read_embeddings(xvector_scp), read_split(sid_dir)
    backend = Backend.load(backend_npz)
    loaded = dict(kaldiio.load_scp(spk_scp))
    missing = [s for s in split.enrol if s not in loaded]
    if missing:
        raise InputError(spk_scp, None, f"no model for {missing[:5]} (rerun the enrolment stage)")
    spks = list(split.enrol)
    models = np.stack([np.asarray(loaded[s], dtype=np.float64) for s in spks])
    metrics, scores, truth = closed_set(backend, spks, models, emb, split.test, xvector_scp)
    pred = scores.argmax(axis=1)
    lines = [
        f"{u} {s} {spks[p]} {scores[i, p]:.6f}\n" for i, ((u, s), p) in enumerate(zip(split.test, pred, strict=True))
    ]
    write_text_atomic(os.path.join(sid_dir, "predictions"), "".join(lines))
    name = os.path.basename(os.path.normpath(sid_dir))
    if plots:
        plot_confusion(
            confusion(truth, pred, len(spks)),
            spks,
            os.path.join(sid_dir, "confusion.png"),
            title=f"{name}: {len(spks)}-way, top-1 {100 * metrics['top1']:.1f}% ({backend.name})",
        )
    write_text_atomic(os.path.join(sid_dir, "closed.json"), jsonsafe.dumps(metrics, indent=2) + "\n")
    _merge(sid_dir, {**metrics, "backend": backend.name})
    log.info(
        "%s: closed set %d-way, %d test utterances: top-1 %.2f%%, top-5 %.2f%%",
        name,
        metrics["n_speakers"],
        metrics["n_test"],
        100 * metrics["top1"],
        100 * metrics["top5"],
    )
    return metrics


def open_stage(
    xvector_scp: str, sid_dir: str, backend_name: str = "cosine", lda_dim: int = 0, far: float = 0.01
) -> dict[str, Any]:
    """Open-set identification over the split's folds, thresholds at FAR 1%, 5%, 10% and ``far``."""
    forget(sid_dir, "open")
    emb, split = read_embeddings(xvector_scp), read_split(sid_dir)
    fars = sorted({0.01, 0.05, 0.1, far})
    metrics, trials = open_set(backend_name, emb, split, fars, lda_dim, xvector_scp)
    write_text_atomic(
        os.path.join(sid_dir, "open_trials"),
        "".join(f"{f} {u} {s} {b} {sc:.6f} {k}\n" for f, u, s, b, sc, k in trials),
    )
    metrics["open_backend"] = backend_name
    write_text_atomic(os.path.join(sid_dir, "open.json"), jsonsafe.dumps(metrics, indent=2) + "\n")
    _merge(sid_dir, metrics)
    key = f"far{far * 100:g}".replace(".", "p")
    log.info(
        "%s: open set, %d folds, %d known / %d impostor trials: DIR %.2f%% at FAR %.2f%% (target %g%%)",
        os.path.basename(os.path.normpath(sid_dir)),
        metrics["folds"],
        metrics["n_known_trials"],
        metrics["n_impostor_trials"],
        100 * metrics[f"dir_at_{key}"],
        100 * metrics[f"achieved_{key}"],
        100 * far,
    )
    return metrics


def write_results(sid_root: str, title: str = "") -> str:
    """``sid_root``/RESULTS.md: one row per set with closed-set figures (``*/metrics.json``); returns its path."""
    rows = []
    for path in sorted(glob.glob(os.path.join(sid_root, "*", "metrics.json"))):
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
        f"# Speaker identification: {title or os.path.dirname(os.path.normpath(sid_root))}\n\n"
        "Closed set: every speaker enrolled (mean of K utterance embeddings), top-N accuracy of the other\n"
        "utterances. Open set: speakers dealt into seeded folds, each fold's speakers never enrolled\n"
        "(impostors); threshold for FAR <= 1% on the impostor trials; DIR = identified and accepted.\n\n"
        "| set | speakers (N-way) | K | test utts | backend | top-1 % | top-5 % | known / impostor trials "
        "| DIR @ FAR 1% | FAR achieved % | DIR @ FAR 5% |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    out = os.path.join(sid_root, "RESULTS.md")
    write_text_atomic(out, text)
    log.info("%s: %d sets", out, len(rows))
    return out
