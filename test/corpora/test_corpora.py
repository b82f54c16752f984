"""Corpus data prep and trial lists.

Mini corpora made here mimic each release's layout and quirks (speechocean762's unsorted,
tab-separated, relative-path lists with non-prefixed ids; DSPSpeech-20's duplicated speaker;
FSDD's 8 kHz; LibriSpeech's subsets, transcripts and SPEAKERS.TXT) with real audio files.
The real corpora (``corpus`` fixture, db.sh) are checked for the counts the recipe relies on.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.corpora import (
    assert_valid,
    make_dsp20_mini,
    make_fsdd_mini,
    make_librispeech_mini,
    make_speechocean_mini,
    tone,
)
from helpers.paths import ROOT
from spkflow.core.errors import InputError
from spkflow.corpora import collect
from spkflow.corpora.base import write_data_dir
from spkflow.corpora.fetch import CorpusNotFound, ensure_corpus
from spkflow.corpora.trials import make_trials, read_trials, write_trials
from spkflow.data.datadir import DataDir
from spkflow.data.tables import c_sorted, read_kv

# --------------------------------------------------------------------------- mini corpora


# --------------------------------------------------------------------------- speechocean762


def test_speechocean762_split_becomes_valid_prefixed_sorted_dir(tmp_path: Path) -> None:
    corpus = make_speechocean_mini(tmp_path / "so762")
    d = write_data_dir(collect("speechocean762", str(corpus), split="train"), tmp_path / "data" / "train")
    assert_valid(d.path)
    u2s = d.utt2spk()
    assert list(u2s) == c_sorted(u2s) and len(u2s) == 9
    assert "1027-010270003" in u2s and u2s["1027-010270003"] == "1027"
    assert all(u.startswith(s + "-") for u, s in u2s.items())
    wav = d.table("wav.scp")
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in wav.values())
    # listed as .WAV, stored as .flac: accepted
    assert wav["0001-000010003"].endswith("000010003.flac")
    assert d.table("text")["0001-000010010"] == "WE CALL IT BEAR 1"
    assert d.table("spk2gender") == {"0001": "m", "0005": "m", "1027": "f"}
    assert not (d.path / "spk2age").exists()
    durs = d.utt2dur()
    assert durs["0005-000050017"] == pytest.approx(0.35, abs=1e-4)


def test_speechocean762_inconsistent_lists_name_file_and_line(tmp_path: Path) -> None:
    corpus = make_speechocean_mini(tmp_path / "so762")
    wav_scp = corpus / "test" / "wav.scp"
    lines = wav_scp.read_text().splitlines()
    lines[2] = lines[2].split("\t")[0] + "\tWAVE/SPEAKER0003/missing.WAV"
    wav_scp.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"test/wav.scp:3: audio file not found: .*missing.WAV"):
        collect("speechocean762", str(corpus), split="test")
    wav_scp.write_text("\n".join(lines[:2]) + "\n099990001\tWAVE/x.WAV\n")
    with pytest.raises(InputError, match=r"test/wav.scp:3: utterance '099990001' has no speaker"):
        collect("speechocean762", str(corpus), split="test")
    wav_scp.write_text("\n".join(lines[:2]) + "\n")
    with pytest.raises(InputError, match=r"test/utt2spk:\d+: .* has no audio"):
        collect("speechocean762", str(corpus), split="test")


def test_rerun_replaces_only_its_own_data_dir(tmp_path: Path) -> None:
    """A data dir spkflow wrote is replaced byte for byte; one holding a file it did not write
    (a stale feats.scp) is refused and left as it was, unless overwrite; nothing goes to .backup."""
    corpus = make_speechocean_mini(tmp_path / "so762")
    out = tmp_path / "data" / "test"
    write_data_dir(collect("speechocean762", str(corpus), split="test"), out, trials=True)
    first = {n: (out / n).read_bytes() for n in ("wav.scp", "utt2spk", "spk2utt", "utt2dur", "trials")}
    write_data_dir(collect("speechocean762", str(corpus), split="test"), out, trials=True)
    assert {n: (out / n).read_bytes() for n in first} == first  # deterministic, byte for byte
    (out / "feats.scp").write_text("stale\n")
    with pytest.raises(InputError, match=r"test: exists and holds files spkflow did not write \(feats.scp\)"):
        write_data_dir(collect("speechocean762", str(corpus), split="test"), out, trials=True)
    assert (out / "feats.scp").read_text() == "stale\n" and {n: (out / n).read_bytes() for n in first} == first
    write_data_dir(collect("speechocean762", str(corpus), split="test"), out, trials=True, overwrite=True)
    assert not (out / "feats.scp").exists() and {n: (out / n).read_bytes() for n in first} == first
    assert not (out / ".backup").exists()
    assert not list(tmp_path.joinpath("data").glob(".test.*"))  # no temporary dirs left behind


# --------------------------------------------------------------------------- DSPSpeech-20, FSDD, LibriSpeech


def test_dspspeech20_rounds_exclusion_and_both_formats(tmp_path: Path) -> None:
    corpus = make_dsp20_mini(tmp_path / "dsp")
    tone(corpus / "speech_data" / "15307110252" / "15307110252-00-01.wav", 0.2)  # a .wav among .flac
    (corpus / "speech_data" / "15307110189" / "notes.txt").write_text("not audio\n")
    data = collect("dspspeech20", str(corpus))
    spks = Counter(u.spk for u in data.utterances)
    assert spks == {"15307110189": 9, "15307130120": 9, "15307110252": 1}  # 15307130191 left out
    d = write_data_dir(collect("dspspeech20", str(corpus), rounds=["01", "2"]), tmp_path / "dsp20", trials=True)
    assert_valid(d.path)
    assert sorted(set(u.rsplit("-", 1)[1] for u in d.utts())) == ["01", "02"]
    assert "15307110189-02-01" in d.utts()
    assert len(d.utts()) == 2 * 3 * 2 + 1
    both = collect("dspspeech20", str(corpus), exclude_speakers=[])
    assert "15307130191" in {u.spk for u in both.utterances}


def test_same_utterance_in_two_formats_is_an_error(tmp_path: Path) -> None:
    corpus = make_dsp20_mini(tmp_path / "dsp", spks=("15307110189",), words=1, rounds=1)
    tone(corpus / "speech_data" / "15307110189" / "15307110189-00-01.wav", 0.2)
    with pytest.raises(InputError, match="more than one audio file"):
        collect("dspspeech20", str(corpus))


def test_fsdd_ids_text_and_8k_durations(tmp_path: Path) -> None:
    corpus = make_fsdd_mini(tmp_path / "fsdd")
    d = write_data_dir(collect("fsdd", str(corpus)), tmp_path / "fsdd_data")
    assert_valid(d.path)
    assert d.utt2spk()["jackson-2_jackson_1"] == "jackson"
    assert d.table("text")["jackson-2_jackson_1"] == "2"
    assert all(v == pytest.approx(0.3) for v in d.utt2dur().values())
    # also accepts the recordings folder itself
    assert len(collect("fsdd", str(corpus / "recordings")).utterances) == 18


def test_librispeech_subsets_text_gender(tmp_path: Path) -> None:
    corpus = make_librispeech_mini(tmp_path / "LibriSpeech")
    d = write_data_dir(collect("librispeech", str(corpus)), tmp_path / "all")
    assert_valid(d.path)
    assert d.spks() == ["121", "19", "61"] and len(d.utts()) == 8
    assert d.table("spk2gender") == {"121": "f", "19": "f", "61": "m"}
    assert d.table("text")["61-70970-0001"] == "HELLO WORLD 1"
    only = collect("librispeech", str(corpus), subsets=["test-clean"])
    assert {u.spk for u in only.utterances} == {"121", "61"}
    direct = collect("librispeech", str(corpus / "train-clean-100"))
    assert [u.utt for u in direct.utterances] == ["19-198-0000", "19-198-0001"]
    with pytest.raises(FileNotFoundError, match="dev-other"):
        collect("librispeech", str(corpus), subsets=["dev-other"])


# --------------------------------------------------------------------------- trials


def check_trials(trials: list[tuple[str, str, bool]], u2s: dict[str, str], ratio: float) -> None:
    by_spk = Counter(u2s.values())
    n_target = sum(n * (n - 1) // 2 for n in by_spk.values())
    n = len(u2s)
    n_nontarget_all = n * (n - 1) // 2 - n_target
    targets = [(a, b) for a, b, t in trials if t]
    nontargets = [(a, b) for a, b, t in trials if not t]
    assert len(targets) == n_target  # every target pair
    assert len(nontargets) == min(n_nontarget_all, int(np.floor(ratio * n_target + 1e-9)))
    assert all(u2s[a] == u2s[b] for a, b in targets) and all(u2s[a] != u2s[b] for a, b in nontargets)
    pairs = [(a, b) for a, b, _ in trials]
    assert len(set(pairs)) == len(pairs) and all(a.encode() < b.encode() for a, b in pairs)


def test_trials_every_target_and_bounded_nontargets(tmp_path: Path) -> None:
    u2s = {f"s{s:02d}-u{u}": f"s{s:02d}" for s in range(20) for u in range(4)}
    trials = make_trials(u2s, nontarget_ratio=10, seed=3)
    check_trials(trials, u2s, 10)
    assert sum(t for *_, t in trials) == 20 * 6 and len(trials) == 20 * 6 * 11
    write_trials(tmp_path / "trials", trials)
    text = (tmp_path / "trials").read_bytes()
    lines = text.decode().splitlines()
    assert lines == sorted(lines, key=str.encode)
    assert read_trials(tmp_path / "trials", u2s) == trials
    assert make_trials(u2s, 10, seed=3) == trials  # deterministic
    assert make_trials(u2s, 10, seed=4) != trials  # the seed matters
    assert make_trials(u2s, 0, seed=3) == [t for t in trials if t[2]]


def test_trials_of_at_most_k_utterances_per_speaker() -> None:
    """max_per_spk bounds a big set (stage 6's default calibration trials): a seeded sample per
    speaker, chosen independently of the other speakers."""
    u2s = {f"s{s:02d}-u{u:02d}": f"s{s:02d}" for s in range(6) for u in range(3 + 3 * s)}
    trials = make_trials(u2s, nontarget_ratio=2, seed=1, max_per_spk=4)
    used = {u for a, b, _ in trials for u in (a, b)}
    per_spk = Counter(u2s[u] for u in used)
    assert per_spk == {f"s{s:02d}": min(4, 3 + 3 * s) for s in range(6)}
    assert sum(t for *_, t in trials) == 3 + 5 * 6  # C(3,2) + five speakers of C(4,2)
    kept = {u: u2s[u] for u in used}
    check_trials(trials, kept, 2)
    assert make_trials(u2s, 2, seed=1, max_per_spk=4) == trials
    fewer = {u: s for u, s in u2s.items() if s != "s05"}  # another speaker gone: the others' choice stays
    assert {u for a, b, _ in make_trials(fewer, 2, seed=1, max_per_spk=4) for u in (a, b)} == used - {
        u for u in used if u2s[u] == "s05"
    }
    with pytest.raises(ValueError, match="max_per_spk must be >= 2"):
        make_trials(u2s, max_per_spk=1)


def test_trials_dense_case_takes_all_nontargets() -> None:
    u2s = {"a-1": "a", "a-2": "a", "a-3": "a", "b-1": "b", "c-1": "c"}
    trials = make_trials(u2s, nontarget_ratio=10)
    assert len([t for t in trials if not t[2]]) == 7  # 10 pairs - 3 targets, all of them


@pytest.mark.parametrize("ratio", [2.0, 4.0])  # 8 of 24 non-target pairs (rejection), 16 of 24 (enumeration)
def test_nontarget_sample_is_uniform(ratio: float) -> None:
    u2s = {f"s{s}-{u}": f"s{s}" for s in range(4) for u in range(2)}
    counts: Counter[tuple[str, str]] = Counter()
    runs = 1500
    for seed in range(runs):
        counts.update((a, b) for a, b, t in make_trials(u2s, ratio, seed) if not t)
    assert len(counts) == 24
    expected = runs * 4 * ratio / 24
    assert all(abs(c - expected) < 0.15 * expected for c in counts.values()), counts


def test_read_trials_rejects_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "trials"
    p.write_text("a-1 a-2 target\na-2 a-1 nontarget\n")
    with pytest.raises(InputError, match=r"trials:2: pair .* already listed on line 1"):
        read_trials(p)
    p.write_text("a-1 a-1 target\n")
    with pytest.raises(InputError, match=r"trials:1: .*itself"):
        read_trials(p)
    p.write_text("a-1 b-1 maybe\n")
    with pytest.raises(InputError, match=r"trials:1: expected"):
        read_trials(p)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=12), st.floats(0, 12), st.integers(0, 2**32 - 1))
def test_trials_properties(sizes: list[int], ratio: float, seed: int) -> None:
    u2s = {f"spk{s}-{u}": f"spk{s}" for s, n in enumerate(sizes) for u in range(n)}
    trials = make_trials(u2s, nontarget_ratio=ratio, seed=seed)
    check_trials(trials, u2s, ratio)
    lines = [f"{a} {b} {'target' if t else 'nontarget'}" for a, b, t in trials]
    assert lines == sorted(lines, key=str.encode)
    assert make_trials(u2s, nontarget_ratio=ratio, seed=seed) == trials


# --------------------------------------------------------------------------- the front end


def run_prepare(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m spkflow.bin.prepare_corpus ARGS`` as a recipe's local/data.sh runs it."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "spkflow.bin.prepare_corpus", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_front_end_prepares_and_validates(tmp_path: Path) -> None:
    fsdd = make_fsdd_mini(tmp_path / "fsdd")
    r = run_prepare("fsdd", "--trials", "true", str(fsdd), str(tmp_path / "data" / "fsdd"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "data" / "fsdd" / "trials").is_file() and "validated" in r.stderr
    libri = make_librispeech_mini(tmp_path / "LibriSpeech")
    r = run_prepare("librispeech", "--subsets", "test-clean", str(libri), str(tmp_path / "data" / "libri"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert DataDir(tmp_path / "data" / "libri").spks() == ["121", "61"]
    dsp = make_dsp20_mini(tmp_path / "dsp")
    r = run_prepare("dspspeech20", "--rounds", "01 02", str(dsp), str(tmp_path / "data" / "dsp20"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(DataDir(tmp_path / "data" / "dsp20").utts()) == 2 * 3 * 2
    r = run_prepare("speechocean762", "--split", "dev", str(tmp_path), str(tmp_path / "x"))
    assert r.returncode != 0 and "--split: invalid choice: 'dev'" in r.stderr
    r = run_prepare("fsdd", str(fsdd))
    assert r.returncode != 0 and "usage:" in r.stderr
    r = run_prepare("timit", str(fsdd), str(tmp_path / "y"))
    assert r.returncode != 0 and "invalid choice: 'timit'" in r.stderr


@pytest.mark.parametrize(
    "corpus,var",
    [
        ("speechocean762", "SPEECHOCEAN762"),
        ("dspspeech20", "DSPSPEECH20"),
        ("fsdd", "FSDD"),
        ("librispeech", "LIBRISPEECH"),
        ("voxceleb1", "VOXCELEB1"),
        ("voxceleb2", "VOXCELEB2"),
        ("musan", "MUSAN"),
        ("rirs_noises", "RIRS_NOISES"),
    ],
)
def test_missing_corpus_says_which_variable_to_set(tmp_path: Path, corpus: str, var: str) -> None:
    r = run_prepare(corpus, "--download", "false", str(tmp_path / "nowhere"), str(tmp_path / "out"))
    out = r.stdout + r.stderr
    assert r.returncode != 0 and var in out and str(tmp_path / "nowhere") in out and "db.sh" in out
    assert not (tmp_path / "out").exists()


def test_download_attempt_fails_fast(tmp_path: Path) -> None:
    """An unreachable host (a non-routable address) must not hang data prep: the probe is
    bounded by the timeout, then the message names the variable."""
    start = time.monotonic()
    with pytest.raises(CorpusNotFound, match="export MYCORPUS="):
        ensure_corpus(tmp_path / "c", "wav.scp", "MYCORPUS", "https://10.255.255.1/none.git", True, timeout=2)
    assert time.monotonic() - start < 60  # a hang is minutes; 30x the probe's timeout on a loaded box
    assert not list(tmp_path.iterdir())  # no partial download left


def test_folder_without_marker_is_not_downloaded_over(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("x")
    with pytest.raises(CorpusNotFound, match="exists but has no wav.scp"):
        ensure_corpus(tmp_path / "c", "wav.scp", "MYCORPUS", "https://10.255.255.1/none.git", True, timeout=2)


# --------------------------------------------------------------------------- the real corpora


_REAL: dict[str, DataDir] = {}


@pytest.fixture
def real_sets(corpus, tmp_path_factory: pytest.TempPathFactory) -> dict[str, DataDir]:
    """data/{train,test,dsp20} of the demo, prepared once per session from the db.sh corpora."""
    so762, dsp20 = corpus("SPEECHOCEAN762"), corpus("DSPSPEECH20")
    if not _REAL:
        out = tmp_path_factory.mktemp("real")
        _REAL["train"] = write_data_dir(collect("speechocean762", str(so762), split="train"), out / "train")
        _REAL["test"] = write_data_dir(collect("speechocean762", str(so762), split="test"), out / "test", trials=True)
        _REAL["dsp20"] = write_data_dir(
            collect("dspspeech20", str(dsp20), rounds=["01", "02"]), out / "dsp20", trials=True
        )
    return _REAL


@pytest.mark.corpus
@pytest.mark.parametrize(
    "name,n_spk,n_utt,per_spk", [("train", 125, 1500, 12), ("test", 125, 500, 4), ("dsp20", 33, 1320, 40)]
)
def test_real_corpus_counts_and_validity(
    real_sets: dict[str, DataDir], name: str, n_spk: int, n_utt: int, per_spk: int
) -> None:
    d = real_sets[name]
    assert_valid(d.path)
    s2u = d.spk2utt()
    assert len(s2u) == n_spk and len(d.utts()) == n_utt
    assert {len(v) for v in s2u.values()} == {per_spk}
    durs = d.utt2dur()
    assert len(durs) == n_utt and 0.3 < min(durs.values()) and max(durs.values()) < 30


@pytest.mark.corpus
def test_real_corpus_splits_are_disjoint_and_trials_complete(real_sets: dict[str, DataDir]) -> None:
    assert not set(real_sets["train"].spks()) & set(real_sets["test"].spks())
    for name in ("test", "dsp20"):
        d = real_sets[name]
        u2s = d.utt2spk()
        trials = read_trials(d.file("trials"), u2s)
        check_trials(trials, u2s, 10)
        n_target = sum(1 for t in trials if t[2])
        assert n_target == {"test": 125 * 6, "dsp20": 33 * 780}[name]
        assert len(trials) - n_target == 10 * n_target
        lines = d.file("trials").read_text().splitlines()
        assert lines == sorted(lines, key=str.encode)
        targets_seen = {(a, b) for a, b, t in trials if t}
        for utts in d.spk2utt().values():
            assert set(itertools.combinations(sorted(utts, key=str.encode), 2)) <= targets_seen
    # same inputs, same trials: deterministic with the seed
    again = make_trials(real_sets["test"].utt2spk(), 10, seed=0)
    assert again == read_trials(real_sets["test"].file("trials"))
    assert read_kv(real_sets["test"].file("wav.scp"))["0003-000030012"].endswith("000030012.flac")
