"""spkflow.core.atomic: all-or-nothing output with the permissions an ordinary open() gives."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from spkflow.core.atomic import atomic_write, write_text_atomic


def test_file_appears_only_after_a_clean_exit(tmp_path: Path) -> None:
    out = tmp_path / "xvector.scp"
    out.write_text("old complete\n")
    with pytest.raises(RuntimeError):
        with atomic_write(out) as f:
            f.write("half")
            raise RuntimeError("crash")
    assert out.read_text() == "old complete\n"
    assert [p.name for p in tmp_path.iterdir()] == ["xvector.scp"]  # no temp file left


def test_mode_follows_umask_like_open(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a", "x\n")
        (tmp_path / "b").write_text("x\n")
    finally:
        os.umask(old)
    mode_a = stat.S_IMODE((tmp_path / "a").stat().st_mode)
    mode_b = stat.S_IMODE((tmp_path / "b").stat().st_mode)
    assert mode_a == mode_b == 0o644
