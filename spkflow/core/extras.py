"""The command that installs one of spkflow's optional extras (``pyproject.toml``'s
``[project.optional-dependencies]``: export, tensorboard, speechbrain, resemblyzer).

spkflow is installed from a clone (``tools/setup.sh``), not from a package index, so
``pip install 'spkflow[speechbrain]'`` would look for a ``spkflow`` on PyPI that is not this
project.  :func:`install_hint` names the checkout this code runs from when it is one (a
``pyproject.toml`` beside the package), else says to run it in a clone.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """``pip install '/path/to/checkout[extra]'`` (or ``'.[extra]'`` run in a spkflow clone)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file():
        return f"pip install '{root}[{extra}]' (the spkflow checkout; or '.[{extra}]' run in it)"
    return f"pip install '.[{extra}]' in a spkflow clone (spkflow is not on a package index)"
