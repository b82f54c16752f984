"""Kaldi data dirs written and read back by the tests of spkflow.data and utils/*.sh: the files
of a dir from keyword arguments, its contents for comparison, and bash run as the scripts are."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spkflow.core.errors import InputError


def write_dir(d: Path, **files: str) -> Path:
    """``d`` with one file per keyword (``wav_scp`` is wav.scp); returns ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("_scp", ".scp")).write_text(text)
    return d


def snapshot(d: Path) -> dict[str, bytes]:
    """Every file below ``d`` (relative path -> bytes): what a failed run must leave unchanged."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def read_all(d: Path) -> dict[str, str]:
    """The files directly in ``d`` (name -> text)."""
    return {p.name: p.read_text() for p in sorted(d.iterdir()) if p.is_file()}


def sh(
    cmd: str, cwd: Path | None = None, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``bash -c cmd`` with LC_ALL=C (the scripts' sort order) and ``env`` added; ``check``: a
    failure raises with the command's output."""
    p = subprocess.run(
        ["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C", **(env or {}))
    )
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def input_error(path: Path, text: str, read) -> InputError:
    """The :class:`InputError` that ``read(path)`` raises once ``path`` holds ``text``."""
    path.write_text(text)
    with pytest.raises(InputError) as e:
        read(path)
    return e.value
