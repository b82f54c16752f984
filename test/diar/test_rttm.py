"""RTTM / UEM files and recording dirs: round trips, and every bad line named by file, line and field."""

from __future__ import annotations

import pytest
import soundfile as sf

from spkflow.core.errors import InputError
from spkflow.diar.recordings import load_recordings, write_recordings
from spkflow.diar.regions import intersect, merge_gaps, total, union
from spkflow.diar.rttm import Turn, read_rttm, read_uem, safe_id, write_rttm, write_uem


def test_rttm_round_trip_keeps_utf8_ids_and_sorts(tmp_path):
    turns = [Turn("r2", 1.0, 2.5, "MÉO069"), Turn("r1", 3.25, 4.0, "B"), Turn("r1", 0.5, 1.0, "A")]
    write_rttm(tmp_path / "x.rttm", turns)
    back = read_rttm(tmp_path / "x.rttm")
    assert back.turns == sorted(turns, key=lambda t: (t.recording, t.start))
    assert back.lines == [1, 2, 3]
    assert (tmp_path / "x.rttm").read_text(encoding="utf-8").splitlines()[0] == (
        "SPEAKER r1 1 0.500 0.500 <NA> <NA> A <NA> <NA>"
    )


@pytest.mark.parametrize(
    "line, where",
    [
        ("SPEAKER r1 1 0.5 -1 <NA> <NA> A <NA> <NA>", "x.rttm:2: field 5 (duration)"),
        ("SPEAKER r1 1 abc 1 <NA> <NA> A <NA> <NA>", "x.rttm:2: field 4 (onset)"),
        ("SPEAKER r1 1 0.5 1 <NA>", "x.rttm:2: expected 10 fields"),
        ("SPEEKER r1 1 0.5 1 <NA> <NA> A <NA> <NA>", "x.rttm:2: field 1 (type)"),
    ],
)
def test_bad_rttm_line_is_named(tmp_path, line, where):
    (tmp_path / "x.rttm").write_text(f"SPEAKER r1 1 0 1 <NA> <NA> A <NA> <NA>\n{line}\n")
    with pytest.raises(InputError) as e:
        read_rttm(tmp_path / "x.rttm")
    assert str(e.value).startswith(str(tmp_path / where))
    assert "\n" not in str(e.value)


def test_nine_field_lines_are_the_same_turn_and_other_counts_are_named(tmp_path):
    """ESPnet's diarization recipes write (and read) 9 fields, md-eval and pyannote 10: both give
    the same turn; 8 or 11 fields (a name with a space) are an error naming the count."""
    (tmp_path / "x.rttm").write_text("SPEAKER r1 1 1 2 <NA> <NA> A <NA>\nSPEAKER r1 1 4 1 <NA> <NA> B <NA> <NA>\n")
    assert read_rttm(tmp_path / "x.rttm").turns == [Turn("r1", 1.0, 3.0, "A"), Turn("r1", 4.0, 5.0, "B")]
    for line, n in (("SPEAKER r1 1 1 2 <NA> <NA> A", 8), ("SPEAKER my meeting 1 1 2 <NA> <NA> A <NA> <NA>", 11)):
        (tmp_path / "y.rttm").write_text(line + "\n")
        with pytest.raises(InputError, match=rf"y.rttm:1: expected 10 fields .*, got {n}$"):
            read_rttm(tmp_path / "y.rttm")


def test_ids_with_whitespace_are_refused_before_writing(tmp_path):
    assert safe_id("my  meeting\t2") == "my_meeting_2" and safe_id(" ") == "_" and safe_id("MÉO069") == "MÉO069"
    for bad in (Turn("my meeting", 0.0, 1.0, "A"), Turn("r", 0.0, 1.0, "Jane Doe"), Turn("r", 0.0, 1.0, "")):
        with pytest.raises(ValueError, match="holds whitespace"):
            write_rttm(tmp_path / "x.rttm", [Turn("ok", 0.0, 1.0, "A"), bad])
        assert not (tmp_path / "x.rttm").exists()


def test_other_types_and_zero_turns_are_skipped(tmp_path):
    (tmp_path / "x.rttm").write_text(
        ";; comment\nSPKR-INFO r1 1 <NA> <NA> <NA> unknown A <NA> <NA>\n"
        "SPEAKER r1 1 0 0 <NA> <NA> A <NA> <NA>\nSPEAKER r1 1 1 2 <NA> <NA> A <NA>\n"
    )
    r = read_rttm(tmp_path / "x.rttm")
    assert r.turns == [Turn("r1", 1.0, 3.0, "A")] and r.dropped == 1 and r.lines == [4]


def test_uem_round_trip_and_errors(tmp_path):
    write_uem(tmp_path / "u", {"b": [(0.0, 5.0)], "a": [(1.0, 2.0), (3.0, 4.0)]})
    assert read_uem(tmp_path / "u") == {"a": [(1.0, 2.0), (3.0, 4.0)], "b": [(0.0, 5.0)]}
    (tmp_path / "bad").write_text("a 1 2.0 1.0\n")
    with pytest.raises(InputError, match=r"bad:1: field 4 \(end\)"):
        read_uem(tmp_path / "bad")


def test_regions():
    assert union([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]) == [(0, 2.5), (3, 4)]
    assert intersect([(0, 2), (3, 5)], [(1, 4)]) == [(1, 2), (3, 4)]
    assert merge_gaps([(0, 1), (1.1, 2), (5, 5.1)], min_gap=0.2, min_len=0.5) == [(0, 2)]
    assert total([(0, 1), (0.5, 2)]) == 2


def _recording_dir(tmp_path, rttm: str):
    audio = tmp_path / "a.wav"
    sf.write(audio, [0.0] * 16000 * 10, 16000)
    d = write_recordings(tmp_path / "data", {"a": str(audio)}, {"a": 10.0})
    (d / "rttm").write_text(rttm)
    return d


def test_rttm_naming_a_recording_not_in_wav_scp(tmp_path):
    d = _recording_dir(tmp_path, "SPEAKER a 1 0 1 <NA> <NA> A <NA> <NA>\nSPEAKER zz 1 0 1 <NA> <NA> A <NA> <NA>\n")
    with pytest.raises(InputError) as e:
        load_recordings(d)
    assert str(e.value) == f"{d / 'rttm'}:2: recording 'zz' is not in {d / 'wav.scp'}"


def test_overlapping_reference_turns(tmp_path):
    """Two speakers overlapping: kept (overlapped speech); one speaker overlapping itself: merged, said."""
    d = _recording_dir(
        tmp_path,
        "SPEAKER a 1 0 2 <NA> <NA> A <NA> <NA>\nSPEAKER a 1 1 2 <NA> <NA> B <NA> <NA>\n"
        "SPEAKER a 1 1.5 2 <NA> <NA> A <NA> <NA>\n",
    )
    rs = load_recordings(d)
    assert rs.turns["a"] == [Turn("a", 0.0, 3.5, "A"), Turn("a", 1.0, 3.0, "B")]
    assert rs.notes == [f"{d / 'rttm'}: 1 overlapping turns of one speaker merged"]


def test_turn_past_the_end_of_its_recording(tmp_path):
    d = _recording_dir(tmp_path, "SPEAKER a 1 9 1.4 <NA> <NA> A <NA> <NA>\nSPEAKER a 1 9 3 <NA> <NA> A <NA> <NA>\n")
    with pytest.raises(InputError, match=r"rttm:2: turn ends at 12.000 s, after the end of 'a' \(10.000 s\)"):
        load_recordings(d)
