"""Diarization end to end in one process (``Embedder.diarize``, ``python -m spkflow.bin.diarize``)
and the recipe's steps on files, on conversations simulated here from synthetic voices with a tiny
model that has a scoring (random weights: the tests check the route and the bad input, not the
accuracy; the recipe's figures are in egs/speechocean762/diar1/RESULTS.md)."""

from __future__ import annotations

import json

import pytest

from helpers.diar import make_conversations, write_tone_speech
from spkflow import Embedder
from spkflow.bin import diarize as diarize_cmd
from spkflow.diar.recordings import load_recordings
from spkflow.diar.result import Diarization
from spkflow.diar.rttm import Turn, read_rttm, write_rttm
from spkflow.sim.conversations import load_statistics, save_statistics, simulate_conversation, turn_statistics


@pytest.fixture(scope="module")
def convs(tmp_path_factory):
    return make_conversations(tmp_path_factory.mktemp("convs"))


def test_simulated_conversations_are_deterministic_and_inside(convs, tmp_path):
    rs = load_recordings(convs, need_rttm=True)
    for rec, turns in rs.turns.items():
        assert turns and all(0 <= t.start < t.end <= rs.durations[rec] for t in turns)
    assert [len({t.speaker for t in rs.turns[r]}) for r in rs.recordings] == [2, 3]
    again = make_conversations(tmp_path)
    assert (again / "rttm").read_bytes() == (convs / "rttm").read_bytes()


def test_turn_statistics_round_trip(convs, tmp_path):
    rs = load_recordings(convs, need_rttm=True)
    st = turn_statistics(rs.turns, source="test")
    assert 0 < st.same_speaker < 1 and 0 <= st.overlap < 1
    save_statistics(tmp_path / "s.json", st)
    assert load_statistics(tmp_path / "s.json") == st
    (tmp_path / "bad.json").write_text('{"same_speaker": 0.5}')
    with pytest.raises(Exception, match="bad.json: not a turn-statistics file"):
        load_statistics(tmp_path / "bad.json")


def test_embedder_diarize_oracle_and_energy(model, convs, tmp_path):
    emb = Embedder.from_pretrained(model)
    rs = load_recordings(convs, need_rttm=True)
    path = rs.wav["conv1"]
    speech = [(t.start, t.end) for t in rs.turns["conv1"]]
    turns = emb.diarize(path, speech=speech, max_speakers=4)
    assert isinstance(turns, Diarization) and turns.recording == "conv1"
    assert turns and all(isinstance(t, Turn) and t.recording == "conv1" for t in turns)
    assert 1 <= len(turns.speakers) <= 4 and turns.speakers == sorted(turns.speakers, key=lambda s: int(s[3:]))
    assert turns[0].speaker == "spk1"
    # the result's RTTM, read back by the RTTM reader: the same turns (times on the 10 ms frame)
    out = turns.to_rttm(tmp_path / "conv1.rttm")
    back = read_rttm(out)
    assert [(t.recording, t.speaker) for t in back.turns] == [(t.recording, t.speaker) for t in turns]
    assert [(round(t.start, 2), round(t.end, 2)) for t in back.turns] == [(t.start, t.end) for t in turns]
    assert Diarization.from_rttm(out) == turns
    assert turns.to_annotation().labels() == sorted(turns.speakers)
    # one speaker per instant, inside the speech
    assert all(a.end <= b.start + 1e-9 for a, b in zip(turns, turns[1:], strict=False))
    two = emb.diarize(path, speech=speech, num_speakers=2)
    assert len({t.speaker for t in two}) == 2
    assert emb.diarize(path, speech="energy")


def test_eight_speakers_with_the_count_forced_give_eight(model, tmp_path):
    """A simulated conversation of 8 speakers (3 minutes), the count forced: 8 speakers come back,
    none holding much more of the speech than the most talkative reference speaker."""
    convs = make_conversations(tmp_path, counts=(8,), duration=180.0, num_spk=8)
    rs = load_recordings(convs, need_rttm=True)
    rec = rs.recordings[0]
    ref = rs.turns[rec]
    assert len({t.speaker for t in ref}) == 8
    turns = Embedder.from_pretrained(model).diarize(rs.wav[rec], speech=[(t.start, t.end) for t in ref], num_speakers=8)

    def shares(ts):
        by: dict[str, float] = {}
        for t in ts:
            by[t.speaker] = by.get(t.speaker, 0.0) + t.end - t.start
        return {k: v / sum(by.values()) for k, v in by.items()}

    assert len(shares(turns)) == 8
    assert max(shares(turns).values()) <= 2 * max(shares(ref).values())


def test_bin_diarize_one_rttm_per_file(model, convs, tmp_path):
    rs = load_recordings(convs, need_rttm=True)
    files = [rs.wav[r] for r in rs.recordings]
    rc = diarize_cmd.main(
        ["--model", str(model), "--out", str(tmp_path / "out"), "--speech", str(convs / "rttm"), *files]
    )
    assert rc == 0
    for r in rs.recordings:
        got = read_rttm(tmp_path / "out" / f"{r}.rttm")
        assert got.turns and {t.recording for t in got.turns} == {r}


def test_bin_diarize_bad_input_one_line(model, convs, tmp_path, caplog):
    rs = load_recordings(convs, need_rttm=True)
    other = tmp_path / "other.rttm"
    write_rttm(other, [Turn("nope", 0.0, 1.0, "A")])
    rc = diarize_cmd.main(
        ["--model", str(model), "--out", str(tmp_path / "o"), "--speech", str(other), rs.wav["conv0"]]
    )
    assert rc == 1
    assert f"{other}: no turns of recording 'conv0' (the recording id is the file's stem)" in caplog.text
    rc = diarize_cmd.main(["--model", str(model), "--out", str(tmp_path / "o"), rs.wav["conv0"], rs.wav["conv0"]])
    assert rc == 1 and "same recording id 'conv0'" in caplog.text


def test_short_silent_and_one_speaker_recordings(model, tmp_path):
    emb = Embedder.from_pretrained(model)
    short = write_tone_speech(tmp_path / "short.wav", 1.0)
    turns = emb.diarize(short, speech=[(0.0, 1.0)])
    assert list(turns) == [Turn("short", 0.0, 1.0, "spk1")]  # shorter than a window: one window, one speaker
    tiny = write_tone_speech(tmp_path / "tiny.wav", 0.3)
    assert not emb.diarize(tiny, speech=[(0.0, 0.3)]).turns  # shorter than the shortest window: no turn
    silent = write_tone_speech(tmp_path / "silent.wav", 5.0, silent=True)
    assert not emb.diarize(silent, speech="energy").turns and not emb.diarize(silent, speech="silero").turns
    rc = diarize_cmd.main(["--model", str(model), "--out", str(tmp_path / "o"), str(silent)])
    assert rc == 0 and (tmp_path / "o" / "silent.rttm").read_text() == ""
    one = write_tone_speech(tmp_path / "one.wav", 12.0)
    got = emb.diarize(one, speech=[(0.0, 12.0)], num_speakers=1)
    assert {t.speaker for t in got} == {"spk1"} and got[0].start == 0.0 and got[-1].end == 12.0


def test_simulator_needs_enough_speakers(tmp_path):
    from helpers.diar import STATS

    with pytest.raises(ValueError, match="3 speakers asked, the pool has 2"):
        simulate_conversation("r", {"a": ["x"], "b": ["y"]}, lambda u: None, STATS, num_speakers=3, duration=5, seed=0)
    _ = json  # the statistics files are JSON (load_statistics)


def test_a_domain_to_centre_on(model, convs, tmp_path, caplog):
    """Single-file diarization centres on recordings like the scored ones when given (raw
    embeddings, or a data dir / embedding scp / gallery, as verify's --domain-mean): a path with
    fewer than 10 recordings is refused naming it; an scp of enough is taken, and centring on the
    windows' own embeddings gives what the recipe's ``--centre recording`` gives."""
    import kaldiio
    import numpy as np

    from spkflow.data.audio import read_audio
    from spkflow.diar.pipeline import DiarOptions, diarize_recording
    from spkflow.diar.windows import plan_windows

    emb = Embedder.from_pretrained(model)
    rs = load_recordings(convs, need_rttm=True)
    path = rs.wav["conv1"]
    speech = [(t.start, t.end) for t in rs.turns["conv1"]]
    few = tmp_path / "few.scp"
    rng = np.random.default_rng(0)
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'few.ark'},{few}") as w:
        for i in range(3):
            w(f"u{i}", rng.standard_normal(emb.dim).astype(np.float32))
    with pytest.raises(Exception, match="few.scp: 3 recordings: the domain mean needs at least 10"):
        emb.diarize(path, speech=speech, domain=few)
    wave, rate = read_audio(path, utt="conv1")
    regions = sorted(speech)
    ws = plan_windows("conv1", regions, 1.5, 0.75, 0.5)
    x = emb.embed_batch([wave[round(w.start * rate) : round(w.end * rate)] for w in ws], rate)
    own = emb.diarize(path, speech=regions, method="ahc", domain=x)
    ref = diarize_recording(ws, x, regions, emb.scoring, DiarOptions(method="ahc", centre="recording"))
    ref = Diarization.of("conv1", ref).turns  # on 10 ms frames, as every route returns them
    assert [(t.start, t.end, t.speaker) for t in own] == [(t.start, t.end, t.speaker) for t in ref]
    # and the domain is used: on the training mean (no domain) this recording is diarized otherwise,
    # so an Embedder.diarize that dropped its domain would fail the equality above
    plain = emb.diarize(path, speech=regions, method="ahc")
    assert [(t.start, t.end, t.speaker) for t in plain] != [(t.start, t.end, t.speaker) for t in own]
    scp = tmp_path / "dom.scp"
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'dom.ark'},{scp}") as w:
        for i, v in enumerate(x):
            w(f"w{i:03d}", v)
    out = tmp_path / "out"
    args = ["--model", str(model), "--out", str(out), "--speech", str(convs / "rttm"), "--domain-mean", str(scp)]
    assert diarize_cmd.main([*args, "--method", "ahc", path]) == 0
    assert Diarization.from_rttm(out / "conv1.rttm").turns == ref
