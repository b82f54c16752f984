#!/usr/bin/env python3
"""The batch's own calibration, leave one corpus out: RESULTS.md, "The batch's own calibration".

    python local/batch_calibration_loco.py --exp exp/spk_train --sets "test dsp20 dsp20_8k libri fsdd" \\
        [--gates "0 0.5 1 2"] [--sub-batches "10 20 40"] [--draws 20] [--seed 0]

For each set (data/<set>/trials, <exp>/embed/<set>/xvector.scp) the whole set is scored as one
batch with the model's scoring (<exp>/scoring.yaml), centred as ``verify --pairs`` centres it
(``set``: on its own recordings, the default) and on the training mean (``train``: ``verify
--domain-mean train``, where the model's calibration is known not to carry over), and decided

  model    by the model's calibration (``verify --calibration model``, the behaviour before),
  up G     by the batch's own calibration (:func:`spkflow.score.unsupervised_calibration.calibrate_batch`,
           no labels read) when it is trusted and puts the threshold more than G pooled std above
           the model's, else the model's (``verify --calibration auto`` with ``gate=G``),
  both G   likewise when the two thresholds lie more than G std apart either way (the rule not
           taken; ``both 0``: the batch's own whenever trusted).

Leave one corpus out: for each corpus (speechocean762 = test; DSPSpeech-20 = dsp20 + dsp20_8k, the
calibration's own corpus; LibriSpeech = libri; FSDD = fsdd) the rule is the one with the fewest
cells above 1.5 x EER over the other corpora's sets (both centrings), then the lowest mean HTER /
EER there (ties: the rule nearer the model's calibration, in the order of the first table), and
the held-out corpus's figures are reported with it.  With
``--sub-batches``, batches of N recordings drawn at random from each set (all labelled pairs
among them; ``--draws`` each) say how often the batch's calibration is used at the default gate
and what it does there.  Run in the recipe dir after ``. ./path.sh``; reads only, writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import numpy as np

from spkflow.score.metrics import compute_eer
from spkflow.score.model_scoring import Scoring
from spkflow.score.trial_scoring import read_embeddings, read_trials
from spkflow.score.unsupervised_calibration import GATE, calibrate_batch

CORPUS = {"test": "speechocean762", "dsp20": "DSPSpeech-20", "dsp20_8k": "DSPSpeech-20"}


def hter(llr: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[float, float, float]:
    """(HTER, P_miss, P_fa) in percent of the decisions llr > threshold."""
    accept = llr > threshold
    lab = labels.astype(bool)
    pm, pf = 100.0 * float((~accept[lab]).mean()), 100.0 * float(accept[~lab].mean())
    return 0.5 * (pm + pf), pm, pf


def decide(scoring: Scoring, scores: np.ndarray, n_rec: int, gate: float) -> tuple[np.ndarray, bool, float | None]:
    """LLRs as verify --calibration auto gives them at ``gate``, whether the batch's own map was
    used, and its threshold's shift from the model's (pooled std)."""
    b = calibrate_batch(
        scores, n_recordings=n_rec, model=scoring.calibration, threshold=scoring.decision.threshold, gate=gate
    )
    cal = b.calibration if b.used and b.calibration is not None else scoring.calibration
    llr = replace(scoring, calibration=cal).llr(scores)
    assert llr is not None
    return llr, b.used, b.shift


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exp", default="exp/spk_train")
    p.add_argument("--sets", default="test dsp20 dsp20_8k libri fsdd")
    p.add_argument("--gates", default="0 0.5 1 2")
    p.add_argument("--sub-batches", default="", help="recordings per random sub-batch, e.g. '10 20 40'")
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    scoring = Scoring.load(a.exp)
    if scoring.calibration is None:
        sys.exit(f"{a.exp}: the model's scoring has no calibration to compare with")
    thr = scoring.decision.threshold
    gates = sorted((float(g) for g in a.gates.split()), reverse=True)
    rules = [("model", 0.0)] + [("up", g) for g in gates] + [("both", g) for g in gates]
    sets = a.sets.split()
    # (set, centring) -> EER, model's (HTER, miss, fa), per gate: (HTER, used, shift)
    res: dict[tuple[str, str], dict] = {}
    data = {}
    for name in sets:
        trials = read_trials(f"data/{name}/trials")
        emb = read_embeddings(f"{a.exp}/embed/{name}/xvector.scp", {*trials.enroll, *trials.test})
        data[name] = (trials, emb)
        for centring in ("set", "train"):
            r = scoring.score_trials(trials, emb, domain=np.stack(list(emb.values())) if centring == "set" else None)
            s, lab = r.scores, r.labels.astype(int)
            llr0 = scoring.llr(s)
            assert llr0 is not None
            row = {"eer": compute_eer(s, lab)[0], "model": hter(llr0, lab, thr), "gate": {}}
            b = calibrate_batch(s, n_recordings=len(emb), model=scoring.calibration, threshold=thr, gate=0.0)
            for rule in rules:  # the fit does not depend on the rule: one fit, each rule applied to it
                kind, g = rule
                use = b.shift is not None and (b.shift < -g if kind == "up" else abs(b.shift) > g and kind == "both")
                assert kind != "up" or g != 0.0 or use == b.used  # the product's rule at gate 0
                cal = b.calibration if use else scoring.calibration
                llr = replace(scoring, calibration=cal).llr(s)
                row["gate"][rule] = (*hter(llr, lab, thr), use, b.shift)
            row["reason"] = b.reason
            row["p"] = (None if b.mixture is None else b.mixture.p_target, float(lab.mean()))
            res[(name, centring)] = row
            print(f"# {name} centred on the {centring}: {b.reason}", file=sys.stderr, flush=True)

    def ratio(name: str, centring: str, rule: tuple[str, float]) -> float:
        row = res[(name, centring)]
        return row["gate"][rule][0] / row["eer"]

    def label(rule: tuple[str, float]) -> str:
        return rule[0] if rule[0] == "model" else f"{rule[0]} {rule[1]:g}"

    print(f"model: {a.exp}; its calibration: {scoring.calibration.fitted_on}; decisions LLR > {thr:g}\n")
    print("| set | centred on | EER (%) | model's calibration: HTER (%) (x EER), P_miss / P_fa | "
          + " | ".join(label(r) for r in rules[1:]) + " | shift (std) | targets: fitted / true |")  # fmt: skip
    print("|---|---|---|---|" + "---|" * (len(rules) - 1) + "---|---|")
    for name in sets:
        for centring in ("set", "train"):
            row = res[(name, centring)]
            h, pm, pf = row["model"]
            cells = [f"{row['gate'][r][0]:.2f} ({ratio(name, centring, r):.2f} x){'' if row['gate'][r][3] else ' =' }"
                     for r in rules[1:]]  # fmt: skip
            shift = row["gate"][rules[0]][4]
            print(f"| {name} | {centring} | {row['eer']:.2f} | {h:.2f} ({h / row['eer']:.2f} x), {pm:.2f} / {pf:.2f} | "
                  + " | ".join(cells) + f" | {'-' if shift is None else f'{shift:+.2f}'} | "
                  + ("-" if row["p"][0] is None else f"{row['p'][0]:.3f}") + f" / {row['p'][1]:.3f} |")  # fmt: skip
    print("\n('=': the model's calibration kept by that rule; shift: the model's threshold minus the batch's.)\n")
    print("Leave one corpus out: the rule chosen on the other corpora, figures on the held-out one.\n")
    print("| held-out set | centred on | rule chosen (cells > 1.5 x, mean x EER on the others) | EER (%) "
          "| before: HTER (x EER) | after: HTER (x EER), P_miss / P_fa | batch's own used |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in sets:
        corpus = CORPUS.get(name, name)
        others = [(n, c) for n in sets if CORPUS.get(n, n) != corpus for c in ("set", "train")]

        def key(r: tuple[str, float], others: list = others) -> tuple[int, float]:
            x = [ratio(n, c, r) for n, c in others]
            return sum(v > 1.5 for v in x), round(float(np.mean(x)), 3)

        best = min(rules, key=key)  # min keeps the first of equals: nearer the model's
        worst = "{} > 1.5 x, mean {:.2f} x".format(*key(best))
        for centring in ("set", "train"):
            row = res[(name, centring)]
            h0 = row["model"][0]
            h, pm, pf, used, _ = row["gate"][best]
            print(f"| {name} | {centring} | {label(best)} ({worst}) | {row['eer']:.2f} | {h0:.2f} "
                  f"({h0 / row['eer']:.2f} x) | {h:.2f} ({h / row['eer']:.2f} x), {pm:.2f} / {pf:.2f} | "
                  f"{'yes' if used else 'no'} |")  # fmt: skip
    if a.sub_batches:
        rng = np.random.default_rng(a.seed)
        print(f"\nSub-batches, gate {GATE:g}: mean HTER (%) of {a.draws} draws (model's -> auto), and in how "
              "many of the draws the batch's own calibration decided\n")  # fmt: skip
        sizes = [int(x) for x in a.sub_batches.split()]
        print("| set | centred on | " + " | ".join(f"{n} recordings" for n in sizes) + " |")
        print("|---|---|" + "---|" * len(sizes))
        for name in sets:
            trials, emb = data[name]
            keys = list(emb)
            for centring in ("set", "train"):
                cells = []
                for n in sizes:
                    before, after, used = [], [], 0
                    for _ in range(a.draws):
                        pick = set(rng.choice(keys, min(n, len(keys)), replace=False))
                        keep = np.array(
                            [x in pick and y in pick for x, y in zip(trials.enroll, trials.test, strict=True)]
                        )
                        sub = trials.subset(keep)
                        if not 0 < sub.target.sum() < len(sub):
                            continue
                        sub_emb = {k: emb[k] for k in pick}
                        dom = np.stack(list(sub_emb.values())) if centring == "set" else None
                        r = scoring.score_trials(sub, sub_emb, domain=dom)
                        lab = r.labels.astype(int)
                        llr0 = scoring.llr(r.scores)
                        assert llr0 is not None
                        llr, u, _ = decide(scoring, r.scores, len(pick), GATE)
                        before.append(hter(llr0, lab, thr)[0])
                        after.append(hter(llr, lab, thr)[0])
                        used += u
                    cells.append(
                        f"{np.mean(before):.2f} -> {np.mean(after):.2f} ({used}/{len(before)})" if before else "-"
                    )
                print(f"| {name} | {centring} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
