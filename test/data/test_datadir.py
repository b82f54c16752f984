"""Unit tests of spkflow.data.tables (tables, DataDir.validate) and spkflow.data.steps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.datadirs import input_error, snapshot, write_dir
from spkflow.core.errors import InputError
from spkflow.data.check import check_data_dir
from spkflow.data.combine import combine_data, copy_data_dir
from spkflow.data.datadir import DataDir
from spkflow.data.fix import fix_data_dir
from spkflow.data.steps import filter_lines
from spkflow.data.subset import PerlRandom, subset_data_dir, subset_lines
from spkflow.data.tables import (
    c_sorted,
    check_sorted_unique,
    read_keys,
    read_kv,
    read_kv_lines,
    read_spk2utt,
    spk2utt_to_utt2spk,
    utt2spk_to_spk2utt,
    write_kv,
)


def good_dir(d: Path) -> Path:
    return write_dir(
        d,
        utt2spk="a-1 a\na-2 a\nb-1 b\n",
        spk2utt="a a-1 a-2\nb b-1\n",
        wav_scp="a-1 /w/a1.wav\na-2 sox /w/a2.flac -t wav - |\nb-1 /w/b1.wav\n",
        utt2dur="a-1 1.5\na-2 2\nb-1 0.75\n",
    )


# --------------------------------------------------------------------------- tables


def test_read_kv_keeps_rest_of_line_and_tabs(tmp_path: Path) -> None:
    p = tmp_path / "wav.scp"
    p.write_text("u1\tsox  a.wav -t wav - |  \nu2 b.wav\n")
    assert read_kv(p) == {"u1": "sox  a.wav -t wav - |", "u2": "b.wav"}
    assert read_kv_lines(p) == [("u1", "sox  a.wav -t wav - |"), ("u2", "b.wav")]
    assert read_keys(p) == ["u1", "u2"]


@pytest.mark.parametrize(
    "text,line,words",
    [
        ("a 1\nb 2\na 3\n", 3, "duplicate key 'a' (first on line 1)"),
        ("a 1\n\nb 2\n", 2, "empty line"),
        ("a 1\nb\n", 2, "only the key 'b'"),
    ],
)
def test_read_kv_errors_name_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    p = tmp_path / "utt2dur"
    e = input_error(p, text, read_kv)
    assert e.path == str(p) and e.line == line
    assert words in str(e) and str(e).startswith(f"{p}:{line}: ")


def test_read_kv_num_fields(tmp_path: Path) -> None:
    p = tmp_path / "utt2spk"
    p.write_text("a-1 a\na-2 a extra\n")
    with pytest.raises(InputError, match=r"utt2spk:2: expected 2 fields, got 3"):
        read_kv(p, num_fields=2)


def test_non_utf8_bytes_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "text"
    src.write_bytes(b"u2 caf\xe9\nu1 \xff\xfe ok\n")
    out = tmp_path / "out"
    write_kv(out, read_kv(src))
    assert out.read_bytes() == b"u1 \xff\xfe ok\nu2 caf\xe9\n"


def test_read_spk2utt(tmp_path: Path) -> None:
    p = tmp_path / "spk2utt"
    p.write_text("a a-1 a-2\nb b-1\n")
    assert read_spk2utt(p) == {"a": ["a-1", "a-2"], "b": ["b-1"]}
    for text, line, words in [
        ("a a-1\nb\n", 2, "no utterances"),
        ("a a-1\na a-2\n", 2, "duplicate speaker"),
        ("a a-1\nb a-1\n", 2, "listed twice (also on line 1)"),
    ]:
        e = input_error(p, text, read_spk2utt)
        assert e.line == line and words in str(e)


def test_write_kv_sorts_like_lc_all_c(tmp_path: Path) -> None:
    p = tmp_path / "t"
    write_kv(p, {"a_1": "x", "a-1": "y", "B": "z", "a": ["p", "q"], "\u00e9": "e"})
    # bytes order: 'B'(0x42) < 'a' < 'a-1' ('-'=0x2d) < 'a_1' ('_'=0x5f) < 'é' (0xc3 0xa9)
    assert p.read_text() == "B z\na p q\na-1 y\na_1 x\n\u00e9 e\n"
    assert c_sorted(["b", "B", "a-1", "a_1", "a"]) == ["B", "a", "a-1", "a_1", "b"]
    with pytest.raises(ValueError, match="duplicate key"):
        write_kv(p, [("a", "1"), ("a", "2")])
    with pytest.raises(ValueError, match="bad key"):
        write_kv(p, {"a b": "1"})


def test_write_kv_is_atomic(tmp_path: Path) -> None:
    p = tmp_path / "utt2spk"
    p.write_text("old 1\n")

    def items():
        yield ("a", "1")
        raise RuntimeError("crash while producing output")

    with pytest.raises(RuntimeError):
        write_kv(p, items(), sort=False)
    assert p.read_text() == "old 1\n"
    assert os.listdir(tmp_path) == ["utt2spk"]


@pytest.mark.parametrize(
    "text,line,words",
    [
        ("a 1\nc 2\nb 3\n", 3, "not sorted: 'b' comes after 'c' (line 2)"),
        ("a 1\nb 2\nb 3\n", 3, "duplicate key 'b' (first on line 2)"),
        ("a 1\nb 2", 2, "no newline at end of file"),
        ("a-1 x\na 1\n", 2, "not sorted"),
    ],
)
def test_check_sorted_unique(tmp_path: Path, text: str, line: int, words: str) -> None:
    e = input_error(tmp_path / "feats.scp", text, check_sorted_unique)
    assert e.line == line and words in str(e)


def test_check_sorted_unique_accepts_c_order(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_text("B 1\na 1\na-1 2\na_1 3\nb 4\n")
    assert check_sorted_unique(p) == ["B", "a", "a-1", "a_1", "b"]


def test_utt2spk_spk2utt_conversions() -> None:
    u2s = {"a-1": "a", "b-1": "b", "a-2": "a"}
    assert utt2spk_to_spk2utt(u2s) == {"a": ["a-1", "a-2"], "b": ["b-1"]}
    assert list(utt2spk_to_spk2utt(u2s)) == ["a", "b"]  # order of first appearance
    assert spk2utt_to_utt2spk({"a": ["a-1", "a-2"], "b": ["b-1"]}) == {"a-1": "a", "a-2": "a", "b-1": "b"}
    with pytest.raises(ValueError):
        spk2utt_to_utt2spk({"a": ["x"], "b": ["x"]})


# --------------------------------------------------------------------------- DataDir.validate


def test_datadir_accessors(tmp_path: Path) -> None:
    d = DataDir(good_dir(tmp_path / "d"))
    assert d.utts() == ["a-1", "a-2", "b-1"] and d.spks() == ["a", "b"]
    assert d.utt2dur() == {"a-1": 1.5, "a-2": 2.0, "b-1": 0.75}
    assert d.table("wav.scp")["a-2"] == "sox /w/a2.flac -t wav - |"
    (d.path / "spk2utt").unlink()
    assert d.spk2utt() == {"a": ["a-1", "a-2"], "b": ["b-1"]}


def test_validate_good_dir(tmp_path: Path) -> None:
    d = DataDir(good_dir(tmp_path / "d"))
    assert d.validate() == []
    with pytest.raises(InputError, match="text: no such file"):
        d.validate(no_text=False)
    with pytest.raises(InputError, match="feats.scp: no such file"):
        d.validate(no_feats=False)
    (d.path / "wav.scp").unlink()
    with pytest.raises(InputError, match="wav.scp: no such file"):
        d.validate()
    assert d.validate(no_wav=True) == []


def test_validate_warns_single_speaker(tmp_path: Path) -> None:
    d = write_dir(tmp_path / "d", utt2spk="a-1 a\n", spk2utt="a a-1\n")
    assert "only one speaker" in DataDir(d).validate(no_wav=True)[0]


BAD_CASES = [
    # (file to overwrite, new content, file named in the error, line, words)
    ("utt2spk", "a-2 a\na-1 a\nb-1 b\n", "utt2spk", 2, "not sorted"),
    ("utt2spk", "a-1 a\na-1 a\nb-1 b\n", "utt2spk", 2, "duplicate key 'a-1'"),
    ("utt2spk", "a-1 a\na-2 a x\nb-1 b\n", "utt2spk", 2, "2 fields"),
    ("utt2spk", "a-1 b\na-2 a\nb-1 b\n", "utt2spk", 2, "not sorted by speaker"),
    ("spk2utt", "a a-1\nb b-1\n", "utt2spk", 2, "not in spk2utt"),
    ("spk2utt", "a a-1 a-2 b-1\n", "spk2utt", 1, "disagree"),
    ("spk2utt", "a a-1 a-2\nb b-1 b-9\n", "spk2utt", 2, "'b-9' (speaker 'b') is not in utt2spk"),
    ("wav.scp", "a-1 /w/a1.wav\nb-1 /w/b1.wav\n", "wav.scp", 2, "'a-2' (utt2spk line 2) is missing from wav.scp"),
    ("wav.scp", "a-1 /w/a1.wav\na-2 x\na-3 y\nb-1 /w/b1.wav\n", "wav.scp", 3, "'a-3' is not in utt2spk"),
    ("wav.scp", "a-1 ~/a1.wav\na-2 x\nb-1 y\n", "wav.scp", 1, "'~'"),
    ("utt2dur", "a-1 1.5\na-2 0\nb-1 1\n", "utt2dur", 2, "positive number"),
    ("utt2dur", "a-1 1.5\nb-1 1\n", "utt2dur", 2, "missing from utt2dur"),
    ("utt2num_frames", "a-1 10\na-2 1.5\nb-1 3\n", "utt2num_frames", 2, "positive integer"),
    ("feats.scp", "a-1 f:1\na-2 f:2\n", "feats.scp", None, "'b-1' (utt2spk line 3) is missing"),
    ("vad.scp", "a-1 f:1\nb-1 f:2\n", "vad.scp", 2, "missing from vad.scp"),
    ("spk2gender", "a m\nb x\n", "spk2gender", 2, "m|f"),
    ("spk2gender", "a m\n", "spk2gender", None, "'b' (spk2utt line 2) is missing"),
    ("cmvn.scp", "a c:1\nb c:2\nc c:3\n", "cmvn.scp", 3, "speaker 'c' is not in spk2utt"),
]


@pytest.mark.parametrize("name,content,bad_file,line,words", BAD_CASES)
def test_validate_bad_input(
    tmp_path: Path, name: str, content: str, bad_file: str, line: int | None, words: str
) -> None:
    d = good_dir(tmp_path / "d")
    (d / name).write_text(content)
    before = snapshot(d)
    with pytest.raises(InputError) as e:
        DataDir(d).validate()
    assert e.value.path == str(d / bad_file), str(e.value)
    assert e.value.line == line, str(e.value)
    assert words in str(e.value)
    assert snapshot(d) == before  # validation never changes anything


NON_UTF8_CASES = [
    # (file, bytes, line, id shown): an utterance, speaker or recording id with a byte that is not UTF-8
    ("utt2spk", b"a-1 a\na-2 a\nb-\xff1 b\n", 3, "b-\\xff1"),
    ("utt2spk", b"a-1 a\na-2 a\nb-1 b\xe9\n", 3, "b\\xe9"),
    ("spk2utt", b"a a-1 a-2\nb b-1 b-\xfe2\n", 2, "b-\\xfe2"),
    ("wav.scp", b"a-1 /w/a1.wav\na-\xc32 /w/a2.wav\nb-1 /w/b1.wav\n", 2, "a-\\xc32"),
    ("utt2dur", b"a-1 1.5\na-2 2\nb-1\x80 0.75\n", 3, "b-1\\x80"),
]


@pytest.mark.parametrize("name,content,line,shown", NON_UTF8_CASES)
def test_validate_rejects_ids_that_are_not_utf8(
    tmp_path: Path, name: str, content: bytes, line: int, shown: str
) -> None:
    d = good_dir(tmp_path / "d")
    (d / name).write_bytes(content)
    with pytest.raises(InputError) as e:
        check_data_dir(d)
    assert e.value.path == str(d / name) and e.value.line == line, str(e.value)
    assert f"id '{shown}' holds bytes that are not UTF-8" in str(e.value)
    with pytest.raises(InputError, match="not UTF-8"):  # the class method is the same check
        DataDir(d).validate()


def test_validate_allows_other_bytes_in_values(tmp_path: Path) -> None:
    """Paths and transcripts may hold any bytes (Kaldi's rule); only ids must be UTF-8."""
    d = good_dir(tmp_path / "d")
    (d / "wav.scp").write_bytes(b"a-1 /w/caf\xe9.wav\na-2 /w/a2.wav\nb-1 /w/b1.wav\n")
    (d / "text").write_bytes(b"a-1 caf\xe9\na-2 ok\nb-1 ok\n")
    assert check_data_dir(d, no_text=False) == []
    # segments: the recording id (field 2) is an id too
    write_dir(d, segments="a-1 r1 0 1\na-2 r1 1 2\nb-1 r2 0 1\n", wav_scp="r1 /w/r1.wav\nr2 /w/r2.wav\n")
    assert check_data_dir(d) == []
    (d / "segments").write_bytes(b"a-1 r1 0 1\na-2 r1 1 2\nb-1 r\xff2 0 1\n")
    with pytest.raises(InputError, match=r"segments:3: id 'r\\xff2'"):
        check_data_dir(d)


def test_validate_text(tmp_path: Path) -> None:
    d = good_dir(tmp_path / "d")
    (d / "text").write_text("a-1 hello\na-2 world\nb-1 ok\n")
    assert DataDir(d).validate(no_text=False) == []
    (d / "text").write_text("a-1 hello\na-2 <s> world\nb-1 ok\n")
    with pytest.raises(InputError, match=r"text:2: contains the illegal symbol '<s>'"):
        DataDir(d).validate(no_text=False)
    (d / "text").write_text("a-1 hello\na-2 w\x07rld\nb-1 ok\n")
    with pytest.raises(InputError, match=r"text:2: non-printable"):
        DataDir(d).validate(no_text=False)
    (d / "text").write_text("a-1 hello\na-2 x\n")
    with pytest.raises(InputError, match=r"'b-1' \(utt2spk line 3\) is missing from text"):
        DataDir(d).validate(no_text=False)


def test_validate_segments(tmp_path: Path) -> None:
    d = write_dir(
        tmp_path / "d",
        utt2spk="a-1 a\na-2 a\nb-1 b\n",
        spk2utt="a a-1 a-2\nb b-1\n",
        segments="a-1 r1 0 1.5\na-2 r1 1.5 3\nb-1 r2 0 2\n",
        wav_scp="r1 /w/r1.wav\nr2 /w/r2.wav\n",
        reco2dur="r1 3.5\nr2 2\n",
    )
    assert DataDir(d).validate() == []
    (d / "segments").write_text("a-1 r1 0 1.5\na-2 r1 3 3\nb-1 r2 0 2\n")
    with pytest.raises(InputError, match=r"segments:2: end time 3 is not after start time 3"):
        DataDir(d).validate()
    (d / "segments").write_text("a-1 r1 0 1.5\na-2 r1 1.5 3\nb-1 r3 0 2\n")
    with pytest.raises(InputError, match=r"wav.scp:2: recording 'r2' is not in segments"):
        DataDir(d).validate()
    (d / "segments").write_text("a-1 r1 0 1.5\nb-1 r2 0 2\n")
    with pytest.raises(InputError, match=r"'a-2' \(utt2spk line 2\) is missing from segments"):
        DataDir(d).validate()


# --------------------------------------------------------------------------- fix_data_dir


def messy_dir(d: Path) -> Path:
    return write_dir(
        d,
        utt2spk="b-2 b\na-1 a\na-2 a\nb-1 b\nc-1 c\nd-1 d\n",
        spk2utt="stale\n",
        wav_scp="a-1 /w/a1.wav\na-2 /w/a2.wav\nb-1 /w/b1.wav\nb-2 /w/b2.wav\nd-1 /w/d1.wav\nz-9 /w/z.wav\n",
        utt2dur="a-1 1.5\na-2 0\nb-1 2\nb-2 3\nc-1 4\nd-1 1\n",
        spk2gender="a f\nb m\nc m\n",
    )


def test_fix_data_dir_filters_sorts_and_backs_up(tmp_path: Path) -> None:
    d = messy_dir(tmp_path / "d")
    orig = snapshot(d)
    msgs: list[str] = []
    rep = fix_data_dir(d, log=msgs.append)
    # a-2 has duration 0, c-1 has no wav, d has no gender, z-9 has no speaker
    assert (d / "utt2spk").read_text() == "a-1 a\nb-1 b\nb-2 b\n"
    assert (d / "spk2utt").read_text() == "a a-1\nb b-1 b-2\n"
    assert (d / "wav.scp").read_text() == "a-1 /w/a1.wav\nb-1 /w/b1.wav\nb-2 /w/b2.wav\n"
    assert (d / "utt2dur").read_text() == "a-1 1.5\nb-1 2\nb-2 3\n"
    assert (d / "spk2gender").read_text() == "a f\nb m\n"
    assert (rep.kept, rep.total) == (3, 5)
    assert "fix_data_dir.sh: kept 3 utterances out of 5" in msgs
    for name in ("utt2spk", "spk2utt", "wav.scp", "utt2dur", "spk2gender"):
        assert (d / ".backup" / name).read_bytes() == orig[name]  # the user's originals
    assert DataDir(d).validate() == []
    # A second run changes nothing and keeps the backup of the originals.
    rep2 = fix_data_dir(d)
    assert rep2.changed == [] and (rep2.kept, rep2.total) == (3, 3)
    assert (d / ".backup" / "utt2spk").read_bytes() == orig["utt2spk"]


@pytest.mark.parametrize(
    "files,bad,line,words",
    [
        ({"utt2spk": "a-1 a\na-2\n"}, "utt2spk", 2, "2 fields"),
        ({"utt2spk": "a-1 a\n\nb-1 b\n"}, "utt2spk", 2, "empty line"),
        ({"utt2spk": "a-1 b\na-2 a\n"}, "utt2spk", 2, "does not sort with its speaker"),
        ({"utt2spk": "a-1 a\n", "wav.scp": "b-1 x\n"}, "", None, "no utterances remained"),
    ],
)
def test_fix_data_dir_bad_input_changes_nothing(
    tmp_path: Path, files: dict[str, str], bad: str, line: int | None, words: str
) -> None:
    d = write_dir(tmp_path / "d", **files)
    before = snapshot(d)
    with pytest.raises(InputError) as e:
        fix_data_dir(d)
    assert words in str(e.value)
    assert e.value.path == str(d / bad if bad else d) and e.value.line == line
    assert snapshot(d) == before and not (d / ".backup").exists()


def test_fix_data_dir_with_segments(tmp_path: Path) -> None:
    d = write_dir(
        tmp_path / "d",
        utt2spk="a-1 a\na-2 a\nb-1 b\n",
        segments="a-2 r1\t1.5  3\na-1 r1 0 1.5\nb-1 r2 0 2\nc-1 r3 0 1\n",
        wav_scp="r1 /w/r1.wav\nr2 /w/r2.wav\nr4 /w/r4.wav\n",
    )
    fix_data_dir(d)
    # Like Kaldi: segments re-written with single spaces, recordings nobody uses dropped.
    assert (d / "segments").read_text() == "a-1 r1 0 1.5\na-2 r1 1.5 3\nb-1 r2 0 2\n"
    assert (d / "wav.scp").read_text() == "r1 /w/r1.wav\nr2 /w/r2.wav\n"
    assert DataDir(d).validate() == []


def test_fix_data_dir_extra_files(tmp_path: Path) -> None:
    d = write_dir(
        tmp_path / "d", utt2spk="a-1 a\nb-1 b\n", wav_scp="a-1 x\n", utt2age="b-1 30\na-1 20\n", spk2acc="b x\na y\n"
    )
    fix_data_dir(d, utt_extra_files=["utt2age"], spk_extra_files=["spk2acc"])
    assert (d / "utt2age").read_text() == "a-1 20\n"
    assert (d / "spk2acc").read_text() == "a y\n"


# --------------------------------------------------------------------------- subset / combine / copy


def test_filter_lines_and_subset_lines() -> None:
    lines = ["a 1\n", "b 2\n", "c 3\n"]
    assert filter_lines(lines, {"a", "c"}) == ["a 1\n", "c 3\n"]
    assert filter_lines(lines, {"a", "c"}, exclude=True) == ["b 2\n"]
    assert filter_lines(["x a\n", "y b\n"], {"b"}, field_no=2) == ["y b\n"]
    ten = [f"u{i}\n" for i in range(10)]
    assert subset_lines(ten, 3) == ["u4\n", "u6\n", "u9\n"]  # Kaldi's subset_scp.pl 3 (checked with perl)
    assert subset_lines(ten, 2, "first") == ["u0\n", "u1\n"]
    assert subset_lines(ten, 2, "last") == ["u8\n", "u9\n"]
    with pytest.raises(ValueError):
        subset_lines(ten, 11)


def test_perl_random_matches_perl_drand48() -> None:
    # perl -e 'srand(0); print rand(), "\n" for 1..3'
    r = PerlRandom(0)
    assert [f"{r.rand():.15g}" for _ in range(3)] == ["0.17082803610629", "0.749901980484964", "0.0963716556235674"]


def test_subset_modes(tmp_path: Path) -> None:
    src = write_dir(
        tmp_path / "src",
        utt2spk="".join(f"s{s}-{u} s{s}\n" for s in range(3) for u in range(4)),
        spk2utt="".join(f"s{s} " + " ".join(f"s{s}-{u}" for u in range(4)) + "\n" for s in range(3)),
        wav_scp="".join(f"s{s}-{u} /w/{s}{u}.wav\n" for s in range(3) for u in range(4)),
        spk2gender="s0 m\ns1 f\ns2 m\n",
    )
    assert subset_data_dir(src, tmp_path / "first", num_utt=5, mode="first") == 5
    assert (tmp_path / "first" / "spk2gender").read_text() == "s0 m\ns1 f\n"
    assert subset_data_dir(src, tmp_path / "per", num_utt=2, mode="per_spk") == 6
    # Kaldi's awk leaves a space before the newline; the picks are spread (every 2nd)
    assert (tmp_path / "per" / "spk2utt").read_text().splitlines()[0] == "s0 s0-0 s0-2 "
    (tmp_path / "spks").write_text("s2\ns0\n")
    subset_data_dir(src, tmp_path / "sl", spk_list=tmp_path / "spks")
    assert DataDir(tmp_path / "sl").spks() == ["s0", "s2"]
    (tmp_path / "utts").write_text("s1-3\ns0-1 anything\n")
    subset_data_dir(src, tmp_path / "ul", utt_list=tmp_path / "utts")
    assert (tmp_path / "ul" / "wav.scp").read_text() == "s0-1 /w/01.wav\ns1-3 /w/13.wav\n"
    assert DataDir(tmp_path / "ul").validate() == []
    with pytest.raises(InputError, match="only 12"):
        subset_data_dir(src, tmp_path / "x", num_utt=13)


DUP_CASES = [
    # (file, content with a repeated key, line of the repeat)
    ("wav.scp", "a-1 /w/a1.wav\na-2 /w/a2.wav\na-2 /w/a2-again.wav\nb-1 /w/b1.wav\n", 3),
    ("utt2spk", "a-1 a\na-2 a\na-2 a\nb-1 b\n", 3),
    ("utt2dur", "a-1 1.5\na-1 1.5\na-2 2\nb-1 0.75\n", 2),
    ("spk2utt", "a a-1 a-2\nb b-1\nb b-1\n", 3),
    ("spk2gender", "a m\nb f\nb m\n", 3),
]


@pytest.mark.parametrize(
    "name,content,line,mode",
    [
        (*case, mode)
        for case in DUP_CASES
        for mode in ("first", "spread", "per_spk", "utt_list", "spk_list", "copy")
        # these modes do not read spk2utt: they rebuild it from utt2spk, as Kaldi's script does
        if not (case[0] == "spk2utt" and mode in ("first", "spread", "utt_list"))
    ],
)
def test_subset_and_copy_stop_on_a_duplicate_key(tmp_path: Path, name: str, content: str, line: int, mode: str) -> None:
    """Kaldi's subset_data_dir.sh and copy_data_dir.sh copy a repeated key; here they stop, naming
    file and line, and write nothing."""
    src = good_dir(tmp_path / "src")
    write_dir(src, spk2gender="a m\nb f\n")
    (src / name).write_text(content)
    dest = write_dir(tmp_path / "dest", keep="untouched\n")
    (tmp_path / "list").write_text("a\nb\n" if mode == "spk_list" else "a-1\nb-1\n")
    before = snapshot(dest)
    with pytest.raises(InputError) as e:
        if mode == "copy":
            copy_data_dir(src, dest, utt_prefix="v-")
        elif mode == "utt_list":
            subset_data_dir(src, dest, utt_list=tmp_path / "list")
        elif mode == "spk_list":
            subset_data_dir(src, dest, spk_list=tmp_path / "list")
        else:
            subset_data_dir(src, dest, num_utt=2 if mode != "per_spk" else 1, mode=mode)
    assert e.value.path == str(src / name) and e.value.line == line, str(e.value)
    assert "duplicate key" in str(e.value) or "listed twice" in str(e.value)
    assert snapshot(dest) == before


def test_subset_stops_on_an_utterance_under_two_speakers(tmp_path: Path) -> None:
    src = good_dir(tmp_path / "src")
    (src / "spk2utt").write_text("a a-1 a-2\nb a-2 b-1\n")
    with pytest.raises(InputError, match=r"utterance 'a-2' listed twice \(first on line 1\)") as e:
        subset_data_dir(src, tmp_path / "dest", num_utt=1, mode="per_spk")
    assert e.value.line == 2 and not (tmp_path / "dest").exists()


def test_combine_and_copy(tmp_path: Path) -> None:
    a = write_dir(
        tmp_path / "a",
        utt2spk="a-1 a\na-2 a\n",
        spk2utt="a a-1 a-2\n",
        wav_scp="a-1 x\na-2 y\n",
        utt2dur="a-1 1\na-2 2\n",
    )
    b = write_dir(tmp_path / "b", utt2spk="b-1 b\n", spk2utt="b b-1\n", wav_scp="b-1 z\n")
    dest = tmp_path / "ab"
    write_dir(dest, stale="old")
    msgs: list[str] = []
    combine_data(dest, [b, a], log=msgs.append)
    assert (dest / "utt2spk").read_text() == "a-1 a\na-2 a\nb-1 b\n"
    assert (dest / "wav.scp").read_text() == "a-1 x\na-2 y\nb-1 z\n"
    assert not (dest / "utt2dur").exists() and not (dest / "stale").exists()
    assert any("not combining utt2dur" in m for m in msgs)
    with pytest.raises(InputError, match="also a source"):
        combine_data(a, [a, b])
    assert (a / "utt2spk").read_text() == "a-1 a\na-2 a\n"

    flags = copy_data_dir(dest, tmp_path / "c", utt_prefix="x-", spk_prefix="x-")
    assert flags == ["--no-feats", "--no-text"]
    c = tmp_path / "c"
    assert (c / "utt2spk").read_text() == "x-a-1 x-a\nx-a-2 x-a\nx-b-1 x-b\n"
    # Kaldi writes utt2uniq, then moves it to .backup because the source has none: same here.
    assert (c / ".backup" / "utt2uniq").read_text() == "x-a-1 a-1\nx-a-2 a-2\nx-b-1 b-1\n"
    assert DataDir(c).validate() == []
    (dest / "utt2dur").write_text("a-1 1\nq-1 2\n")
    with pytest.raises(InputError, match=r"utt2dur:2: 'q-1' is not in"):
        copy_data_dir(dest, tmp_path / "c2")


def test_combine_source_without_final_newline(tmp_path: Path) -> None:
    """Kaldi's ``cat`` would glue 'a-2 a' to 'b-1 b'; each source line stays a line here."""
    a = write_dir(tmp_path / "a", utt2spk="a-1 a\na-2 a", wav_scp="a-1 x\na-2 y")
    b = write_dir(tmp_path / "b", utt2spk="b-1 b\n", wav_scp="b-1 z\n")
    combine_data(tmp_path / "ab", [a, b])
    assert (tmp_path / "ab" / "utt2spk").read_text() == "a-1 a\na-2 a\nb-1 b\n"
    assert (tmp_path / "ab" / "spk2utt").read_text() == "a a-1 a-2\nb b-1\n"
