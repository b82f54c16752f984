#!/usr/bin/env python3
"""silero-vad's rules (onset / offset, minimum speech and silence, padding) chosen by
leave-one-corpus-out on the detection error.  Run from the recipe's folder after stage 1
(`. ./path.sh`):

    python local/tune_speech.py [--sets "sim_so762 sim ami"] [--cache exp/speech_tuning]

silero's frame probabilities of every recording of each set are computed once
(``spkflow.diar.speech.silero_probabilities``, cached under ``--cache``); each setting of the grid
turns them into regions by silero's own rules (``silero_regions``) inside each recording's UEM,
scored against the union of the reference turns with pyannote.metrics'
``DetectionErrorRate(collar=0.5)`` (0.25 s each side of every reference boundary, as DER fair):
missed + false-alarm speech in % of the scored reference speech.  For each set left out, the
setting with the lowest mean error over the *other* sets is chosen and its error on the left-out
set reported, beside silero's defaults.  Prints markdown tables; writes only the cache.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

from spkflow.data.audio import load_audio
from spkflow.diar.recordings import load_recordings
from spkflow.diar.regions import intersect, union
from spkflow.diar.speech import SileroOptions, silero_probabilities, silero_regions

#: silero-vad's own defaults (get_speech_timestamps)
SILERO_OWN = SileroOptions(onset=0.5, min_speech=0.25, min_silence=0.1, pad=0.03)
GRID = {
    "onset": (0.2, 0.3, 0.4, 0.5, 0.6),
    "min_silence": (0.1, 0.25, 0.5, 0.75),
    "min_speech": (0.1, 0.25, 0.5),
    "pad": (0.03, 0.1, 0.2),
}


def annotation(regions, uri):
    from pyannote.core import Annotation, Segment

    ann = Annotation(uri=uri)
    for i, (s, e) in enumerate(regions):
        ann[Segment(s, e), i] = "speech"
    return ann


def load_set(data: Path, cache: Path):
    """Per recording: (frame probabilities, samples, reference speech, scored regions)."""
    rs = load_recordings(data, need_rttm=True)
    out = {}
    for rec in rs.recordings:
        f = cache / data.name / f"{rec}.npz"
        if f.is_file():
            z = np.load(f)
            probs, n = z["probs"], int(z["samples"])
        else:
            x = load_audio(rs.wav[rec], 16000, utt=rec, table=True)
            probs, n = silero_probabilities(x), len(x)
            f.parent.mkdir(parents=True, exist_ok=True)
            np.savez(f, probs=probs, samples=n)
        ref = union((t.start, t.end) for t in (rs.turns or {}).get(rec, []))
        out[rec] = (probs, n, ref, rs.scored(rec))
    return out


def error(recs, opts: SileroOptions) -> float:
    from pyannote.core import Segment, Timeline
    from pyannote.metrics.detection import DetectionErrorRate

    metric = DetectionErrorRate(collar=0.5)
    for rec, (probs, n, ref, scored) in recs.items():
        hyp = intersect(silero_regions(probs, n, opts), scored)
        uem = Timeline([Segment(s, e) for s, e in scored])
        metric(annotation(intersect(ref, scored), rec), annotation(hyp, rec), uem=uem)
    return 100 * abs(metric)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", default="sim_so762 sim ami")
    p.add_argument("--cache", default="exp/speech_tuning")
    a = p.parse_args()
    sets = a.sets.split()
    data = {s: load_set(Path("data") / s, Path(a.cache)) for s in sets}
    keys = list(GRID)
    grid = [SileroOptions(**dict(zip(keys, v, strict=True))) for v in itertools.product(*GRID.values())]
    err = np.array([[error(data[s], o) for s in sets] for o in grid])  # [settings, sets]
    default = error_row = [error(data[s], SILERO_OWN) for s in sets]
    head = (
        "| left out | setting chosen on the others (onset, min silence, min speech, pad) | its error on the others (%) "
    )
    print(head + "| error on the left-out set (%) | silero's defaults there (%) | best setting there (%) |")
    print("|---|---|---|---|---|---|")
    for j, s in enumerate(sets):
        others = [k for k in range(len(sets)) if k != j]
        i = int(np.argmin(err[:, others].mean(axis=1)))
        o = grid[i]
        what = f"{o.onset}, {o.min_silence} s, {o.min_speech} s, {o.pad} s"
        print(f"| {s} | {what} | {err[i, others].mean():.2f} | **{err[i, j]:.2f}** | {default[j]:.2f} | "
              f"{err[:, j].min():.2f} |")  # fmt: skip
    i = int(np.argmin(err.mean(axis=1)))
    o = grid[i]
    print(f"\nOn all sets: {o} (mean error {err[i].mean():.2f} %; silero's defaults {np.mean(error_row):.2f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
