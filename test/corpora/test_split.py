"""One folder of recordings into a training and a test data dir by speaker (python -m
spkflow.bin.make_data_dir --split, spkflow.corpora.split), and trial lists of a sensible size
(spkflow.corpora.trials' cap on target pairs per speaker, the commands' default).  Real audio
files (synthetic voices), real data dirs, the project's own validator."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from helpers.audio import make_speakers
from helpers.recipes import run
from spkflow.corpora.base import CorpusData, Utterance
from spkflow.corpora.split import held_out_count, split_speakers
from spkflow.corpora.trials import make_trials, read_trials
from spkflow.data.datadir import DataDir

PY = sys.executable


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 speakers x 3 recordings, one subfolder per speaker."""
    return make_speakers(tmp_path_factory.mktemp("split"), num_spk=10, num_utt=3, seed=4, max_sec=0.8).parent / "audio"


def make_data_dir(*args: object, check: bool = True):
    return run([PY, "-m", "spkflow.bin.make_data_dir", *args], check=check)


def speakers(d: Path) -> set[str]:
    return set(DataDir(d).utt2spk().values())


def test_split_by_speaker_is_disjoint_complete_sorted_and_the_same_every_time(folder: Path, tmp_path: Path) -> None:
    train, test = tmp_path / "data" / "train", tmp_path / "data" / "test"
    p = make_data_dir("--split", test, "--test-speakers", "0.3", "--split-seed", "7", folder, train)
    assert "no speaker in both" in p.stderr
    for d in (train, test):
        DataDir(d).validate(no_feats=True, no_text=True)  # sorted, prefixed, consistent
    assert len(speakers(test)) == 3 and len(speakers(train)) == 7
    assert not speakers(train) & speakers(test) and len(speakers(train) | speakers(test)) == 10
    assert len(DataDir(train).utt2spk()) == 21 and len(DataDir(test).utt2spk()) == 9
    trials = read_trials(test / "trials", DataDir(test).utt2spk())  # only test utterances
    assert sum(t for *_, t in trials) == 3 * 3 and not (train / "trials").exists()
    # the same command elsewhere: the same bytes; another seed: other test speakers
    again = tmp_path / "again"
    make_data_dir("--split", again / "test", "--test-speakers", "0.3", "--split-seed", "7", folder, again / "train")
    for name in ("wav.scp", "utt2spk", "spk2utt", "trials"):
        assert (again / "test" / name).read_bytes() == (test / name).read_bytes(), name
    other = tmp_path / "other"
    make_data_dir("--split", other / "test", "--test-speakers", "3", "--split-seed", "8", folder, other / "train")
    assert len(speakers(other / "test")) == 3 and speakers(other / "test") != speakers(test)


def test_split_refuses_what_it_cannot_do_before_writing(folder: Path, tmp_path: Path) -> None:
    mine = tmp_path / "data" / "test"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("the user's")
    train = tmp_path / "data" / "train"
    p = make_data_dir("--split", mine, folder, train, check=False)
    assert p.returncode == 1 and "was not written by spkflow" in p.stderr
    assert not train.exists() and (mine / "notes.txt").read_text() == "the user's"
    p = make_data_dir("--split", train / "test", folder, train, check=False)  # one inside the other
    assert p.returncode == 1 and not train.exists()
    p = make_data_dir("--split", tmp_path / "t", "--test-speakers", "9", folder, train, check=False)
    assert p.returncode == 1 and "9 test speakers of 10 leave fewer than 2 to train" in p.stderr


def corpus(counts: dict[str, int]) -> CorpusData:
    utts = [Utterance(f"{s}-{i}", s, f"/a/{s}/{i}.wav") for s, n in counts.items() for i in range(n)]
    return CorpusData("c", utts, durations={u.utt: 1.0 for u in utts})


def test_split_rules() -> None:
    assert held_out_count(10, 0.2) == 2 and held_out_count(10, 0.25) == 3 and held_out_count(10, 0.01) == 2
    assert held_out_count(20, 5) == 5 and held_out_count(4, 0.5) == 2
    for bad, why in ((3, "at least 4"), (10, "fewer than 2 to train")):
        with pytest.raises(ValueError, match=why):
            held_out_count(bad, 9 if bad == 10 else 0.2)
    with pytest.raises(ValueError, match="whole number"):
        held_out_count(10, 2.5)
    # adding recordings of the same speakers moves no speaker; durations follow their utterances
    a_train, a_test = split_speakers(corpus({f"s{i}": 2 for i in range(8)}), 0.25, seed=1)
    b_train, b_test = split_speakers(corpus({f"s{i}": 5 for i in range(8)}), 0.25, seed=1)
    assert {u.spk for u in a_test.utterances} == {u.spk for u in b_test.utterances}
    assert set(b_test.durations) == {u.utt for u in b_test.utterances}


def test_trials_keep_at_most_the_cap_per_speaker_and_all_on_request(tmp_path: Path) -> None:
    """40 recordings of each of 3 speakers have 780 same-speaker pairs each: the commands keep a
    seeded 500 of each (and up to 10 non-target trials per target: all 4,800 that exist here);
    --max-targets-per-spk all keeps all 780; a speaker's sample does not depend on the others."""
    u2s = {f"s{s}-{i:02d}": f"s{s}" for s in range(3) for i in range(40)}
    capped = make_trials(u2s, 10, seed=0, max_targets_per_spk=500)
    targets = [(a, b) for a, b, t in capped if t]
    assert len(targets) == 1500 and len(set(targets)) == 1500 and len(capped) == 1500 + 3 * 40 * 40
    assert all(a.split("-")[0] == b.split("-")[0] and a < b for a, b in targets)
    assert make_trials(u2s, 10, seed=0, max_targets_per_spk=500) == capped  # deterministic
    assert sum(t for *_, t in make_trials(u2s, 10, seed=0)) == 3 * 780  # the library's default: every pair
    two = {u: s for u, s in u2s.items() if s != "s2"}
    mine = {(a, b) for a, b, t in make_trials(two, 0, seed=0, max_targets_per_spk=500) if t}
    assert mine == {(a, b) for a, b in targets if not a.startswith("s2")}
    pattern = [{(a.split("-")[1], b.split("-")[1]) for a, b in targets if a.startswith(f"s{s}-")} for s in range(3)]
    assert pattern[0] != pattern[1] != pattern[2]  # each speaker's own draw, not one pattern for all
    few = make_trials(u2s, 1, seed=0, max_targets_per_spk=100)  # non-targets: ratio x the targets kept
    assert sum(t for *_, t in few) == 300 and len(few) == 600
    # uniform over the speaker's pairs: each utterance is in about 2 * 500 / 40 = 25 of them
    per_utt = [sum(u in (a, b) for a, b in targets) for u in u2s]
    assert 12 <= min(per_utt) and max(per_utt) <= 40

    data = tmp_path / "data"
    data.mkdir()
    (data / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in sorted(u2s.items())))
    by_spk = itertools.groupby(sorted(u2s.items()), key=lambda kv: kv[1])
    (data / "spk2utt").write_text("".join(f"{s} {' '.join(u for u, _ in g)}\n" for s, g in by_spk))
    p = run([PY, "-m", "spkflow.bin.make_trials", data])
    assert "1500 target + 4800 nontarget trials" in p.stderr
    p = run([PY, "-m", "spkflow.bin.make_trials", "--max-targets-per-spk", "all", data, data / "all"])
    assert "2340 target + 4800 nontarget trials" in p.stderr
