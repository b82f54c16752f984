"""Fixtures shared by the diarization tests."""

from __future__ import annotations

import pytest

from helpers.models import make_scored_model_dir


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small spkflow model dir with its scoring (backend, calibration), made once per module."""
    tmp = tmp_path_factory.mktemp("model")
    return make_scored_model_dir(tmp / "model", tmp / "audio")
