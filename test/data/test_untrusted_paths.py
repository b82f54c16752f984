"""A path a user gives is a path (spkflow.data.audio, "who may run commands"): a name ending in
``|`` or a Kaldi ``file.ark:offset`` typed on a command line, listed in a pairs file or passed to
the API runs nothing and reads nothing else, while a data dir's wav.scp keeps Kaldi's pipes.
Each entry point is run for real (the commands as subprocesses, a tiny model with random
weights); the "command" would create a marker file, and the test checks that it does not exist.
Also: a folder, an unreadable file and a name that is not UTF-8 given as an audio file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.audio import make_speakers, write_data_dir
from helpers.models import make_spkflow_model_dir
from helpers.recipes import run
from spkflow.core.errors import UtteranceError
from spkflow.data.audio import AudioReader, read_audio

PY = sys.executable


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("untrusted")
    data = make_speakers(root / "enrol", num_spk=2, num_utt=2, seed=3)
    wav = sorted((root / "enrol").rglob("*.wav"))
    return {"root": root, "model": make_spkflow_model_dir(root / "model"), "data": data, "a": wav[0], "b": wav[1]}


def command(marker: Path) -> str:
    """A Kaldi pipe entry that would create ``marker`` (and write no audio)."""
    return f"touch {marker} |"


def refused(p: subprocess.CompletedProcess, marker: Path) -> None:
    assert not marker.exists(), "the path was run as a command"
    assert p.returncode == 1, p.stderr[-2000:]
    assert "is not a file" in p.stderr and "only from a data dir's wav.scp" in p.stderr, p.stderr[-2000:]


def test_verify_runs_no_path_given_on_the_command_line(setup, tmp_path):
    marker = tmp_path / "pwned"
    p = run([PY, "-m", "spkflow.bin.verify", "--model", setup["model"], command(marker), setup["a"]], check=False)
    refused(p, marker)


def test_verify_runs_no_path_of_a_pairs_file(setup, tmp_path):
    marker = tmp_path / "pwned"
    pairs = tmp_path / "pairs"
    pairs.write_text(f"{setup['a']}\t{setup['b']}\n{command(marker)}\t{setup['a']}\n")
    p = run([PY, "-m", "spkflow.bin.verify", "--model", setup["model"], "--pairs", pairs], check=False)
    refused(p, marker)
    p = run([PY, "-m", "spkflow.bin.verify", "--model", setup["model"], "--pairs", pairs, "--skip-bad", "true"])
    assert not marker.exists() and "not a file" in p.stderr and len(p.stdout.splitlines()) == 1


def test_identify_runs_no_path_given_on_the_command_line(setup, tmp_path):
    marker = tmp_path / "pwned"
    p = run(
        [PY, "-m", "spkflow.bin.identify", "--model", setup["model"], "--enrol", setup["data"], command(marker)],
        check=False,
    )
    refused(p, marker)


def test_diarize_runs_no_path_given_on_the_command_line(setup, tmp_path):
    marker = tmp_path / "pwned"
    p = run(
        [PY, "-m", "spkflow.bin.diarize", "--model", setup["model"], "--out", tmp_path / "o", command(marker)],
        check=False,
    )
    refused(p, marker)


def test_the_api_runs_no_path(setup, tmp_path):
    from spkflow import Embedder

    emb = Embedder.from_pretrained(setup["model"])
    marker = tmp_path / "pwned"
    calls = {
        "embed_file": lambda: emb.embed_file(command(marker)),
        "embed_files": lambda: emb.embed_files([str(setup["a"]), command(marker)]),
        "verify": lambda: emb.verify(str(setup["a"]), command(marker)),
        "score_matrix": lambda: emb.score_matrix([str(setup["a"]), str(setup["b"]), command(marker)]),
        "diarize": lambda: emb.diarize(command(marker)),
    }
    for name, call in calls.items():
        with pytest.raises(UtteranceError, match="is not a file") as err:
            call()
        assert not marker.exists(), f"{name} ran the path as a command"
        assert "touch" in str(err.value)


def test_a_path_is_read_as_the_file_it_names_and_a_table_keeps_kaldis_pipes(setup, tmp_path):
    """A file whose name ends in '|' is read as that file; ``file.ark:offset`` as a path is no
    file; the same pipe in a data dir's wav.scp is run (Kaldi's table), so the refusals above are
    where the entry comes from, not what it says."""
    x, rate = sf.read(setup["a"], dtype="float32")
    odd = tmp_path / "named like a command |"
    shutil.copy(setup["a"], odd)
    wave, r = read_audio(str(odd))
    assert r == rate and np.array_equal(wave, x)

    import kaldiio

    kaldiio.save_ark(str(tmp_path / "w.ark"), {"u": (rate, (x * 32767).astype(np.int16))}, scp=str(tmp_path / "w.scp"))
    spec = (tmp_path / "w.scp").read_text().split()[1]
    with pytest.raises(UtteranceError, match="only from a data dir's wav.scp"):
        read_audio(spec)
    assert read_audio(spec, table=True)[0].shape == x.shape

    marker = tmp_path / "ran"
    data = write_data_dir(tmp_path / "data", {"s-u1": f"touch {marker}; cat {setup['a']} |"}, {"s-u1": "s"})
    assert np.array_equal(AudioReader(data, sample_rate=None).read("s-u1"), x) and marker.exists()


def test_a_folder_as_an_audio_file_is_named_a_directory(tmp_path):
    (tmp_path / "d.wav").mkdir()
    for spec in (tmp_path / "d.wav", tmp_path):
        with pytest.raises(UtteranceError, match="is a directory, not an audio file"):
            read_audio(str(spec))


def test_a_name_that_is_not_utf8_is_read(setup, tmp_path):
    """The name's bytes go to the file system as they are (libsndfile was handed UTF-8 and failed
    'cannot read audio header'); a message shows them as \\xNN."""
    name = os.fsdecode(bytes(tmp_path) + b"/caf\xe9.wav")
    shutil.copy(setup["a"], name)
    wave, _ = read_audio(name)
    assert np.array_equal(wave, sf.read(setup["a"], dtype="float32")[0])
    with pytest.raises(UtteranceError, match=r"caf\\xe9-missing.wav'?\): audio file not found"):
        read_audio(name.replace(".wav", "-missing.wav"))


def test_an_unreadable_file_says_permission_denied():
    """chmod 000: libsndfile said "System error".  Root reads any file, so as root the reading
    runs as the unprivileged user 65534 (setpriv), in a folder that user may enter."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root reads any file, and setpriv (util-linux) is not here to run as another user")
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        f = Path(d) / "locked.wav"
        sf.write(f, np.zeros(1600, dtype=np.float32), 16000)
        os.chmod(f, 0)
        code = (
            "import sys\nfrom spkflow.data.audio import read_audio\n"
            "try:\n    read_audio(sys.argv[1])\nexcept Exception as e:\n    print(e)\n"
        )
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        p = subprocess.run([*as_user, PY, "-c", code, str(f)], capture_output=True, text=True, env=env, check=True)
    assert f"({f}): permission denied" in p.stdout, p.stdout + p.stderr


def test_a_list_of_files_never_becomes_a_wav_scp_command(setup, tmp_path, monkeypatch):
    """make_data_dir --list: a listed file whose name ends in '|' would become a wav.scp entry the
    stages run as a command (it did: 'touch pwned; cat a.wav |' was written as it is); it is
    refused naming the file, and with --skip-bad left out.  Run in tmp_path: a command would run
    there."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    name = "touch pwned; cat a.wav |"
    shutil.copy(setup["a"], tmp_path / name)
    shutil.copy(setup["b"], tmp_path / "b.wav")
    (tmp_path / "files.txt").write_text(f"{name}\tann\nb.wav\tann\n")
    out = tmp_path / "d"
    p = run([PY, "-m", "spkflow.bin.make_data_dir", "--list", tmp_path / "files.txt", out], check=False)
    assert p.returncode == 1 and "ends in '|' or white space" in p.stderr and not out.exists(), p.stderr
    run([PY, "-m", "spkflow.bin.make_data_dir", "--list", tmp_path / "files.txt", out, "--skip-bad", "true"])
    reader = AudioReader(out, sample_rate=None)
    for utt in reader.keys():
        reader.read(utt)
    assert reader.keys() == ["ann-b"] and not marker.exists()
