"""The install hint of a missing optional extra names the checkout, not a package index: a real
process whose ``import speechbrain`` fails (``sys.modules['speechbrain'] = None``, Python's way to
make an import raise ImportError) loading a SpeechBrain folder through the public loader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.paths import ROOT
from spkflow.core.extras import install_hint


def test_a_missing_extra_names_the_checkout_to_install_from(tmp_path: Path) -> None:
    model = tmp_path / "sb"
    model.mkdir()
    (model / "hyperparams.yaml").write_text("embedding_model: null\n")
    (model / "embedding_model.ckpt").write_bytes(b"")
    code = (
        "import sys; sys.modules['speechbrain'] = None\n"
        "from spkflow.embed.speechbrain import SpeechbrainEmbedder\n"
        f"SpeechbrainEmbedder({str(model)!r})\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True
    )
    assert p.returncode != 0 and "needs SpeechBrain" in p.stderr
    # the checkout, never the package index's name (a checkout in a folder called spkflow ends in it too)
    assert f"pip install '{ROOT.resolve()}[speechbrain]'" in p.stderr and "install 'spkflow[" not in p.stderr
    assert (
        install_hint("export")
        == f"pip install '{ROOT.resolve()}[export]' (the spkflow checkout; or '.[export]' run in it)"
    )
