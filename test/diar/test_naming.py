"""Speakers named by a saved enrolment (``diarize --gallery``, :mod:`spkflow.diar.naming`), on
meetings laid out by the conversation simulator (spkflow.sim, AMI-like turn-taking) of enrolled
speakers and strangers.  The embeddings are made here, at the embedding level: each window is its
speaker's point plus noise (test/helpers/vectors.py's model of an embedder), because no embedder
that separates speakers can be trained inside a unit test; the scoring is a real one, its
calibration fitted on trials of other speakers (spkflow.score.model_scoring.fit_scoring).  The
clustering is the pipeline's (diarize_recording), the naming the command's.  The figures with a
trained model on held-out speakers: egs/speechocean762/diar1/RESULTS.md."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.diar import STATS
from helpers.vectors import all_trials, speaker_set, write_vectors
from spkflow.deploy.gallery import Gallery
from spkflow.diar.naming import NAME_THRESHOLD, name_clusters, window_speakers
from spkflow.diar.pipeline import DiarOptions, diarize_recording
from spkflow.diar.regions import union
from spkflow.diar.result import Diarization
from spkflow.diar.rttm import Turn
from spkflow.diar.windows import plan_windows
from spkflow.score.model_scoring import Scoring, fit_scoring
from spkflow.sim.conversations import simulate_conversation

DIM = 24
WINDOW_NOISE = 0.6  # a 1.5 s window is a noisier view of its speaker than an enrolment utterance
RATE = 8000  # the simulator lays out noise bursts here: only its turns are used


@pytest.fixture(scope="module")
def scoring(tmp_path_factory) -> Scoring:
    """A cosine scoring calibrated on every pair of 20 other speakers' utterances."""
    tmp = tmp_path_factory.mktemp("cal")
    dev = speaker_set(seed=1, num_spk=20, num_utt=6, dim=DIM, noise=WINDOW_NOISE, prefix="dev")
    scp = write_vectors(tmp / "dev", dev)
    all_trials(sorted(dev), tmp / "trials")
    s = fit_scoring(str(tmp / "trials"), str(scp))
    assert s.calibration is not None
    return s


@pytest.fixture(scope="module")
def world():
    """Six speakers' points; the first four enrolled (3 utterances each), two strangers."""
    rng = np.random.default_rng(7)
    centres = {f"person{i}": rng.normal(size=DIM) / np.sqrt(DIM) for i in range(6)}
    enrolled = ["person0", "person1", "person2", "person3"]
    utts, spks, emb = [], [], []
    for s in enrolled:
        for u in range(3):
            utts.append(f"{s}-e{u}")
            spks.append(s)
            emb.append(centres[s] + 0.25 * rng.normal(size=DIM) / np.sqrt(DIM))
    gallery = Gallery("stamp", utts, spks, np.array(emb, dtype=np.float32), np.full(len(utts), 10.0))
    return centres, gallery


def meeting(rec: str, speakers: list[str], centres, seed: int, duration: float = 90.0):
    """A simulated meeting of ``speakers``: its reference turns, windows and window embeddings."""
    pool = {s: [f"{s}-{i}" for i in range(6)] for s in speakers}
    lengths = np.random.default_rng(seed).uniform(2.0, 6.0, size=6)
    noise = np.random.default_rng(seed).normal(scale=0.1, size=int(6.0 * RATE)).astype(np.float32)
    c = simulate_conversation(
        rec,
        pool,
        lambda u: noise[: int(lengths[int(u.split("-")[1])] * RATE)],
        STATS,
        num_speakers=len(speakers),
        duration=duration,
        seed=seed,
        sample_rate=RATE,
    )
    regions = union((t.start, t.end) for t in c.turns)
    ws = plan_windows(rec, regions, 1.5, 0.75, 0.5)
    rng = np.random.default_rng(seed + 100)
    owner = window_speakers(ws, c.turns)  # the reference speaker at each window's centre
    x = np.stack([centres[o] + WINDOW_NOISE * rng.normal(size=DIM) / np.sqrt(DIM) for o in owner])
    return c.turns, regions, ws, x


def overlap_seconds(a: list[Turn], b: list[Turn]) -> float:
    return sum(max(0.0, min(s.end, t.end) - max(s.start, t.start)) for s in a for t in b)


@pytest.mark.parametrize(
    "speakers,seed",
    [
        (["person0", "person1", "person4"], 0),  # two enrolled, one stranger
        (["person2", "person3", "person5", "person4"], 1),  # two enrolled, two strangers
        (["person0", "person1", "person2", "person3"], 2),  # all enrolled
        (["person4", "person5"], 3),  # strangers only
    ],
)
def test_enrolled_speakers_named_strangers_unknown(scoring, world, speakers, seed):
    centres, gallery = world
    ref, regions, ws, x = meeting(f"m{seed}", speakers, centres, seed)
    hyp = Diarization.of(f"m{seed}", diarize_recording(ws, x, regions, scoring, DiarOptions(method="ahc")))
    named, how = name_clusters(hyp, ws, x, scoring, gallery)
    assert [n.cluster for n in how] == hyp.speakers and len(set(named.speakers)) == len(named.speakers)
    assert len(named.speakers) == len(hyp.speakers)  # renamed, not merged
    for s in speakers:
        mine = [t for t in ref if t.speaker == s]
        total = sum(t.duration for t in mine)
        if s in gallery.speakers:  # at least 90 % of an enrolled speaker's speech carries its name
            right = overlap_seconds(mine, [t for t in named.turns if t.speaker == s])
        else:  # and at least 90 % of a stranger's speech is called unknown
            right = overlap_seconds(mine, [t for t in named.turns if t.speaker.startswith("unknown_")])
        assert right >= 0.9 * total, (s, right, total, how)


def test_two_clusters_never_take_one_name(scoring, world):
    """One enrolled speaker alone, split into two clusters (the count forced): both clusters score
    above the threshold against that speaker, and the assignment gives the name to one only."""
    centres, gallery = world
    ref, regions, ws, x = meeting("split", ["person0"], centres, 5, duration=40)
    opts = DiarOptions(method="ahc", num_speakers=2, resegment=False)  # two clusters kept
    forced = diarize_recording(ws, x, regions, scoring, opts)
    hyp = Diarization.of("split", forced)
    named, how = name_clusters(hyp, ws, x, scoring, gallery)
    assert (
        all(n.candidate == "person0" and n.llr is not None and n.llr > NAME_THRESHOLD for n in how) and len(how) == 2
    ), how
    assert sorted(named.speakers) == ["person0", "unknown_1"]


def test_names_are_rttm_fields_and_unknowns_never_repeat_an_enrolled_name(scoring, world):
    centres, gallery = world
    ref, regions, ws, x = meeting("odd", ["person0", "person4", "person5"], centres, 6)
    hyp = Diarization.of("odd", diarize_recording(ws, x, regions, scoring, DiarOptions(method="ahc")))
    odd = Gallery(
        "stamp",
        gallery.utts,
        ["Ann Lee" if s == "person0" else ("unknown_1" if s == "person1" else s) for s in gallery.speakers],
        gallery.emb,
        gallery.speech,
    )
    named, _ = name_clusters(hyp, ws, x, scoring, odd)
    assert "Ann_Lee" in named.speakers and "unknown_1" not in named.speakers  # person1 is not in this meeting
    assert {s for s in named.speakers if s.startswith("unknown_")} == {"unknown_2", "unknown_3"}
    clash = Gallery("stamp", gallery.utts, ["a b" if s == "person0" else "a_b" for s in gallery.speakers],
                    gallery.emb, gallery.speech)  # fmt: skip
    with pytest.raises(ValueError, match="enrolled speakers 'a b' and 'a_b' are one RTTM field"):
        name_clusters(hyp, ws, x, scoring, clash)


def test_a_model_without_calibration_names_nobody(world):
    centres, gallery = world
    ref, regions, ws, x = meeting("plain", ["person0", "person1"], centres, 8, duration=30)
    hyp = Diarization.of("plain", diarize_recording(ws, x, regions, Scoring(), DiarOptions(num_speakers=2)))
    with pytest.raises(ValueError, match="needs the model's calibration"):
        name_clusters(hyp, ws, x, Scoring(), gallery)


def test_window_speakers_follow_the_midpoint_rule():
    """Every window's centre lies in a turn of its own cluster (windows_to_turns' midpoint rule)."""
    from spkflow.diar.windows import windows_to_turns

    ws = plan_windows("r", [(0.0, 10.0), (12.0, 14.1)], 1.5, 0.75, 0.5)
    labels = [(i // 3) % 2 for i in range(len(ws))]
    turns = windows_to_turns(ws, labels, [(0.0, 10.0), (12.0, 14.1)])
    got = window_speakers(ws, turns)
    assert got == [f"spk{k + 1}" for k in labels]  # label 0 first: spk1
