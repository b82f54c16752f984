"""The diar1 recipe's local/name_speakers.py --rescore (the figures of its RESULTS.md section
"Naming the speakers"), on hand-made meetings whose figures are worked out here: how much of the
enrolled speakers' speech carries their name, overall and of what their own cluster holds, and
how much of a stranger's speech is called unknown.  Nothing is embedded: --rescore reads the
RTTMs and the gallery an earlier run left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from helpers.paths import ROOT
from spkflow.deploy.gallery import Gallery
from spkflow.diar.rttm import Turn, write_rttm

SCRIPT = ROOT / "egs/speechocean762/diar1/local/name_speakers.py"


MEETINGS = {  # the reference turns are A 0-10 s, C 10-20 s, B 20-30 s in both
    # A's cluster 0-9 s and 10-14 s (4 s of C merged into it), B's 9-10 s (1 s of A) and 20-30 s,
    # the rest of C unknown
    "p_m00": [(0, 9, "A"), (9, 10, "B"), (10, 14, "A"), (14, 20, "unknown_1"), (20, 30, "B")],
    # most of C (6 s) in A's cluster, C's own cluster is then A's; B's cluster left unnamed
    "p_m01": [(0, 9, "A"), (9, 10, "B"), (10, 16, "A"), (16, 20, "unknown_1"), (20, 30, "unknown_2")],
}


def _work(tmp_path: Path) -> Path:
    """Pool ``p`` of speakers A, B (enrolled) and C (a stranger), and :data:`MEETINGS`."""
    pool = tmp_path / "data" / "p"
    pool.mkdir(parents=True)
    (pool / "utt2spk").write_text("".join(f"{s}-{i} {s}\n" for s in "ABC" for i in range(3)))
    work = tmp_path / "exp" / "naming" / "p.oracle"
    (work / "rttm.domain").mkdir(parents=True)
    emb = np.eye(4, dtype=np.float32)
    Gallery("stamp", ["A-0", "A-1", "B-0", "B-1"], ["A", "A", "B", "B"], emb, np.full(4, 5.0)).save(
        work / "gallery.npz"
    )
    for rec, hyp in MEETINGS.items():
        write_rttm(work / f"{rec}.rttm", [Turn(rec, 0, 10, "A"), Turn(rec, 10, 20, "C"), Turn(rec, 20, 30, "B")])
        write_rttm(work / "rttm.domain" / f"{rec}.rttm", [Turn(rec, a, b, s) for a, b, s in hyp])
    return work


def _rescore(tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--model", "none", "--rescore", "--pools", "p", "--clusters", "domain"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_rescore_separates_the_naming_from_the_clustering(tmp_path):
    _work(tmp_path)
    p = _rescore(tmp_path)
    assert p.returncode == 0, p.stderr
    # enrolled speech named right: 19 + 9 of 40 s (A's 1 s in B's cluster twice, B unnamed in m01); of what
    # their own clusters hold: 19 + 9 of 38 s.  The stranger's unknown: 6 + 4 of 20 s; of what its own
    # cluster holds: 6 of 6 s (unknown_1 in m00) + 0 of 6 s (A's cluster in m01).  Speakers: A twice and
    # B once named right; the stranger named once (6 of its 10 s in A's cluster)
    assert p.stdout.splitlines()[-1] == "| p | oracle | domain | 70.0 | 73.7 | 50.0 | 50.0 | 3 of 4 | 1 of 2 |"


def test_rescore_names_a_meeting_without_a_hypothesis(tmp_path):
    work = _work(tmp_path)
    (work / "rttm.domain" / "p_m01.rttm").unlink()
    p = _rescore(tmp_path)
    assert p.returncode != 0 and "not every meeting has a hypothesis in rttm.domain" in p.stderr
