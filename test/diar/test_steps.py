"""The recipe's steps on files (windows, clustering from an embedding scp, scoring) with the bad
recordings of a real set: a silent one, one shorter than a window, one with a single speaker;
each gives a correct result and a line in the log, nothing lost."""

from __future__ import annotations

import json
import logging

import pytest

from helpers.diar import embed_windows, make_conversations, write_tone_speech
from spkflow import Embedder
from spkflow.data.tables import read_kv
from spkflow.diar.pipeline import CENTRE_FROM, DiarOptions
from spkflow.diar.recipe_stages import cluster_set, make_windows, score_set
from spkflow.diar.recordings import load_recordings, write_recordings
from spkflow.diar.rttm import Turn, read_rttm, write_rttm


def _set_with_odd_recordings(tmp_path):
    """Two simulated conversations plus a silent, a short and a one-speaker recording."""
    convs = make_conversations(tmp_path / "convs")
    rs = load_recordings(convs, need_rttm=True)
    wav, durs = dict(rs.wav), dict(rs.durations)
    turns = [t for v in rs.turns.values() for t in v]
    for name, sec, silent in (("silent", 4.0, True), ("short", 1.0, False), ("solo", 8.0, False)):
        wav[name] = str(write_tone_speech(tmp_path / f"{name}.wav", sec, silent=silent))
        durs[name] = sec
        if not silent:
            turns.append(Turn(name, 0.0, sec, "X"))
    return write_recordings(tmp_path / "recs", wav, durs, turns)


def test_set_with_silent_short_and_one_speaker_recordings(model, tmp_path, caplog):
    recs = _set_with_odd_recordings(tmp_path)
    work = tmp_path / "work"
    with caplog.at_level(logging.WARNING):
        n = make_windows(recs, work, speech="energy")
    assert (
        n["silent"] == 1 and "no speech (or none as long as 0.50 s) in 1 recording(s): silent: no turns" in caplog.text
    )
    # every recording is in speech/ (the silent one without regions), the windows dir only those with windows
    assert list(read_kv(work / "speech" / "wav.scp")) == list(read_kv(recs / "wav.scp"))
    assert "silent" not in read_kv(work / "windows" / "wav.scp")
    embed_windows(model, work / "windows", tmp_path / "xvector.scp")
    scoring = Embedder.from_pretrained(model).scoring
    cluster_set(work, tmp_path / "xvector.scp", tmp_path / "hyp.rttm", scoring, DiarOptions(), {"solo": 1})
    hyp = read_rttm(tmp_path / "hyp.rttm").turns
    assert not [t for t in hyp if t.recording == "silent"]
    short = [t for t in hyp if t.recording == "short"]  # shorter than a window: one window, one speaker
    assert short and {t.speaker for t in short} == {"spk1"}
    assert {t.speaker for t in hyp if t.recording == "solo"} == {"spk1"}
    total = score_set(recs, tmp_path / "hyp.rttm", tmp_path / "scores", title="odd", plot="solo")
    doc = json.loads((tmp_path / "scores" / "scores.json").read_text())
    rows = {r["recording"]: r for r in doc["recordings"]}
    assert set(rows) == {"conv0", "conv1", "silent", "short", "solo"} and total["recordings"] == 5
    assert rows["silent"]["der_full"] == 0.0 and rows["silent"]["jer"] is None  # nothing to find, nothing found
    assert rows["solo"]["ref_spk"] == rows["solo"]["hyp_spk"] == 1 and rows["solo"]["spk_err"] == 0.0
    assert (tmp_path / "scores" / "plot_solo.png").stat().st_size > 1000
    assert "| silent |" in (tmp_path / "scores" / "scores.md").read_text()
    # centred "on the set" by the command's rule: a set of fewer than CENTRE_FROM windows, the training mean
    caplog.clear()
    with caplog.at_level(logging.INFO):
        cluster_set(
            work, tmp_path / "xvector.scp", tmp_path / "set.rttm", scoring, DiarOptions(centre="set"), {"solo": 1}
        )
    assert f"fewer than {CENTRE_FROM} to centre on" in caplog.text
    assert read_rttm(tmp_path / "set.rttm").turns == hyp


def test_score_set_names_a_hypothesis_recording_not_in_the_set(tmp_path):
    recs = write_recordings(
        tmp_path / "recs", {"a": str(write_tone_speech(tmp_path / "a.wav", 3.0))}, {"a": 3.0}, [Turn("a", 0, 3, "X")]
    )
    write_rttm(tmp_path / "hyp.rttm", [Turn("a", 0, 3, "spk1"), Turn("b", 0, 1, "spk1")])
    with pytest.raises(Exception) as e:
        score_set(recs, tmp_path / "hyp.rttm", tmp_path / "s")
    assert str(e.value) == f"{tmp_path / 'hyp.rttm'}:2: recording 'b' is not in {recs / 'wav.scp'}"


def test_energy_speech_of_a_long_recording_in_blocks_equals_the_whole():
    """The energy detector computes a long recording's fbank a block at a time (an hour's frame
    matrix and spectra took 3-4 GB): the same frames to float32 rounding (the FFT of a block of
    another size rounds its last bit otherwise: measured 1.9e-6 of log-mel values of 15-26, one
    ulp), whatever the block."""
    import numpy as np

    from spkflow.diar.speech import energy_speech, fbank_in_blocks
    from spkflow.features.fbank import FbankOptions, compute_fbank

    rng = np.random.default_rng(0)
    opts = FbankOptions(sample_frequency=16000.0, num_mel_bins=40)
    for n in (400, 401, 16000 * 3, 16000 * 7 + 123):
        x = (0.1 * rng.standard_normal(n)).astype(np.float32)
        whole = compute_fbank(x, 16000, opts)
        for seconds in (0.01, 1.0, 2.5, 60.0):
            blocks = fbank_in_blocks(x, 16000, opts, seconds=seconds)
            assert blocks.shape == whole.shape and float(np.abs(blocks - whole).max()) <= 1e-5, (n, seconds)
    # speech between silences: found where it is
    t = np.arange(16000 * 6) / 16000
    x = np.where((t > 1.0) & (t < 4.0), 0.3 * np.sin(2 * np.pi * 220 * t), 1e-4 * rng.standard_normal(len(t)))
    ((start, end),) = energy_speech(x.astype(np.float32), 16000)
    assert abs(start - 1.0) < 0.1 and abs(end - 4.0) < 0.1
