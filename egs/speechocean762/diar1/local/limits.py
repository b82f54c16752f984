#!/usr/bin/env python3
"""What bounds a diarization figure: the pipeline's own floor, and how well the embedder tells
the speakers of a recording apart.  Run from the recipe's folder after stage 3 (`. ./path.sh`):

    python local/limits.py [--sets "sim_so762 sim ami"] [--windows oracle_w1.5s0.75] \\
        [--embed exp/diar_spk_train/embed] [--scoring-dir ../spk1/exp/spk_train]

Per set, two figures that no clustering option changes:

* **floor**: DER (forgiving / fair / full) of the windows labelled with their reference speaker
  (the one who speaks longest inside the window), made into turns by stage 4's own
  ``windows_to_turns`` and scored as stage 5 scores: perfect clustering with these windows;
* **window EER**: the equal error rate of "same speaker?" over pairs of windows of one recording
  (windows >= 90 % one speaker), scored in the space stage 4 clusters in (the model's backend
  centred on the set's windows; with ``--scoring-dir none`` plain L2-normalised vectors centred
  on the set): how separable the embedder makes the speakers at this window length.

Prints a markdown table; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from spkflow.diar.metrics import score_diarization
from spkflow.diar.pipeline import DiarOptions, embedding_space
from spkflow.diar.recipe_stages import read_speech_dir
from spkflow.diar.recordings import load_recordings
from spkflow.diar.rttm import Turn
from spkflow.diar.windows import Window, read_window_dir, windows_to_turns
from spkflow.score.metrics import compute_eer
from spkflow.score.model_scoring import Scoring, has_scoring
from spkflow.score.trial_scoring import read_embeddings

PURE = 0.9  # share of a window's reference speech one speaker must hold for the EER pairs


def reference_labels(ws: list[Window], turns: list[Turn]) -> tuple[list[int], np.ndarray]:
    """Each window's longest-speaking reference speaker (an index) and that speaker's share."""
    speakers = sorted({t.speaker for t in turns})
    labels, share = [], []
    for w in ws:
        talk = np.zeros(len(speakers))
        for t in turns:
            talk[speakers.index(t.speaker)] += max(0.0, min(w.end, t.end) - max(w.start, t.start))
        labels.append(int(talk.argmax()))
        share.append(talk.max() / talk.sum() if talk.sum() > 0 else 0.0)
    return labels, np.array(share)


def limits(data: Path, work: Path, scp: Path, scoring: Scoring, backend: bool) -> dict[str, float]:
    rs = load_recordings(data, need_rttm=True)
    turns = rs.turns or {}
    recs, regions = read_speech_dir(work / "speech")
    by_rec = read_window_dir(work / "windows")
    emb = read_embeddings(scp, [w.id for ws in by_rec.values() for w in ws])
    domain = np.stack([np.asarray(v, dtype=np.float64).reshape(-1) for v in emb.values()])
    opts = DiarOptions(method="ahc", centre="set", backend=backend)
    hyp: dict[str, list[Turn]] = {}
    same, other = [], []
    for rec in recs:
        ws = sorted(by_rec.get(rec, []), key=lambda w: (w.start, w.end))
        if not ws:
            continue
        labels, share = reference_labels(ws, turns.get(rec, []))
        hyp[rec] = windows_to_turns(ws, labels, regions[rec])
        keep = np.flatnonzero(share >= PURE)
        if len(keep) < 2:
            continue
        x = np.stack([np.asarray(emb[ws[i].id], dtype=np.float64).reshape(-1) for i in keep])
        y = embedding_space(x, scoring, opts, domain)
        sim, lab = y @ y.T, np.array(labels)[keep]
        i, j = np.triu_indices(len(keep), 1)
        same.append(sim[i, j][lab[i] == lab[j]])
        other.append(sim[i, j][lab[i] != lab[j]])
    total = score_diarization(turns, hyp, {r: rs.scored(r) for r in rs.recordings}).total
    tar, non = np.concatenate(same), np.concatenate(other)
    eer = compute_eer(np.concatenate([tar, non]), np.r_[np.ones(len(tar)), np.zeros(len(non))])[0]
    return {**{k: total[f"der_{k}"] for k in ("forgiving", "fair", "full")}, "eer": eer, "pairs": len(tar) + len(non)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", default="sim_so762 sim ami")
    p.add_argument("--windows", default="oracle_w1.5s0.75", help="the windows' tag: <speech>_w<window>s<shift>")
    p.add_argument("--dumpdir", default="dump")
    p.add_argument("--embed", default="exp/diar_spk_train/embed", help="stage 3's embeddings: <embed>/<set>.<windows>")
    p.add_argument("--scoring-dir", default="../spk1/exp/spk_train", help="the model's scoring.yaml, or none")
    a = p.parse_args()
    has = a.scoring_dir != "none" and has_scoring(a.scoring_dir)
    scoring = Scoring.load(a.scoring_dir) if has else Scoring()
    print(f"| set | windows | floor DER forgiving / fair / full | window EER (%) | pairs |  ({a.embed})")
    print("|---|---|---|---|---|")
    for s in a.sets.split():
        work = Path(a.dumpdir) / f"{s}.{a.windows}"
        r = limits(Path("data") / s, work, Path(a.embed) / f"{s}.{a.windows}" / "xvector.scp", scoring, has)
        floor = f"{r['forgiving']:.2f} / {r['fair']:.2f} / {r['full']:.2f}"
        print(f"| {s} | {a.windows} | {floor} | {r['eer']:.2f} | {r['pairs']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
