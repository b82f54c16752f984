"""tools/probes.py, the reliability probes kept for the next review round: a smoke run of two fast
probes with a tiny model (a report: exit 0, one line per probe, the counts), one of them the
pipe in an API path, which must stay OK."""

from __future__ import annotations

import subprocess
import sys

from helpers.models import make_spkflow_model_dir
from helpers.paths import ROOT
from helpers.recipes import env


def test_the_probes_run_and_report(tmp_path):
    model = make_spkflow_model_dir(tmp_path / "model")
    p = subprocess.run(
        [sys.executable, ROOT / "tools" / "probes.py", "--model", model, "--only", "pipe-api", "read-rttm-9-fields"],
        capture_output=True, text=True, env=env(), timeout=600, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    status = {ln.split()[1]: ln.split()[0] for ln in lines if ln[:4].strip() in ("OK", "WEAK", "BAD", "SKIP")}
    assert set(status) == {"pipe-api", "read-rttm-9-fields"} and status["pipe-api"] == "OK", p.stdout
    assert lines[-1].startswith("# OK ") and lines[-1].endswith("of 2")
    listed = subprocess.run([sys.executable, ROOT / "tools" / "probes.py", "--list"], capture_output=True, text=True)
    assert len(listed.stdout.splitlines()) >= 30 and "pipe-verify" in listed.stdout
