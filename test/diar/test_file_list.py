"""Diarization of a list of files (``python -m spkflow.bin.diarize``, ``Embedder.diarize``): every
input checked before anything is written, recording ids that stay one RTTM field, a user's RTTMs
never replaced and a rerun resumed, given speech inside its recording, and the window options;
with a tiny model that has a scoring (random weights: these check the route, not the accuracy)."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import soundfile as sf

from helpers.diar import write_tone_speech
from spkflow import Embedder
from spkflow.bin import diarize as diarize_cmd
from spkflow.core.errors import InputError, UtteranceError
from spkflow.diar.file_list import MARKER
from spkflow.diar.rttm import read_rttm


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    d = tmp_path_factory.mktemp("voices")
    return [write_tone_speech(d / f"v{i}.wav", 4.0, seed=i) for i in range(2)]


def run(model, out, *args) -> int:
    """The command; ``--speech energy`` unless the test gives another (silero, the default, rightly
    finds no speech in the synthetic voices of these tests)."""
    return diarize_cmd.main(["--model", str(model), "--out", str(out), "--speech", "energy", *map(str, args)])


def inodes(*paths):
    return [p.stat().st_ino for p in paths]


def test_a_users_rttm_is_never_replaced_and_a_rerun_resumes(model, voices, tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    mine, other = out / "v0.rttm", out / "v1.rttm"
    mine.write_text("my own notes\n")
    (out / "notes.txt").write_text("untouched\n")
    assert run(model, out, *voices) == 1
    assert f"{out}: holds v0.rttm, not written by spkflow" in caplog.text and "--overwrite true" in caplog.text
    assert mine.read_text() == "my own notes\n" and not other.exists()  # refused before any work
    assert run(model, out, "--overwrite", "true", *voices) == 0
    assert read_rttm(mine).turns and read_rttm(other).turns
    assert (out / "notes.txt").read_text() == "untouched\n"  # the user's other files: never looked at
    first = inodes(mine, other)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert run(model, out, *voices) == 0  # spkflow's own, same model, options and files: kept
    assert "2 of 2 RTTMs kept" in caplog.text and inodes(mine, other) == first
    # a run killed after v0 (v1 entered, not finished): the rerun redoes v1 only
    marker = out / MARKER
    marker.write_text(marker.read_text().replace(marker.read_text().split("v1.rttm ")[1].split()[0], "-"))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert run(model, out, *voices) == 0
    assert "1 of 2 RTTMs kept" in caplog.text
    now = inodes(mine, other)
    assert now[0] == first[0] and now[1] != first[1]
    assert run(model, out, "--num-speakers", "2", *voices) == 0  # other options: redone, not kept
    assert inodes(mine, other)[0] != first[0]
    assert {len({t.speaker for t in read_rttm(p).turns}) for p in (mine, other)} == {2}


def test_recording_ids_stay_one_rttm_field(model, voices, tmp_path, caplog):
    spaced = tmp_path / "my meeting.wav"
    shutil.copy(voices[0], spaced)
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO):
        assert run(model, out, spaced) == 0
    assert f"{spaced}: recording id 'my_meeting'" in caplog.text
    lines = (out / "my_meeting.rttm").read_text().splitlines()
    assert lines and all(len(ln.split()) == 10 and ln.split()[1] == "my_meeting" for ln in lines)
    assert {t.recording for t in Embedder.from_pretrained(model).diarize(spaced, speech="energy")} == {"my_meeting"}
    twin = tmp_path / "my_meeting.wav"  # another file, the same id: refused before any work
    shutil.copy(voices[1], twin)
    assert run(model, tmp_path / "o2", spaced, twin) == 1
    assert f"{twin}: same recording id 'my_meeting' as {spaced}" in caplog.text
    assert not (tmp_path / "o2").exists()


def test_every_input_is_checked_before_anything_is_written(model, voices, tmp_path, caplog, monkeypatch):
    out = tmp_path / "out"
    (tmp_path / "folder.wav").mkdir()
    (tmp_path / "text.wav").write_text("not audio\n")
    for bad, says in (
        (tmp_path / "missing.wav", f"({tmp_path / 'missing.wav'}): audio file not found"),
        (tmp_path / "folder.wav", f"({tmp_path / 'folder.wav'}): is a directory, not an audio file"),
        (tmp_path / "text.wav", "cannot read audio header"),
    ):
        caplog.clear()
        assert run(model, out, voices[0], bad) == 1  # the good file first: still nothing written
        assert says in caplog.text and not out.exists()
    a_file = tmp_path / "out.txt"
    a_file.write_text("x\n")
    assert run(model, a_file, voices[0]) == 1
    assert f"{a_file}: exists and is a file, not a folder" in caplog.text and a_file.read_text() == "x\n"
    monkeypatch.chdir(tmp_path)  # a path is a path: never run as a command
    assert run(model, out, "touch pwned |") == 1 and not (tmp_path / "pwned").exists() and not out.exists()
    with pytest.raises(UtteranceError, match=r"missing.wav\): audio file not found"):
        Embedder.from_pretrained(model).diarize(tmp_path / "missing.wav")


def test_given_speech_past_the_end_is_named_by_file_and_line(model, voices, tmp_path, caplog):
    dur = sf.info(str(voices[0])).duration
    speech = tmp_path / "speech.rttm"
    speech.write_text(
        f"SPEAKER v0 1 0.000 {dur + 0.3:.3f} <NA> <NA> A <NA> <NA>\n"  # 0.3 s past the end: cut there
        "SPEAKER v1 1 1.000 5.000 <NA> <NA> B <NA> <NA>\n"  # ends at 6 s: an error
    )
    out = tmp_path / "out"
    assert run(model, out, "--speech", speech, *voices) == 1
    assert f"{speech}:2: turn ends at 6.000 s, after the end of 'v1' ({dur:.3f} s)" in caplog.text
    assert not out.exists()
    assert run(model, out, "--speech", speech, voices[0]) == 0
    assert max(t.end for t in read_rttm(out / "v0.rttm").turns) == pytest.approx(dur, abs=1e-3)
    emb = Embedder.from_pretrained(model)
    with pytest.raises(InputError, match=rf"v0.wav: speech region 2 ends at 9.000 s, after the end \({dur:.3f} s\)"):
        emb.diarize(voices[0], speech=[(0.0, 1.0), (2.0, 9.0)])
    assert max(t.end for t in emb.diarize(voices[0], speech=[(0.0, dur + 0.2)])) == pytest.approx(dur)


def test_window_and_shift_reach_the_windows(model, voices, tmp_path, caplog):
    """One speech region of 2.5 s: 1.5 s windows every 0.75 s make three, so two speakers can be
    forced; a 3 s window makes one, and two speakers asked of one window is said."""
    speech = tmp_path / "speech.rttm"
    speech.write_text("SPEAKER v0 1 0.000 2.500 <NA> <NA> A <NA> <NA>\n")
    args = ["--speech", speech, "--num-speakers", "2", "--method", "ahc", voices[0]]
    assert run(model, tmp_path / "a", *args) == 0
    assert len({t.speaker for t in read_rttm(tmp_path / "a" / "v0.rttm").turns}) == 2
    caplog.clear()
    assert run(model, tmp_path / "b", "--window", "3", "--shift", "1.5", *args) == 0
    assert len({t.speaker for t in read_rttm(tmp_path / "b" / "v0.rttm").turns}) == 1
    assert "v0: 2 speakers asked, 1 found: it has 1 windows of at most 2.50 s" in caplog.text
    assert run(model, tmp_path / "c", "--window", "1", "--shift", "2", *args) == 1
    assert "0 < shift <= window" in caplog.text and not (tmp_path / "c").exists()
    got = Embedder.from_pretrained(model).diarize(voices[0], speech=[(0.0, 2.5)], num_speakers=2, window=3, shift=1.5)
    assert len({t.speaker for t in got}) == 1


def test_a_gallery_names_the_speakers_in_the_rttm(model, voices, tmp_path, caplog):
    """The route of ``--gallery`` (the naming itself, right and wrong, is test_naming.py's): the
    RTTM's speaker field carries enrolled names or ``unknown_<k>``, never one twice; the gallery
    enters the fingerprint; one made with another model, or a model without calibration, is refused."""
    from helpers.audio import make_speakers
    from helpers.models import make_spkflow_model_dir
    from spkflow.bin import identify
    from spkflow.deploy.gallery import Gallery

    enrol = make_speakers(tmp_path / "enrol", num_spk=3, num_utt=2, seed=4, min_sec=2.5, max_sec=3.5)
    gallery = tmp_path / "team.npz"
    assert (
        identify.main(["--model", str(model), "--enrol", str(enrol), "--save", str(gallery), "--progress", "false"])
        == 0
    )
    enrolled = set(Gallery.load(gallery).speakers)
    out = tmp_path / "out"
    args = ["--num-speakers", "2", "--method", "ahc", *voices]
    assert run(model, out, *args) == 0
    plain = {p.name: p.stat().st_ino for p in out.glob("*.rttm")}
    assert run(model, out, "--gallery", gallery, *args) == 0
    for p in out.glob("*.rttm"):
        assert p.stat().st_ino != plain[p.name]  # the gallery is in the fingerprint: redone, not kept
        spk = {t.speaker for t in read_rttm(p).turns}
        assert len(spk) == 2 and all(s in enrolled or s.startswith("unknown_") for s in spk)
    got = Embedder.from_pretrained(model).diarize(
        voices[0], speech="energy", num_speakers=2, method="ahc", gallery=gallery
    )
    assert set(got.speakers) == {t.speaker for t in read_rttm(out / "v0.rttm").turns}  # the API: the same names
    other = tmp_path / "other.npz"
    g = Gallery.load(gallery)
    Gallery("toolkit=spkflow another-model", g.utts, g.speakers, g.emb, g.speech).save(other)
    caplog.clear()
    assert run(model, tmp_path / "o2", "--gallery", other, *voices) == 1
    assert f"{other}: made with another model" in caplog.text and not (tmp_path / "o2").exists()
    plain_model = make_spkflow_model_dir(tmp_path / "plain")
    plain_gallery = tmp_path / "plain.npz"
    assert identify.main(["--model", str(plain_model), "--enrol", str(enrol), "--save", str(plain_gallery)]) == 0
    caplog.clear()
    assert run(plain_model, tmp_path / "o3", "--gallery", plain_gallery, *voices) == 1
    assert "needs the model's calibration" in caplog.text and not (tmp_path / "o3").exists()


def test_plots_of_the_hypothesis_or_against_the_reference(model, voices, tmp_path, caplog):
    from matplotlib.image import imread

    speech = tmp_path / "speech.rttm"
    speech.write_text(
        "SPEAKER v0 1 0.100 1.800 <NA> <NA> A <NA> <NA>\nSPEAKER v0 1 2.000 1.900 <NA> <NA> B <NA> <NA>\n"
    )
    assert run(model, tmp_path / "a", "--plot", tmp_path / "pa", "--num-speakers", "2", voices[0]) == 0
    assert (
        run(model, tmp_path / "b", "--plot", tmp_path / "b", "--speech", speech, "--num-speakers", "2", voices[0]) == 0
    )
    alone, against = imread(tmp_path / "pa" / "v0.png"), imread(tmp_path / "b" / "v0.png")
    assert against.shape[0] > alone.shape[0] > 0  # two panels (the reference's two rows) against one
    assert (tmp_path / "b" / "v0.rttm").is_file()  # the plots beside the RTTMs: one marker, one lock
    (tmp_path / "pc").mkdir()
    (tmp_path / "pc" / "v0.png").write_bytes(b"my picture")
    caplog.clear()
    assert run(model, tmp_path / "c", "--plot", tmp_path / "pc", voices[0]) == 1
    assert "holds v0.png, not written by spkflow" in caplog.text and not (tmp_path / "c").exists()
    assert (tmp_path / "pc" / "v0.png").read_bytes() == b"my picture"


def test_progress_bars_and_a_quiet_run(model, tmp_path, capfd):
    """A recording of a minute or more gets bars over its speech detection and its windows (and a
    log line when written); with ``--progress false`` standard output holds the RTTM paths alone
    and standard error nothing (a separate process: the logging setup is the command's)."""
    import subprocess
    import sys

    from helpers.paths import ROOT

    long = write_tone_speech(tmp_path / "long.wav", 70.0, seed=3)
    capfd.readouterr()
    assert run(model, tmp_path / "a", "--progress", "true", long) == 0
    got = capfd.readouterr()
    assert "long: speech" in got.err and "long: windows" in got.err and "/93" in got.err  # 93 windows
    assert got.out.splitlines() == [str(tmp_path / "a" / "long.rttm")]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "spkflow.bin.diarize", "--model", str(model), "--out", str(tmp_path / "b"), "--speech"]
    cmd.append("energy")
    p = subprocess.run([*cmd, "--progress", "false", str(long)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.splitlines() == [str(tmp_path / "b" / "long.rttm")]
    assert p.stderr == ""
    p = subprocess.run([*cmd, str(long)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "long.rttm: 1 speakers" in p.stderr and "kept (an earlier run)" in p.stderr
