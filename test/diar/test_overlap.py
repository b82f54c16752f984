"""Overlapped speech (spkflow.diar.overlap): the regions of an RTTM where two or more speak, and
the second speaker the hypothesis gets there; then the same through the recipe's clustering step
on simulated conversations with overlap, scored by pyannote.metrics."""

from __future__ import annotations

import json
import logging

import pytest

from spkflow.diar.overlap import add_second_speakers, overlap_regions
from spkflow.diar.rttm import Turn, read_rttm, turns_by_recording


def T(s: float, e: float, spk: str) -> Turn:
    return Turn("r", s, e, spk)


def test_overlap_regions_are_where_two_or_more_speak():
    turns = [T(0, 4, "a"), T(3, 6, "b"), T(5, 7, "c"), T(8, 9, "a"), T(9, 10, "b"), T(1, 2, "a")]
    # a's own turns (0-4 and 1-2) never overlap each other; b/c at 5-6; a and b touch at 9: no overlap
    assert overlap_regions(turns) == [(3.0, 4.0), (5.0, 6.0)]
    assert overlap_regions([T(0, 1, "a")]) == [] and overlap_regions([]) == []
    # three at once is one region
    assert overlap_regions([T(0, 3, "a"), T(1, 3, "b"), T(2, 4, "c")]) == [(1.0, 3.0)]


def test_second_speaker_is_the_nearest_other_one_in_time():
    hyp = [T(0, 3, "A"), T(3, 6, "B"), T(6, 10, "A"), T(12, 14, "C")]
    out = add_second_speakers(hyp, [(2.5, 3.5), (9.5, 10.5), (20, 21)])
    added = [t for t in out if t not in hyp]
    assert added == [
        T(2.5, 3.0, "B"),  # under A: B starts right after
        T(3.0, 3.5, "A"),  # under B: A just before (each stretch under one speaker set is its own)
        T(9.5, 10.0, "C"),  # under A: C starts 2.25 s from the middle, B ended 3.75 s before it
    ]  # 10-10.5 and 20-21 have no hypothesis speech: nothing is added there
    assert all(t in out for t in hyp) and out == sorted(out, key=lambda t: (t.start, t.end, t.speaker))
    # one speaker: no one to add
    assert add_second_speakers([T(0, 5, "A")], [(1, 2)]) == [T(0, 5, "A")]
    # no second speaker is ever the one already there
    for t in added:
        assert not any(h.speaker == t.speaker and h.start < t.end and h.end > t.start for h in hyp)


def test_oracle_overlap_in_the_clustering_step_lowers_the_missed_speech(tmp_path):
    """Simulated conversations with overlap, the pipeline on a trained model's window embeddings
    (as the recipe's stages 2-5): with the reference's overlap the fair DER's missed speech drops,
    and every added turn lies inside a reference overlap."""
    from helpers.diar import embed_windows, make_conversations
    from helpers.models import make_scored_model_dir
    from spkflow import Embedder
    from spkflow.diar.pipeline import DiarOptions
    from spkflow.diar.recipe_stages import cluster_set, make_windows, score_set
    from spkflow.diar.recordings import load_recordings
    from spkflow.sim.conversations import Histogram, TurnStatistics

    talky = TurnStatistics(  # most changes of speaker overlap, by 0.5-1.2 s
        same_speaker=0.2,
        overlap=0.7,
        pause_same=Histogram((0.1, 0.4), (1.0,)),
        pause_other=Histogram((0.2, 0.6), (1.0,)),
        overlap_length=Histogram((0.5, 1.2), (1.0,)),
        turn_length=Histogram((1.0, 3.0), (1.0,)),
    )
    recs = make_conversations(tmp_path / "convs", counts=(2, 3, 3), duration=30.0, seed=3, stats=talky)
    rs = load_recordings(recs, need_rttm=True)
    ovl = {r: overlap_regions(t) for r, t in (rs.turns or {}).items()}
    assert sum(e - s for v in ovl.values() for s, e in v) > 1.0, "the simulated conversations have overlap"
    model = make_scored_model_dir(tmp_path / "model", tmp_path / "audio")
    work = tmp_path / "work"
    make_windows(recs, work, speech="oracle")
    embed_windows(model, work / "windows", tmp_path / "xvector.scp")
    scoring = Embedder.from_pretrained(model).scoring
    opts = DiarOptions(method="ahc", centre="set")
    totals = {}
    for name, overlap in (("plain", None), ("overlap", ovl)):
        n = cluster_set(work, tmp_path / "xvector.scp", tmp_path / f"{name}.rttm", scoring, opts, None, overlap)
        totals[name] = score_set(recs, tmp_path / f"{name}.rttm", tmp_path / name)
        if overlap is None:
            assert n["overlap_turns"] == 0
        else:
            assert n["overlap_turns"] > 0
    plain = turns_by_recording(read_rttm(tmp_path / "plain.rttm").turns)
    with_ovl = turns_by_recording(read_rttm(tmp_path / "overlap.rttm").turns)
    for rec, turns in with_ovl.items():
        added = [t for t in turns if t not in plain[rec]]
        assert all(any(s - 1e-6 <= t.start and t.end <= e + 1e-6 for s, e in ovl[rec]) for t in added)
        assert set(plain[rec]) <= set(turns)
    assert totals["overlap"]["miss"] < totals["plain"]["miss"] - 1.0, totals
    # the forgiving condition skips overlap: the added turns change nothing there
    assert totals["overlap"]["der_forgiving"] == pytest.approx(totals["plain"]["der_forgiving"])
    assert json.loads((tmp_path / "overlap" / "scores.json").read_text())["total"]["miss"] == totals["overlap"]["miss"]


def test_diar_cluster_names_a_missing_overlap_rttm(tmp_path, caplog):
    from spkflow.bin import diar_cluster

    missing = tmp_path / "rttm"
    with caplog.at_level(logging.ERROR):
        rc = diar_cluster.main(
            ["--work-dir", str(tmp_path), "--overlap-rttm", str(missing), "--out", str(tmp_path / "x")]
        )
    assert rc == 1 and f"{missing}: no such file: oracle overlap needs the reference turns" in caplog.text
    assert not (tmp_path / "x").exists()
