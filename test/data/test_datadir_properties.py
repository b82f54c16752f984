"""Property tests (hypothesis) of the data-dir utilities on random data dirs.

Laws: utt2spk <-> spk2utt round trips; tables are written sorted whatever the input
order; fix_data_dir keeps exactly the utterances present everywhere, leaves a
valid data dir, keeps the originals, and is idempotent; split (split_scp.pl) then
subset + combine gives the original back; filter/subset laws; a single corruption
is reported at the right file and line.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.paths import ROOT
from spkflow.core.errors import InputError
from spkflow.data.combine import combine_data
from spkflow.data.datadir import DataDir
from spkflow.data.fix import fix_data_dir
from spkflow.data.steps import filter_lines
from spkflow.data.subset import subset_data_dir, subset_lines
from spkflow.data.tables import (
    c_key,
    c_sorted,
    check_sorted_unique,
    read_kv,
    spk2utt_to_utt2spk,
    utt2spk_to_spk2utt,
    write_kv,
)

UTILS = ROOT / "utils"
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Speaker ids use only characters sorting after '-', so "<spk>-<suffix>" utterance ids
# sort with their speakers (the Kaldi convention the validator checks).
spk_ids = st.text(alphabet="ABZabz019_.", min_size=1, max_size=4)
suffixes = st.text(alphabet="abXY09_.-", min_size=1, max_size=3)


@st.composite
def utt2spks(draw: st.DrawFn, max_spk: int = 6) -> dict[str, str]:
    spks = draw(st.lists(spk_ids, min_size=1, max_size=max_spk, unique=True))
    out = {}
    for s in spks:
        for x in draw(st.lists(suffixes, min_size=1, max_size=5, unique=True)):
            out[f"{s}-{x}"] = s
    return dict(sorted(out.items(), key=lambda kv: c_key(kv[0])))


def tmpdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="spkflow-prop-"))


def make_dir(d: Path, u2s: dict[str, str]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    write_kv(d / "utt2spk", u2s)
    write_kv(d / "spk2utt", utt2spk_to_spk2utt(u2s))
    write_kv(d / "wav.scp", {u: f"/audio/{u}.wav" for u in u2s})
    return d


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@SETTINGS
@given(u2s=utt2spks())
def test_utt2spk_spk2utt_round_trip(u2s: dict[str, str]) -> None:
    s2u = utt2spk_to_spk2utt(u2s)
    assert list(s2u) == c_sorted(s2u)  # speakers come out sorted
    assert list(spk2utt_to_utt2spk(s2u).items()) == list(u2s.items())
    d = make_dir(tmpdir(), u2s)
    try:
        DataDir(d).validate()  # raises on any problem
        assert DataDir(d).spk2utt() == s2u
    finally:
        shutil.rmtree(d)


@SETTINGS
@given(u2s=utt2spks(), seed=st.integers(0, 2**16))
def test_write_kv_sorted_whatever_the_order(u2s: dict[str, str], seed: int) -> None:
    items = list(u2s.items())
    random.Random(seed).shuffle(items)
    d = tmpdir()
    try:
        write_kv(d / "a", items)
        write_kv(d / "b", u2s)
        assert (d / "a").read_bytes() == (d / "b").read_bytes()
        assert check_sorted_unique(d / "a") == list(u2s)
        assert read_kv(d / "a") == u2s
    finally:
        shutil.rmtree(d)


@st.composite
def messy_dirs(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, str]]:
    """utt2spk plus wav.scp / utt2dur / spk2gender each missing some keys, with some
    non-positive durations and some keys nobody else has."""
    u2s = draw(utt2spks())
    utts, spks = list(u2s), sorted(set(u2s.values()))
    wav = {u: f"/a/{u}.wav" for u in utts if draw(st.booleans()) or draw(st.booleans())}
    wav.update({f"zz-{i}": "/a/x.wav" for i in range(draw(st.integers(0, 2)))})
    dur = {u: draw(st.sampled_from(["1.5", "2", "0", "3e-1", "-1"])) for u in utts if draw(st.integers(0, 5))}
    gender = {s: draw(st.sampled_from("mf")) for s in spks if draw(st.integers(0, 4))} if draw(st.booleans()) else {}
    return u2s, wav, dur, gender


def write_shuffled(path: Path, table: dict[str, str], rng: random.Random, dup: bool) -> None:
    lines = [f"{k} {v}\n" for k, v in table.items()]
    rng.shuffle(lines)
    if dup and lines:
        lines.append(lines[0])  # an exact duplicate line
    path.write_text("".join(lines))


@SETTINGS
@given(case=messy_dirs(), seed=st.integers(0, 2**16), dup=st.booleans())
def test_fix_keeps_what_is_everywhere_and_is_idempotent(case, seed: int, dup: bool) -> None:
    u2s, wav, dur, gender = case
    rng = random.Random(seed)
    d = tmpdir()
    try:
        write_shuffled(d / "utt2spk", u2s, rng, dup)
        write_shuffled(d / "wav.scp", wav, rng, dup)
        write_shuffled(d / "utt2dur", dur, rng, False)
        if gender:
            write_shuffled(d / "spk2gender", gender, rng, False)
        originals = files(d)
        expected = [u for u in u2s if u in wav and u in dur and float(dur[u]) > 0 and (not gender or u2s[u] in gender)]
        if not expected:
            with pytest.raises(InputError, match="no utterances remained"):
                fix_data_dir(d)
            assert files(d) == originals  # nothing touched
            return
        rep = fix_data_dir(d)
        assert list(read_kv(d / "utt2spk")) == expected
        assert rep.kept == len(expected)
        DataDir(d).validate()  # raises on any problem
        for name in rep.changed:
            if name in originals:
                assert (d / ".backup" / name).read_bytes() == originals[name]
        once = files(d)
        assert fix_data_dir(d).changed == []
        assert files(d) == once
    finally:
        shutil.rmtree(d)


def split_scp(args: str) -> None:
    p = subprocess.run(
        ["bash", "-c", f"{UTILS}/split_scp.pl {args}"], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C")
    )
    assert p.returncode == 0, p.stderr


@SLOW
@given(u2s=utt2spks(max_spk=8), nparts=st.integers(1, 4))
def test_split_by_speaker_then_combine_gives_the_original(u2s: dict[str, str], nparts: int) -> None:
    nspk = len(set(u2s.values()))
    nparts = min(nparts, nspk)
    d = tmpdir()
    try:
        src = make_dir(d / "src", u2s)
        parts = [d / f"u2s.{j}" for j in range(1, nparts + 1)]
        split_scp(f"--utt2spk={src}/utt2spk {src}/utt2spk " + " ".join(map(str, parts)))
        texts = [p.read_text() for p in parts]
        assert "".join(texts) == (src / "utt2spk").read_text()
        seen: dict[str, int] = {}
        for j, t in enumerate(texts):
            assert t, "no part may be empty"
            for line in t.splitlines():
                assert seen.setdefault(line.split()[1], j) == j  # a speaker lives in one part
        for j, p in enumerate(parts):
            subset_data_dir(src, d / f"part{j}", utt_list=p)
        combine_data(d / "all", [d / f"part{j}" for j in reversed(range(nparts))])
        for name in ("utt2spk", "spk2utt", "wav.scp"):
            assert (d / "all" / name).read_bytes() == (src / name).read_bytes()
    finally:
        shutil.rmtree(d)


@SLOW
@given(n=st.integers(1, 30), nparts=st.integers(1, 6))
def test_split_by_lines_sizes(n: int, nparts: int) -> None:
    nparts = min(n, nparts)
    d = tmpdir()
    try:
        (d / "scp").write_text("".join(f"u{i:03d} x\n" for i in range(n)))
        outs = [d / f"o{j}" for j in range(nparts)]
        split_scp(f"{d}/scp " + " ".join(map(str, outs)))
        sizes = [len(o.read_text().splitlines()) for o in outs]
        assert sum(sizes) == n and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
        assert "".join(o.read_text() for o in outs) == (d / "scp").read_text()
    finally:
        shutil.rmtree(d)


@SETTINGS
@given(keys=st.lists(suffixes, min_size=0, max_size=15, unique=True), pick=st.sets(suffixes, max_size=10))
def test_filter_include_exclude_partition(keys: list[str], pick: set[str]) -> None:
    lines = [f"{k} v{i}\n" for i, k in enumerate(keys)]
    inc, exc = filter_lines(lines, pick), filter_lines(lines, pick, exclude=True)
    assert len(inc) + len(exc) == len(lines)
    assert [x for x in lines if x in inc] == inc and [x for x in lines if x in exc] == exc  # order kept
    assert {x.split()[0] for x in inc} == set(keys) & pick


@SETTINGS
@given(u2s=utt2spks(), data=st.data())
def test_subset_laws(u2s: dict[str, str], data: st.DataObject) -> None:
    utts = list(u2s)
    d = tmpdir()
    try:
        src = make_dir(d / "src", u2s)
        pick = data.draw(st.lists(st.sampled_from(utts), min_size=1, unique=True))
        (d / "list").write_text("".join(f"{u}\n" for u in pick) + "not-an-utt\n")
        subset_data_dir(src, d / "ul", utt_list=d / "list")
        assert list(read_kv(d / "ul" / "utt2spk")) == [u for u in utts if u in set(pick)]
        DataDir(d / "ul").validate()

        n = data.draw(st.integers(1, min(4, len(utts))))
        subset_data_dir(src, d / "per", num_utt=n, mode="per_spk")
        got = DataDir(d / "per").utt2spk()
        full = utt2spk_to_spk2utt(u2s)
        for spk, su in full.items():
            mine = [u for u in got if got[u] == spk]
            assert len(mine) == min(n, len(su)) and [u for u in su if u in set(mine)] == mine

        k = data.draw(st.integers(1, len(utts)))
        lines = [f"{u}\n" for u in utts]
        spread = subset_lines(lines, k)
        assert len(spread) == k and [x for x in lines if x in set(spread)] == spread
        subset_data_dir(src, d / "sp", num_utt=k)
        assert list(read_kv(d / "sp" / "utt2spk")) == [x[:-1] for x in spread]
        DataDir(d / "sp").validate()
    finally:
        shutil.rmtree(d)


@SETTINGS
@given(u2s=utt2spks().filter(lambda m: len(m) >= 2), data=st.data())
def test_single_corruption_is_located(u2s: dict[str, str], data: st.DataObject) -> None:
    d = tmpdir()
    try:
        make_dir(d, u2s)
        lines = (d / "utt2spk").read_text().splitlines(keepends=True)
        i = data.draw(st.integers(0, len(lines) - 2))
        kind = data.draw(st.sampled_from(["swap", "dup", "drop_wav"]))
        if kind == "swap":
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
            (d / "utt2spk").write_text("".join(lines))
            bad, line, words = "utt2spk", i + 2, "not sorted"
        elif kind == "dup":
            lines.insert(i + 1, lines[i])
            (d / "utt2spk").write_text("".join(lines))
            bad, line, words = "utt2spk", i + 2, "duplicate key"
        else:
            wav = (d / "wav.scp").read_text().splitlines(keepends=True)
            del wav[i]
            (d / "wav.scp").write_text("".join(wav))
            bad, line, words = "wav.scp", i + 1 if i < len(wav) else None, "missing from wav.scp"
        with pytest.raises(InputError) as e:
            DataDir(d).validate()
        assert e.value.path == str(d / bad) and e.value.line == line and words in str(e.value)
    finally:
        shutil.rmtree(d)
