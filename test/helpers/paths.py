"""Where things are: the repository root (this file is ROOT/test/helpers/paths.py), the TEMPLATE
recipe, and the corpora its db.sh names."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "egs" / "TEMPLATE" / "spk1"


def db_var(name: str) -> str:
    """The value of ``name`` after sourcing the TEMPLATE recipe's db.sh."""
    out = subprocess.run(
        ["bash", "-c", f'. "{TEMPLATE}/db.sh"; printf %s "${name}"'], check=True, capture_output=True, text=True
    )
    return out.stdout
