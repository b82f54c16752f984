#!/usr/bin/env python3
"""Leave-one-corpus-out choice of the speaker-count method: choose on the other corpora, report on
the one left out.  Run from the recipe's folder after stage 3 (`. ./path.sh`):

    python local/loco_count.py [--sets "loco_so762 loco_libri loco_dsp loco_fsdd ami"] \\
        [--windows oracle_w1.5s0.75] [--embed exp/diar_spk_train/embed] \\
        [--scoring-dir ../spk1/exp/spk_train] [--crit forgiving]

The candidates are the pipeline's own options (:class:`spkflow.diar.pipeline.DiarOptions`, the
code stage 4, ``diarize`` and the API run): ``method`` ahc (the calibrated LLR stop; only with a
calibrated scoring), spectral, gmm (the two-component fit of the recording's own scores, each
``posterior`` of :mod:`spkflow.diar.pair_fit` in ``--posteriors``) x ``centre`` none / set /
recording x resegmentation on / off, the count estimated (at most ``--max-speakers``).  For each
corpus left out: the candidate with the lowest mean DER (``--crit``) over the others (each corpus
weighs the same), its DER on the one left out, and beside it on that corpus: the previous default
(``ahc``, or ``spectral`` without a calibration, centred on the set, resegmented), the
peer (turn-to-diarize's spectral clusterer at its documented settings,
``spectralcluster.configs.turntodiarize_*``, min 1 / max ``--max-speakers`` clusters, on the plain
L2-normalised window embeddings, without speaker-turn constraints) and two bounds: the count
given to the pipeline's default and to the peer.  DER from :func:`spkflow.diar.metrics.score_diarization`
(stage 5's scoring).  Prints markdown; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from spkflow.diar.metrics import score_diarization
from spkflow.diar.pipeline import DiarOptions, cluster_recording
from spkflow.diar.recipe_stages import read_speech_dir
from spkflow.diar.recordings import load_recordings
from spkflow.diar.rttm import Turn
from spkflow.diar.windows import Window, read_window_dir, windows_to_turns
from spkflow.score.model_scoring import Scoring, has_scoring
from spkflow.score.trial_scoring import read_embeddings


@dataclass
class Rec:
    name: str
    ws: list[Window]
    x: np.ndarray
    regions: list[tuple[float, float]]
    ref: list[Turn]
    scored: list[tuple[float, float]]

    @property
    def k(self) -> int:
        return len({t.speaker for t in self.ref})


def load_set(data: Path, work: Path, scp: Path) -> list[Rec]:
    rs = load_recordings(data, need_rttm=True)
    recs, regions = read_speech_dir(work / "speech")
    by_rec = read_window_dir(work / "windows")
    emb = read_embeddings(scp, [w.id for ws in by_rec.values() for w in ws])
    out = []
    for r in recs:
        ws = sorted(by_rec.get(r, []), key=lambda w: (w.start, w.end))
        if ws:
            x = np.stack([np.asarray(emb[w.id], dtype=np.float64).reshape(-1) for w in ws])
            out.append(Rec(r, ws, x, regions[r], (rs.turns or {}).get(r, []), rs.scored(r)))
    return out


def peer_labels(x: np.ndarray, k: int | None, max_speakers: int) -> np.ndarray:
    """turn-to-diarize's clusterer at its documented settings (module doc)."""
    from copy import deepcopy

    from spectralcluster import configs

    if len(x) < 2:
        return np.zeros(len(x), dtype=np.int64)
    k = min(k, len(x)) if k else None
    c = configs.SpectralClusterer(
        min_clusters=k or 1,
        max_clusters=k or max_speakers,
        refinement_options=deepcopy(configs.turntodiarize_refinement_options),  # the clusterer sets fields
        constraint_options=deepcopy(configs.turntodiarize_constraint_options),
        autotune=deepcopy(configs.turntodiarize_auto_tune),
        laplacian_type=configs.LaplacianType.GraphCut,
        row_wise_renorm=True,
        custom_dist="cosine",
    )
    y = x / np.linalg.norm(x, axis=1, keepdims=True)
    with np.errstate(all="ignore"):
        return np.asarray(c.predict(np.ascontiguousarray(y)), dtype=np.int64)


def score(recs: list[Rec], labels: dict[str, np.ndarray]) -> dict[str, float]:
    ref = {r.name: r.ref for r in recs}
    hyp = {r.name: windows_to_turns(r.ws, [int(v) for v in labels[r.name]], r.regions) for r in recs}
    total = dict(score_diarization(ref, hyp, {r.name: r.scored for r in recs}).total)
    total["count_exact"] = 100.0 * float(np.mean([len(set(labels[r.name].tolist())) == r.k for r in recs]))
    return total


def run(recs: list[Rec], scoring: Scoring, opts: DiarOptions, oracle: bool) -> dict:
    domain = np.concatenate([r.x for r in recs])
    labels = {}
    for r in recs:
        o = replace(opts, num_speakers=r.k) if oracle else opts
        labels[r.name] = cluster_recording(r.x, scoring, o, domain)
    return score(recs, labels)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", default="loco_so762 loco_libri loco_dsp loco_fsdd ami")
    p.add_argument("--windows", default="oracle_w1.5s0.75", help="the windows' tag: <speech>_w<window>s<shift>")
    p.add_argument("--dumpdir", default="dump")
    p.add_argument("--datadir", default="data")
    p.add_argument("--embed", default="exp/diar_spk_train/embed", help="stage 3's embeddings: <embed>/<set>.<windows>")
    p.add_argument("--scoring-dir", default="../spk1/exp/spk_train", help="the model's scoring.yaml, or none")
    p.add_argument("--crit", default="forgiving", choices=("forgiving", "fair", "full"))
    p.add_argument("--posteriors", default="0.3 0.5 0.7")
    p.add_argument("--max-speakers", type=int, default=8)
    a = p.parse_args()
    has = a.scoring_dir != "none" and has_scoring(a.scoring_dir)
    scoring = Scoring.load(a.scoring_dir) if has else Scoring()
    calibrated = has and scoring.calibration is not None
    sets = a.sets.split()
    data = {
        s: load_set(
            Path(a.datadir) / s,
            Path(a.dumpdir) / f"{s}.{a.windows}",
            Path(a.embed) / f"{s}.{a.windows}" / "xvector.scp",
        )
        for s in sets
    }
    mx = a.max_speakers
    cands: dict[str, DiarOptions] = {}
    for centre in ("set", "none", "recording"):
        for reseg in (True, False):
            tail = f"centre={centre}{'' if reseg else ' no-reseg'}"
            base = DiarOptions(centre=centre, resegment=reseg, max_speakers=mx, backend=has)
            if calibrated:
                cands[f"ahc {tail}"] = replace(base, method="ahc")
            cands[f"spectral {tail}"] = replace(base, method="spectral")
            for post in (float(v) for v in a.posteriors.split()):
                cands[f"gmm posterior={post:g} {tail}"] = replace(base, method="gmm", posterior=post)
    default = f"{'ahc' if calibrated else 'spectral'} centre=set"
    crit = f"der_{a.crit}"
    res: dict[str, dict[str, dict]] = {k: {} for k in cands}
    bounds: dict[str, dict[str, dict]] = {"given": {}, "peer": {}, "peer_given": {}}
    t0 = time.process_time()
    for s, recs in data.items():
        for k, opts in cands.items():
            res[k][s] = run(recs, scoring, opts, oracle=False)
        bounds["given"][s] = run(recs, scoring, cands[default], oracle=True)
        for name, oracle in (("peer", False), ("peer_given", True)):
            labels = {r.name: peer_labels(r.x, r.k if oracle else None, mx) for r in recs}
            bounds[name][s] = score(recs, labels)
        n = sum(len(r.x) for r in recs)
        print(f"<!-- {s}: {len(recs)} recordings, {n} windows; cpu {time.process_time() - t0:.0f} s -->", flush=True)

    def mean(k: str, over: list[str]) -> float:
        return float(np.mean([res[k][o][crit] for o in over]))

    print(f"\nDER {a.crit} in %; embeddings {a.embed}, scoring {a.scoring_dir}; {len(cands)} candidates\n")
    print(
        "| left out | chosen on the others | DER | count exact % | mean on the others | previous default "
        "| peer | count given (default) | count given (peer) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    held, dflt = [], []
    for s in sets:
        others = [o for o in sets if o != s]
        k = min(cands, key=lambda c: mean(c, others))
        r = res[k][s]
        held.append(r[crit])
        dflt.append(res[default][s][crit])
        print(
            f"| {s} | `{k}` | {r[crit]:.2f} | {r['count_exact']:.0f} | {mean(k, others):.2f} "
            f"| {res[default][s][crit]:.2f} ({res[default][s]['count_exact']:.0f} %) "
            f"| {bounds['peer'][s][crit]:.2f} ({bounds['peer'][s]['count_exact']:.0f} %) "
            f"| {bounds['given'][s][crit]:.2f} | {bounds['peer_given'][s][crit]:.2f} |"
        )
    print(
        f"| **mean** | | **{np.mean(held):.2f}** | | | **{np.mean(dflt):.2f}** "
        f"| {np.mean([bounds['peer'][s][crit] for s in sets]):.2f} "
        f"| {np.mean([bounds['given'][s][crit] for s in sets]):.2f} "
        f"| {np.mean([bounds['peer_given'][s][crit] for s in sets]):.2f} |"
    )
    print("\nEach candidate on each corpus (a development figure where the corpus chose it):\n")
    print("| candidate | " + " | ".join(sets) + " | mean |")
    print("|---|" + "---|" * (len(sets) + 1))
    for k in sorted(cands, key=lambda c: mean(c, sets)):
        print(f"| `{k}` | " + " | ".join(f"{res[k][s][crit]:.2f}" for s in sets) + f" | {mean(k, sets):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
