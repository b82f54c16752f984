#!/usr/bin/env python3
"""How the packed calibration's decisions depend on the centring: RESULTS.md, "Calibrated decisions".

    python local/calibration_study.py --exp exp/spk_train --sets "test dsp20 dsp20_8k libri fsdd" \\
        [--draws 5] [--domain-size 10] [--seed 0]

For each set (data/<set>/trials, <exp>/embed/<set>/xvector.scp), with the model's scoring
(<exp>/scoring.yaml, written by stage 6), the decisions' half total error rate (HTER) against
the EER of the same scores, when the scores are centred

  set      on the set's own recordings (what spkflow.bin.verify does with a batch),
  train    on the training mean (one pair alone, or verify --domain-mean train),
  random   on --domain-size recordings of the set drawn at random, --draws times (verify
           --domain-mean DATA_DIR with a few recordings like the scored ones): min-max,
  calib    on the mean of the calibration set's recordings (what one pair gets: verify's
           --domain-mean auto with fewer than 10 recordings, Embedder.verify's default),
  saved    on the recordings of one half of the set's speakers (a saved enrolment, verify
           --domain-mean GALLERY), scoring only the trials among the other half's speakers,
           against the same trials centred on that half's own recordings (its batch HTER),

and, as the alternative not taken, a calibration fitted on the same calibration trials centred on
the training mean and applied at the training mean ("fit@train").  Run in the recipe dir after
``. ./path.sh``; reads only, writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import numpy as np

from spkflow.data.tables import read_kv
from spkflow.score.metrics import compute_eer
from spkflow.score.model_scoring import Scoring, calibrate_trials
from spkflow.score.trial_scoring import Trials, read_embeddings, read_trials


def hter_ratio(scoring: Scoring, scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(HTER %, HTER / EER) of the decisions llr > threshold on these final scores."""
    llr = scoring.llr(scores)
    accept = llr > scoring.decision.threshold
    lab = labels.astype(bool)
    hter = 50.0 * ((~accept[lab]).mean() + accept[~lab].mean())
    return hter, hter / compute_eer(scores, labels)[0]


def _half(scoring: Scoring, trials: Trials, emb: dict, utt2spk: dict, rng: np.random.Generator) -> str:
    """HTER of the trials among half of the speakers centred on the other half's recordings,
    and (/) that against the same trials centred on their own recordings."""
    spk = {k: utt2spk[k] for k in emb}
    speakers = sorted(set(spk.values()))
    if len(speakers) < 4:
        return "n/a (fewer than 4 speakers)"
    chosen = set(rng.choice(speakers, len(speakers) // 2, replace=False))
    keep = np.array(
        [spk[a] not in chosen and spk[b] not in chosen for a, b in zip(trials.enroll, trials.test, strict=True)]
    )
    sub = trials.subset(keep)
    if not (0 < sub.target.sum() < len(sub)):
        return "n/a (one label only)"
    saved = np.stack([v for k, v in emb.items() if spk[k] in chosen])
    own = np.stack([v for k, v in emb.items() if spk[k] not in chosen])
    on_saved = scoring.score_trials(sub, emb, domain=saved)
    on_own = scoring.score_trials(sub, emb, domain=own)
    h_saved = hter_ratio(scoring, on_saved.scores, on_saved.labels)[0]
    h_own = hter_ratio(scoring, on_own.scores, on_own.labels)[0]
    return f"{h_saved:.2f} / {h_own:.2f} ({h_saved / h_own:.2f} x)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exp", default="exp/spk_train")
    p.add_argument("--sets", default="test dsp20 dsp20_8k libri fsdd")
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--domain-size", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    scoring = Scoring.load(a.exp)
    fitted = scoring.fitted
    calib_trials, calib_scp = fitted.get("trials"), fitted.get("xvector_scp")
    if not calib_trials or not os.path.isfile(calib_trials):
        sys.exit(f"{a.exp}/scoring.yaml: its calibration trials {calib_trials!r} are not here")
    ct = read_trials(calib_trials)
    at_train = scoring.score_trials(ct, read_embeddings(calib_scp, {*ct.enroll, *ct.test}))
    fit_train = replace(scoring, calibration=calibrate_trials(at_train, prior=scoring.decision.p_target))
    rng = np.random.default_rng(a.seed)
    print(f"calibration of {a.exp}: {scoring.calibration.fitted_on}; fit@train: LLR = "
          f"{fit_train.calibration.weights[0]:.4g} x score {fit_train.calibration.bias:+.4g}")  # fmt: skip
    print(
        "| set | HTER (x EER) centred on the set | on the training mean | on "
        f"{a.domain_size} random recordings ({a.draws} draws) | fit@train, at the training mean "
        "| one pair: on the calibration set's mean (/ batch HTER) | one pair: on the other half's recordings "
        "(/ batch HTER of that half) |"
    )
    print("|---|---|---|---|---|---|---|")
    cal_emb = read_embeddings(calib_scp, {*ct.enroll, *ct.test})
    cal_mean = np.stack(list(cal_emb.values()))
    for name in a.sets.split():
        trials = read_trials(f"data/{name}/trials")
        emb = read_embeddings(f"{a.exp}/embed/{name}/xvector.scp", {*trials.enroll, *trials.test})
        own = np.stack(list(emb.values()))
        on_set = scoring.score_trials(trials, emb, domain=own)
        on_train = scoring.score_trials(trials, emb)
        keys = list(emb)
        draws = []
        for _ in range(a.draws):
            dom = np.stack([emb[k] for k in rng.choice(keys, a.domain_size, replace=False)])
            r = scoring.score_trials(trials, emb, domain=dom)
            draws.append(hter_ratio(scoring, r.scores, r.labels)[0])
        cells = [
            hter_ratio(scoring, on_set.scores, on_set.labels),
            hter_ratio(scoring, on_train.scores, on_train.labels),
        ]
        alt = hter_ratio(fit_train, on_train.scores, on_train.labels)
        on_cal = scoring.score_trials(trials, emb, domain=cal_mean)
        cal = hter_ratio(scoring, on_cal.scores, on_cal.labels)
        half = _half(scoring, trials, emb, read_kv(f"data/{name}/utt2spk"), rng)
        print(
            f"| {name} | {cells[0][0]:.2f} ({cells[0][1]:.2f} x) | {cells[1][0]:.2f} ({cells[1][1]:.2f} x) | "
            f"{min(draws):.2f}-{max(draws):.2f} | {alt[0]:.2f} ({alt[1]:.2f} x) | {cal[0]:.2f} "
            f"({cal[0] / cells[0][0]:.2f} x) | {half} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
