#!/usr/bin/env python3
"""How good a speech detector is, alone: missed and false-alarm speech of stage 2's speech regions
against the reference.  Run from the recipe's folder after stage 2 (`. ./path.sh`):

    python local/speech_errors.py [--sets "sim_so762 sim ami"] [--speech "energy silero"] [--windows w1.5s0.75]

Per set and detector (stage 2's ``dump/<set>.<speech>_<windows>/speech``, already inside the UEM):
missed speech = reference speech (the union of the reference turns, inside the UEM) not in a
detected region, false alarm = detected time outside the reference speech, both in % of the
reference speech and without a collar (pyannote.metrics' ``DetectionErrorRate`` at collar 0 is
their sum), and the detected speech in % of the reference's.  Prints a markdown table; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spkflow.diar.recipe_stages import read_speech_dir
from spkflow.diar.recordings import load_recordings
from spkflow.diar.regions import intersect, total, union


def errors(data: Path, speech_dir: Path) -> dict[str, float]:
    rs = load_recordings(data, need_rttm=True)
    recs, found = read_speech_dir(speech_dir)
    ref_s = hyp_s = miss = fa = 0.0
    for rec in recs:
        scored = rs.scored(rec)
        ref = intersect(union((t.start, t.end) for t in (rs.turns or {}).get(rec, [])), scored)
        hyp = intersect(found.get(rec, []), scored)
        both = total(intersect(ref, hyp))
        ref_s += total(ref)
        hyp_s += total(hyp)
        miss += total(ref) - both
        fa += total(hyp) - both
    return {"miss": 100 * miss / ref_s, "fa": 100 * fa / ref_s, "detected": 100 * hyp_s / ref_s, "ref_s": ref_s}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", default="sim_so762 sim ami")
    p.add_argument("--speech", default="energy silero", help="detectors whose stage-2 regions to score")
    p.add_argument("--windows", default="w1.5s0.75", help="the windows' tag after <speech>_")
    p.add_argument("--dumpdir", default="dump")
    a = p.parse_args()
    print("| set | detector | missed speech (%) | false alarm (%) | detected / reference speech (%) | reference (s) |")
    print("|---|---|---|---|---|---|")
    for s in a.sets.split():
        for d in a.speech.split():
            r = errors(Path("data") / s, Path(a.dumpdir) / f"{s}.{d}_{a.windows}" / "speech")
            print(f"| {s} | {d} | {r['miss']:.2f} | {r['fa']:.2f} | {r['detected']:.1f} | {r['ref_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
