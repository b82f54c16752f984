"""What ``Embedder.diarize`` returns (:class:`spkflow.diar.result.Diarization`): turns on 10 ms
frames, an RTTM written atomically that never replaces a file spkflow did not write and reads
back equal, a pyannote.core Annotation, and iteration over turns for older callers."""

from __future__ import annotations

import os

import pytest

from spkflow.core.errors import InputError
from spkflow.diar.result import Diarization
from spkflow.diar.rttm import Turn, read_rttm
from spkflow.diar.written import MARKER

NOISY = [
    Turn("meet", 2.2600000000000002, 5.1000000000000005, "spk2"),
    Turn("meet", 0.10499999, 2.2600000000000002, "spk1"),
    Turn("meet", 5.1000000000000005, 5.103, "spk1"),  # 3 ms: empty on the 10 ms frame, dropped
    Turn("meet", 5.2, 7.004999, "spk1"),
]


def test_turns_are_on_the_frame_sorted_and_read_back_equal(tmp_path):
    d = Diarization.of("meet", NOISY)
    assert [(t.start, t.end, t.speaker) for t in d] == [(0.1, 2.26, "spk1"), (2.26, 5.1, "spk2"), (5.2, 7.0, "spk1")]
    assert all(v == float(f"{v:.2f}") for t in d for v in (t.start, t.end))  # 2.26 itself, not 2.2600000000000002
    assert d.speakers == ["spk1", "spk2"] and len(d) == 3 and d[0].speaker == "spk1" and d.speech == pytest.approx(6.8)
    out = d.to_rttm(tmp_path / "meet.rttm")
    assert Diarization.from_rttm(out) == d  # the RTTM reader gives the same object back
    assert [ln.split()[3:5] for ln in out.read_text().splitlines()] == [["0.100", "2.160"], ["2.260", "2.840"],
                                                                       ["5.200", "1.800"]]  # fmt: skip
    assert len(read_rttm(out).turns) == 3


def test_to_rttm_never_replaces_a_file_spkflow_did_not_write(tmp_path):
    d = Diarization.of("meet", NOISY)
    mine = tmp_path / "meet.rttm"
    mine.write_text("my notes\n")
    with pytest.raises(InputError, match=r"holds meet.rttm, not written by spkflow"):
        d.to_rttm(mine)
    assert mine.read_text() == "my notes\n"
    d.to_rttm(mine, overwrite=True)
    assert Diarization.from_rttm(mine) == d
    first = mine.stat().st_ino
    other = Diarization.of("meet", [Turn("meet", 0.0, 1.0, "A")])
    other.to_rttm(mine)  # spkflow's own now (in the folder's marker): replaced, atomically (a new inode)
    assert Diarization.from_rttm(mine) == other and mine.stat().st_ino != first
    assert "meet.rttm" in (tmp_path / MARKER).read_text()
    assert sorted(os.listdir(tmp_path)) == [MARKER, "meet.rttm"]  # no temporary or lock left behind
    (tmp_path / "folder.rttm").mkdir()
    with pytest.raises(InputError, match="folder.rttm: is a folder"):
        d.to_rttm(tmp_path / "folder.rttm")


def test_to_annotation_is_pyannotes(tmp_path):
    from pyannote.core import Annotation, Segment

    d = Diarization.of("meet", NOISY)
    ann = d.to_annotation()
    assert isinstance(ann, Annotation) and ann.uri == "meet"
    assert sorted(ann.labels()) == ["spk1", "spk2"]
    assert [(s.start, s.end, lab) for s, _, lab in ann.itertracks(yield_label=True)] == [
        (t.start, t.end, t.speaker) for t in d
    ]
    assert ann.label_duration("spk1") == pytest.approx(2.16 + 1.8)
    assert Segment(0.1, 2.26) in ann


def test_ids_that_are_not_one_rttm_field_and_turns_of_another_recording_are_refused():
    with pytest.raises(ValueError, match="speaker id 'Ann Lee' .* not one RTTM field"):
        Diarization.of("meet", [Turn("meet", 0.0, 1.0, "Ann Lee")])
    with pytest.raises(ValueError, match="a turn of recording 'other'"):
        Diarization.of("meet", [Turn("other", 0.0, 1.0, "A")])
