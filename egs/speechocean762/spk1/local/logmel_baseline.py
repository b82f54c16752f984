#!/usr/bin/env python3
"""Non-learned reference point: each utterance is the mean and standard deviation of its voiced
log-mel frames (stage-2 features), scored by cosine like the trained models.

    python local/logmel_baseline.py [--sets "test dsp20"] [--dumpdir dump] [--expdir exp]

Writes exp/logmel_baseline/embed/<set>/xvector.{ark,scp} and, through the same code as
stage 6, exp/logmel_baseline/eval/<set>/{scores,metrics.json,det.png,score_hist.png}.  A learned
embedder that does not beat this on a test set has not learned much about speakers there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import kaldiio
import numpy as np
from tqdm import tqdm

from spkflow.core.atomic import atomic_write
from spkflow.features.fbank import select_voiced
from spkflow.score.eval_report import evaluate_set


def embed_set(feats_dir: Path, out_dir: Path) -> Path:
    vad_scp = feats_dir / "vad.scp"
    vads = kaldiio.load_scp(str(vad_scp)) if vad_scp.is_file() else {}
    out_dir.mkdir(parents=True, exist_ok=True)
    ark, scp = out_dir / "xvector.ark", out_dir / "xvector.scp"
    feats = kaldiio.load_scp(str(feats_dir / "feats.scp"))
    lines = []
    with open(ark, "wb") as f:
        for utt in tqdm(list(feats), desc=feats_dir.name, unit="utt"):
            x = select_voiced(np.asarray(feats[utt], dtype=np.float64), vads.get(utt))
            v = np.concatenate([x.mean(axis=0), x.std(axis=0)]).astype(np.float32)
            f.write(f"{utt} ".encode())
            lines.append(f"{utt} {ark}:{f.tell()}\n")
            kaldiio.save_mat(f, v)
    with atomic_write(scp) as f:
        f.write("".join(lines))
    return scp


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", default="test dsp20")
    p.add_argument("--dumpdir", type=Path, default=Path("dump"))
    p.add_argument("--datadir", type=Path, default=Path("data"))
    p.add_argument("--expdir", type=Path, default=Path("exp"))
    a = p.parse_args()
    exp = a.expdir / "logmel_baseline"
    for s in a.sets.split():
        scp = embed_set(a.dumpdir / "fbank" / s, exp / "embed" / s)
        m = evaluate_set(
            str(a.datadir / s / "trials"), str(scp), str(exp / "eval" / s), model_tag="logmel_baseline", set_name=s
        )
        print(
            json.dumps({k: m[k] for k in ("set", "eer", "min_dcf_p0.01", "min_dcf_p0.05", "n_target", "n_nontarget")})
        )


if __name__ == "__main__":
    main()
