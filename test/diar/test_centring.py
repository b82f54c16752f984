"""Which windows a call of diarization is centred on (:func:`spkflow.diar.pipeline.call_domain`,
the one rule of the command, the API and the recipe): the windows of all the files of the call
when there are at least ``CENTRE_FROM``, else the training mean, a domain given always winning,
said in one log line.  Real runs of ``python -m spkflow.bin.diarize`` and ``Embedder.diarize`` on
conversations simulated here (spkflow.sim) with a tiny model that has a scoring; the window
embeddings and the centring each recording is clustered on are read by wrapping the pipeline's
own functions (they still run)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from helpers.diar import make_conversations
from helpers.models import make_scored_model_dir
from spkflow import Embedder
from spkflow.bin import diarize as diarize_cmd
from spkflow.diar import file_list
from spkflow.diar.pipeline import CENTRE_FROM, DiarOptions, embedding_space
from spkflow.diar.recordings import load_recordings
from spkflow.score.backend import l2_rows
from spkflow.score.model_scoring import Scoring

#: dense windows, so that each 20 s conversation has fewer than CENTRE_FROM and the two together more
DENSE = {"window": 0.5, "shift": 0.03}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("model")
    return make_scored_model_dir(tmp / "model", tmp / "audio")


@pytest.fixture(scope="module")
def convs(tmp_path_factory):
    return make_conversations(tmp_path_factory.mktemp("convs"), counts=(2, 3), duration=20.0)


@pytest.fixture
def seen(monkeypatch):
    """The raw window embeddings of each recording, and the centring each was clustered on."""
    got: dict = {"x": {}, "domain": {}, "centre": {}}
    embed, cluster = file_list.embed_windows, file_list.diarize_recording

    def embed_spy(*a, **k):
        w = embed(*a, **k)
        got["x"][w.recording] = w.x
        return w

    def cluster_spy(windows, x, regions, scoring, opts, domain=None):
        got["domain"][windows[0].recording] = domain
        got["centre"][windows[0].recording] = opts.centre
        return cluster(windows, x, regions, scoring, opts, domain)

    monkeypatch.setattr(file_list, "embed_windows", embed_spy)
    monkeypatch.setattr(file_list, "diarize_recording", cluster_spy)
    return got


def run(model, convs, out, *args) -> int:
    rs = load_recordings(convs, need_rttm=True)
    dense = ["--window", str(DENSE["window"]), "--shift", str(DENSE["shift"])]
    files = [rs.wav[r] for r in rs.recordings]
    return diarize_cmd.main(
        ["--model", str(model), "--out", str(out), "--speech", str(convs / "rttm"), *dense, *map(str, args), *files]
    )


def test_a_call_of_two_files_is_centred_on_the_windows_of_both(model, convs, seen, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        assert run(model, convs, tmp_path / "out") == 0
    sizes = {r: len(x) for r, x in seen["x"].items()}
    assert len(sizes) == 2 and all(n < CENTRE_FROM for n in sizes.values()), sizes  # alone: not enough
    assert sum(sizes.values()) >= CENTRE_FROM, sizes  # together: enough
    both = np.concatenate(list(seen["x"].values()))
    for rec in sizes:
        assert seen["centre"][rec] == "set"
        assert seen["domain"][rec].shape == both.shape
        np.testing.assert_allclose(seen["domain"][rec].mean(axis=0), both.mean(axis=0), rtol=1e-10, atol=1e-12)
    assert f"centring: on the {len(both)} windows of the 2 recordings of this call" in caplog.text
    assert all((tmp_path / "out" / f"{r}.rttm").is_file() for r in sizes)


def test_one_short_file_falls_back_to_the_training_mean_and_says_so(model, convs, seen, caplog):
    rs = load_recordings(convs, need_rttm=True)
    speech = [(t.start, t.end) for t in rs.turns["conv0"]]
    with caplog.at_level(logging.INFO):
        d = Embedder.from_pretrained(model).diarize(rs.wav["conv0"], speech=speech, **DENSE)
    n = len(seen["x"]["conv0"])
    assert 0 < n < CENTRE_FROM and d.speakers
    assert seen["domain"]["conv0"] is None and seen["centre"]["conv0"] == "none"
    assert f"centring: on the training mean ({n} windows in 1 recordings, fewer than {CENTRE_FROM}" in caplog.text


def test_a_domain_given_wins_over_the_calls_windows(model, convs, seen, tmp_path, caplog):
    pool = convs.parent / "pool" / "data"  # the synthetic speakers: 24 recordings like these
    with caplog.at_level(logging.INFO):
        assert run(model, convs, tmp_path / "out", "--domain-mean", pool) == 0
    assert sum(len(x) for x in seen["x"].values()) >= CENTRE_FROM  # the call alone would be enough
    for rec in seen["x"]:
        assert seen["centre"][rec] == "set" and seen["domain"][rec].shape[0] == 24
    assert "centring: on the 24 embeddings of the domain given" in caplog.text
    assert "of this call" not in caplog.text


def test_the_set_without_a_model_backend_is_the_sets_mean():
    """``centre="set"`` with ``backend`` off subtracts the set's mean, not the recording's own."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 8)) + 3.0
    domain = rng.standard_normal((50, 8)) - 2.0
    plain = DiarOptions(method="gmm", backend=False, centre="set")
    y = embedding_space(x, Scoring(), plain, domain)
    np.testing.assert_allclose(y, l2_rows(x - domain.mean(axis=0)))
    own = embedding_space(x, Scoring(), DiarOptions(method="gmm", backend=False, centre="recording"))
    assert not np.allclose(y, own)
