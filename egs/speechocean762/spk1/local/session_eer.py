#!/usr/bin/env python3
"""EER of a trial list split by recording session, from stage 6's scores files.

    python local/session_eer.py --session '^([^-]+-[^-]+)-' exp/spk_train/eval/libri/scores [more scores ...]

The session of an utterance is the first group of ``--session`` matched against its id
(LibriSpeech: speaker-chapter; VoxCeleb: speaker/video).  For each scores file (``enroll test
score target|nontarget``, the format stage 6 writes) it prints the EER over all trials, the EER
when the target trials are only those across sessions (all non-target trials kept), how many
target trials each kind has, and which session pairs of one speaker are missed at the all-trials
EER threshold: on a set with few speakers, whether a figure comes from one speaker's two
recordings or from everywhere.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

import numpy as np

from spkflow.core.errors import InputError
from spkflow.score.metrics import compute_eer
from spkflow.score.trial_scoring import read_scores


def session_of(pattern: re.Pattern[str], utt: str, path: str) -> str:
    m = pattern.match(utt)
    if m is None:
        sys.exit(f"session_eer.py: {path}: utterance {utt!r} does not match --session {pattern.pattern!r}")
    return m.group(1) if m.groups() else m.group(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--session", required=True, help="regex; its first group (or the match) is the session")
    p.add_argument("scores", nargs="+", help="stage 6 scores files")
    a = p.parse_args(argv)
    pattern = re.compile(a.session)
    for path in a.scores:
        try:
            trials, s = read_scores(path)
        except InputError as err:
            sys.exit(f"session_eer.py: {err}")
        tgt = trials.target
        ses_e = [session_of(pattern, u, path) for u in trials.enroll]
        ses_t = [session_of(pattern, u, path) for u in trials.test]
        cross = np.array([x != y for x, y in zip(ses_e, ses_t, strict=True)])
        eer = compute_eer(s, tgt)[0]
        keep = cross | ~tgt
        eer_cross = compute_eer(s[keep], tgt[keep])[0] if (tgt & cross).any() else float("nan")
        threshold = np.sort(s[tgt])[min(int(round(tgt.sum() * eer / 100.0)), int(tgt.sum()) - 1)]
        missed = Counter(
            " ~ ".join(sorted((x, y))) for x, y, sc, t in zip(ses_e, ses_t, s, tgt, strict=True) if t and sc < threshold
        )
        print(
            f"{path}: EER {eer:.2f}% ({int(tgt.sum())} target trials), across sessions {eer_cross:.2f}% "
            f"({int((tgt & cross).sum())} target trials); missed at the EER threshold: "
            + (", ".join(f"{k} {v}" for k, v in missed.most_common()) or "none")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
