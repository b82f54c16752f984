"""Your own recordings -> a Kaldi data dir (spkflow.corpora.folder, python -m spkflow.bin.make_data_dir):
audio written here in every format the command takes (wav, flac, ogg, mp3 through libsndfile; m4a
through the pinned ffmpeg), and the shipped LibriSpeech copy when db.sh finds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.audio import synth_voice
from helpers.recipes import run
from spkflow.core.errors import InputError
from spkflow.corpora.folder import collect_folder
from spkflow.data.datadir import DataDir

PY = sys.executable


def voice(seed: int, seconds: float = 1.0, rate: int = 16000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return synth_voice(rng, 100 + 20 * seed, (500.0, 1500.0, 2500.0), seconds, rate)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """alice/ (wav, flac, ogg at 16 kHz, one 8 kHz wav), bob/ (mp3, a name clash in two
    subfolders), carol/ (m4a through ffmpeg), and a loose file at the top."""
    root = tmp_path / "my recordings"
    (root / "alice").mkdir(parents=True)
    sf.write(root / "alice" / "hello.wav", voice(0), 16000, subtype="PCM_16")
    sf.write(root / "alice" / "second take.flac", voice(1, 1.5), 16000)
    sf.write(root / "alice" / "third.ogg", voice(2), 16000, format="OGG", subtype="VORBIS")
    sf.write(root / "alice" / "phone.wav", voice(3, 2.0, 8000), 8000, subtype="PCM_16")
    for day in ("mon", "tue"):
        (root / "bob" / day).mkdir(parents=True)
        sf.write(root / "bob" / day / "take.mp3", voice(4), 16000, format="MP3", subtype="MPEG_LAYER_III")
    (root / "carol").mkdir()
    sf.write(root / "carol" / "src.wav", voice(5, 1.2, 44100), 44100, subtype="PCM_16")
    from spkflow.corpora.voxceleb import default_ffmpeg

    subprocess.run(
        [default_ffmpeg(), "-nostdin", "-v", "error", "-i", root / "carol" / "src.wav", "-c:a", "aac",
         root / "carol" / "note.m4a"],
        check=True,
    )  # fmt: skip
    (root / "carol" / "src.wav").unlink()
    sf.write(root / "loose.wav", voice(6), 16000, subtype="PCM_16")
    (root / "alice" / "notes.txt").write_text("not audio")
    return root


def test_a_folder_becomes_a_valid_data_dir(folder, tmp_path):
    out = tmp_path / "data" / "mine"
    p = run([PY, "-m", "spkflow.bin.make_data_dir", "--trials", "true", folder, out])
    d = DataDir(out)
    d.validate(no_feats=True, no_text=True)
    u2s = d.utt2spk()
    assert u2s == {
        "alice-hello": "alice",
        "alice-phone": "alice",
        "alice-second_take": "alice",
        "alice-third": "alice",
        "bob-mon-take": "bob",
        "bob-tue-take": "bob",
        "carol-note": "carol",
        "loose-loose": "loose",
    }
    wav = d.table("wav.scp")
    assert wav["alice-second_take"] == str(folder / "alice" / "second take.flac")
    assert wav["carol-note"].endswith("-ar 44100 - |") and "note.m4a" in wav["carol-note"]
    dur = d.utt2dur()
    assert dur["alice-second_take"] == pytest.approx(1.5 + 0.4, abs=1e-3)  # synth_voice pads 0.2 s twice
    assert dur["carol-note"] == pytest.approx(1.6, abs=0.05)
    assert (out / "trials").is_file()
    assert "4 speakers, 8 utterances" in p.stderr
    assert "rates: 8000 Hz x 1, 16000 Hz x 6, 44100 Hz x 1" in p.stderr
    assert "WARNING" in p.stderr and "1 file(s) at 8000 Hz, below the model's 16000 Hz" in p.stderr
    assert str(folder / "alice" / "phone.wav") in p.stderr
    assert "1 file(s) without a speaker folder: each is its own speaker" in p.stderr
    # the pipe and the files are readable by the stages: every entry decodes
    from spkflow.data.audio import AudioReader

    reader = AudioReader(out, sample_rate=16000)
    for utt in u2s:
        assert reader.read(utt).shape[0] == pytest.approx(dur[utt] * 16000, abs=400)


def test_speaker_regex_and_a_list(folder, tmp_path):
    regex = r"^(?:bob/)?(?P<spk>[^/]+)/"  # bob's days are his speakers here
    with pytest.raises(InputError, match=r"loose.wav: path 'loose.wav' does not match --speaker-regex"):
        collect_folder(folder, speaker_regex=regex)
    (folder / "loose.wav").unlink()
    data, _ = collect_folder(folder, speaker_regex=regex)
    spk = {u.utt: u.spk for u in data.utterances}
    assert spk["mon-take"] == "mon" and spk["tue-take"] == "tue" and spk["alice-hello"] == "alice"
    data, _ = collect_folder(folder, speaker_regex=r"^(\w)")  # the first group when none is named 'spk'
    assert {u.spk for u in data.utterances} == {"a", "b", "c"}
    lst = tmp_path / "files.txt"
    lst.write_text(f"alice/hello.wav\tann\n{folder / 'alice' / 'second take.flac'}\tann\nbob/mon/take.mp3\n")
    (tmp_path / "alice").symlink_to(folder / "alice")
    (tmp_path / "bob").symlink_to(folder / "bob")
    data, _ = collect_folder(list_file=lst)
    assert sorted((u.utt, u.spk) for u in data.utterances) == [
        ("ann-hello", "ann"),
        ("ann-second_take", "ann"),
        ("take-take", "take"),
    ]
    lst.write_text("a b c\n")
    p = run([PY, "-m", "spkflow.bin.make_data_dir", "--list", lst, tmp_path / "d"], check=False)
    assert p.returncode == 1 and f"{lst}:1: expected 'path [speaker]'" in p.stderr


def test_bad_files_are_named_or_left_out(folder, tmp_path):
    bad = folder / "alice" / "cut.wav"
    sf.write(bad, voice(7), 16000, subtype="PCM_16")
    bad.write_bytes(bad.read_bytes()[:-2000])  # an interrupted copy: shorter than its header says
    (folder / "bob" / "empty.flac").write_bytes(b"")
    out = tmp_path / "data"
    p = run([PY, "-m", "spkflow.bin.make_data_dir", folder, out], check=False)
    assert p.returncode == 1 and not out.exists()
    assert str(bad) in p.stderr or str(folder / "bob" / "empty.flac") in p.stderr
    p = run([PY, "-m", "spkflow.bin.make_data_dir", "--skip-bad", "true", folder, out])
    left = (out / "bad_files").read_text()
    assert str(bad) in left and "truncated" in left and str(folder / "bob" / "empty.flac") in left
    assert "2 unreadable file(s) left out" in p.stderr and len(DataDir(out).utt2spk()) == 8
    # two files that would get one id
    (folder / "dave").mkdir()
    sf.write(folder / "dave" / "a b.wav", voice(8), 16000)
    sf.write(folder / "dave" / "a_b.flac", voice(9), 16000)
    with pytest.raises(InputError, match=r"a_b.flac: utterance id '.*a_b' also made for .*a b.wav: rename one"):
        collect_folder(folder, skip_bad=True)
    p = run([PY, "-m", "spkflow.bin.make_data_dir", tmp_path / "nowhere", out], check=False)
    assert p.returncode == 1 and "nowhere: not a folder" in p.stderr


def test_the_model_rate_comes_from_the_model(folder, tmp_path):
    from helpers.models import make_spkflow_model_dir

    model = make_spkflow_model_dir(tmp_path / "model")
    p = run([PY, "-m", "spkflow.bin.make_data_dir", "--model", model, folder, tmp_path / "d"])
    assert "below the model's 16000 Hz" in p.stderr
    p = run([PY, "-m", "spkflow.bin.make_data_dir", "--rate", 8000, folder, tmp_path / "d2"])
    assert "below the model's" not in p.stderr


def test_librispeech_folder(corpus, tmp_path):
    """The issue's case: LibriSpeech FLACs, a folder per speaker below each subset."""
    libri = corpus("LIBRISPEECH")
    out = tmp_path / "libri"
    run([PY, "-m", "spkflow.bin.make_data_dir", "--speaker-regex", r"^[^/]+/(?P<spk>[^/]+)/", "--trials", "true",
         libri, out])  # fmt: skip
    d = DataDir(out)
    u2s = d.utt2spk()
    assert len(u2s) == sum(1 for _ in libri.rglob("*.flac")) and all(u.startswith(s + "-") for u, s in u2s.items())
    assert len(set(u2s.values())) == len({p.parent.parent.name for p in libri.rglob("*.flac")})
    ref = tmp_path / "ref"
    run([PY, "-m", "spkflow.bin.prepare_corpus", "librispeech", "--trials", "true", libri, ref])
    assert (out / "trials").read_text() == (ref / "trials").read_text()  # the corpus front end's ids and trials


def test_a_name_that_is_not_utf8_is_named_for_what_it_is(tmp_path):
    """A Latin-1 file name or speaker folder: its header is read (libsndfile was handed UTF-8 and
    "cannot read the audio header" blamed the file), and the file is refused for its name, which
    utterance and speaker ids are made of (they must be UTF-8), shown as \\xNN."""
    import os

    root = tmp_path / "rec"
    (root / "ann").mkdir(parents=True)
    sf.write(root / "ann" / "fine.wav", voice(0), 16000)
    sf.write(bytes(root) + b"/ann/caf\xe9.wav", voice(1), 16000)
    os.mkdir(bytes(root) + b"/jos\xe9")
    sf.write(bytes(root) + b"/jos\xe9/a.wav", voice(2), 16000)
    p = run([PY, "-m", "spkflow.bin.make_data_dir", root, tmp_path / "d"], check=False)
    assert p.returncode == 1 and "header" not in p.stderr
    assert "ann/caf\\xe9.wav: its file name is not UTF-8 text" in p.stderr
    assert "jos\\xe9/a.wav: its speaker (jos\\xe9) is not UTF-8 text" in p.stderr
    data, report = collect_folder(root, skip_bad=True)
    assert [u.utt for u in data.utterances] == ["ann-fine"] and len(report.bad) == 2
