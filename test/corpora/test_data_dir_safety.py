"""``make_data_dir`` never touches what it did not write (spkflow.corpora.destination) and reports
every unreadable recording (spkflow.corpora.folder): each case runs the real command in a
subprocess on audio written here, next to files a user would keep."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.audio import synth_voice
from helpers.paths import ROOT
from spkflow.core import lock
from spkflow.data.datadir import DataDir

PY = sys.executable
CMD = [PY, "-m", "spkflow.bin.make_data_dir"]


def run(args: list, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LC_ALL="C")
    p = subprocess.run([*CMD, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def voice(seed: int, seconds: float = 0.6, rate: int = 16000) -> np.ndarray:
    return synth_voice(np.random.default_rng(seed), 100 + 20 * seed, (500.0, 1500.0, 2500.0), seconds, rate)


def recordings(root: Path, speakers: dict[str, int], ext: str = "wav") -> Path:
    """``root/<speaker>/<n>.<ext>`` with real voiced audio, ``n`` files per speaker."""
    seed = 0
    for spk, n in speakers.items():
        (root / spk).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            seed += 1
            sf.write(root / spk / f"u{i}.{ext}", voice(seed), 16000)
    return root


def tree(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` (links not followed) -> its bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


# --------------------------------------------------------------------------- the user's folders


def test_a_folder_it_did_not_write_is_refused_and_its_own_is_replaced(tmp_path: Path) -> None:
    rec = recordings(tmp_path / "rec", {"ann": 2, "bob": 2})
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    for _ in range(2):  # the old behaviour: moved to .backup, deleted on the second run
        p = run([rec, out], check=False)
        assert p.returncode == 1 and "Traceback" not in p.stderr
        assert "mine: exists and was not written by spkflow (notes.txt); nothing was changed" in p.stderr
        assert "--overwrite" in p.stderr
        assert tree(out) == {"notes.txt": b"my notes\n"}
    fresh = tmp_path / "fresh"
    run([rec, fresh])
    first = tree(fresh)
    assert ".spkflow-data-dir" in first and "wav.scp" in first
    run([rec, fresh])  # its own folder: replaced, byte for byte the same
    assert tree(fresh) == first
    (fresh / "notes.txt").write_text("added later\n")  # a user's file in a folder spkflow wrote: kept
    p = run([rec, fresh], check=False)
    assert p.returncode == 1 and "holds files spkflow did not write (notes.txt)" in p.stderr
    assert (fresh / "notes.txt").read_text() == "added later\n"
    # refused before the recordings are read: a damaged one is not what the error names
    (Path(rec) / "ann" / "damaged.flac").write_bytes(b"fLaC" + bytes(200))
    p = run([rec, out], check=False)
    assert p.returncode == 1 and "was not written by spkflow" in p.stderr and "damaged" not in p.stderr
    (Path(rec) / "ann" / "damaged.flac").unlink()
    run([rec, out, "--overwrite", "true"])  # asked for: replaced
    assert not (out / "notes.txt").exists() and DataDir(out).utt2spk()
    assert tree(rec) == tree(tmp_path / "rec")  # the recordings untouched
    assert not any(p.name == ".backup" for p in tmp_path.rglob("*")) and not siblings(out) and not siblings(fresh)


def test_recordings_inside_the_data_dir_or_the_reverse_are_refused(tmp_path: Path) -> None:
    """The issue's cases: AUDIO_DIR inside DATA_DIR (moved into .backup, exit 0, wav.scp pointing at
    nothing) and ``make_data_dir P/.backup/audio P`` (all recordings deleted, exit 0); also through
    a symbolic link, and with --overwrite."""
    p_dir = tmp_path / "P"
    run([recordings(tmp_path / "elsewhere", {"ann": 2}), p_dir])  # P: a data dir spkflow wrote
    rec = recordings(p_dir / ".backup" / "audio", {"ann": 2, "bob": 2})
    before = tree(p_dir)
    for extra in ([], ["--overwrite", "true"]):
        p = run([rec, p_dir, *extra], check=False)
        assert p.returncode == 1 and "the recordings are inside the data dir" in p.stderr, p.stderr
        assert tree(p_dir) == before
    inner = recordings(tmp_path / "Q" / "audio", {"ann": 2})
    p = run([inner, tmp_path / "Q", "--overwrite", "true"], check=False)
    assert p.returncode == 1 and "the recordings are inside the data dir" in p.stderr
    link = tmp_path / "link_to_Q"
    link.symlink_to(tmp_path / "Q")
    p = run([link / "audio", tmp_path / "Q", "--overwrite", "true"], check=False)
    assert p.returncode == 1 and "the recordings are inside the data dir" in p.stderr
    p = run([inner, link / "audio" / "data"], check=False)  # DATA_DIR inside the recordings, through the link
    assert p.returncode == 1 and "the data dir would be inside the recordings' folder" in p.stderr
    assert sorted(tree(tmp_path / "Q")) == ["audio/ann/u0.wav", "audio/ann/u1.wav"]


def test_symbolic_link_loops_end_and_each_folder_is_read_once(tmp_path: Path) -> None:
    rec = recordings(tmp_path / "rec", {"ann": 2, "bob": 2})
    (rec / "ann" / "up").symlink_to("..")  # two links back to the root
    (rec / "bob" / "top").symlink_to(rec)
    (rec / "carol").symlink_to(rec / "ann")  # a second name for one folder
    out = tmp_path / "data"
    p = run([rec, out], timeout=60)
    assert sorted(DataDir(out).utt2spk()) == ["ann-u0", "ann-u1", "bob-u0", "bob-u1"]
    assert "3 folder(s) reached again through a symbolic link were read once" in p.stderr
    assert "a folder reached a second time (a link loop" in run(["--help"]).stdout.replace("\n", " ")


def test_speakers_whose_ids_cannot_sort_are_named_and_the_previous_dir_stays(tmp_path: Path) -> None:
    """Speakers ``A`` and ``A-1``: utt2spk cannot be sorted for both (``A-1-x`` before ``A-z``):
    refused before anything is written, both named with a rename that works; the valid dir stays."""
    out = tmp_path / "data"
    run([recordings(tmp_path / "good", {"A": 2, "B": 2}), out])
    before = tree(out)
    bad = tmp_path / "bad"
    recordings(bad, {"A-1": 1})
    (bad / "A").mkdir()
    sf.write(bad / "A" / "z.wav", voice(10), 16000)
    p = run([bad, out], check=False)
    assert p.returncode == 1 and "speaker 'A-1' sorts after speaker 'A'" in p.stderr, p.stderr
    assert "rename the folder 'A-1' (e.g. to 'A_1')" in p.stderr
    assert tree(out) == before and not siblings(out)
    (bad / "A-1").rename(bad / "A_1")  # the rename it gives works
    run([bad, out, "--overwrite", "true"])
    assert sorted(set(DataDir(out).utt2spk().values())) == ["A", "A_1"]


def test_a_data_dir_failing_its_checks_after_writing_keeps_the_previous_one(tmp_path: Path) -> None:
    """The last net: whatever the block writing into the temporary folder raises (the checks of
    what it wrote), the previous data dir stays as it was and no temporary folder is left."""
    from spkflow.core.errors import InputError
    from spkflow.corpora.destination import data_dir_destination

    out = tmp_path / "data"
    run([recordings(tmp_path / "good", {"A": 2, "B": 2}), out])
    before = tree(out)
    with pytest.raises(InputError, match="utt2spk:2"):
        with data_dir_destination(out) as tmp:
            (tmp / "utt2spk").write_text("b-1 b\na-1 a\n")
            raise InputError(tmp / "utt2spk", 2, "not sorted")
    assert tree(out) == before and not siblings(out)


def test_a_second_run_into_one_data_dir_is_refused(tmp_path: Path) -> None:
    rec = recordings(tmp_path / "rec", {"ann": 2, "bob": 2})
    out = tmp_path / "data"
    run([rec, out])
    before = tree(out)
    holder = subprocess.Popen(
        [PY, "-c", f"from spkflow.core import lock; import sys, time; lock.acquire({str(out)!r}); print('held', "
         "flush=True); time.sleep(60)"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        p = run([rec, out], check=False)
        assert p.returncode == 1 and f"is in use by another run: pid {holder.pid}" in p.stderr, p.stderr
        assert {k: v for k, v in tree(out).items() if k != lock.LOCK_NAME} == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the temporary a contender writes for an instant before it finds the lock taken (or leaves
    # when killed in that instant) is the lock's, not a user's file: seen by a third run in CI as
    # "exists and was not written by spkflow (.spkflow.core.lock.vm.4551.tmp)"
    (out / f"{lock.LOCK_NAME}.node3.4551.tmp").write_text("host=node3\npid=4551\n")
    run([rec, out])
    assert tree(out) == before
    # three at once (different folders): each refused or complete; the result is one run's, valid
    outs = {}
    for name, spk in (("r1", {"ann": 3}), ("r2", {"bob": 2, "cy": 2}), ("r3", {"dee": 4})):
        outs[name] = recordings(tmp_path / name, spk)
    shared = tmp_path / "shared"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen([*CMD, str(r), str(shared)], env=env, stderr=subprocess.PIPE, text=True) for r in outs.values()
    ]
    results = [(proc.wait(timeout=120), proc.stderr.read() if proc.stderr else "") for proc in procs]
    assert any(rc == 0 for rc, _ in results)
    refusals = ("in use by another run", "at the same moment", "is being replaced by another run; nothing was changed")
    for rc, err in results:  # the three ways a run loses the race (spkflow.corpora.destination), each said
        assert rc == 0 or any(r in err for r in refusals), err
    d = DataDir(shared)
    d.validate(no_feats=True, no_text=True)
    spks = set(d.utt2spk().values())
    assert spks in ({"ann"}, {"bob", "cy"}, {"dee"})
    assert not (shared / lock.LOCK_NAME).exists() and not siblings(shared)


def _unshare_ok() -> bool:
    return (
        shutil.which("unshare") is not None
        and subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0
    )


def test_a_full_disk_is_one_line(tmp_path: Path) -> None:
    """A real full file system (a 8 KiB tmpfs, filled first, in a user namespace); where user
    namespaces are not allowed, a file-size limit (EFBIG) takes the same path."""
    rec = recordings(tmp_path / "rec", {"ann": 2, "bob": 2})
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if _unshare_ok():
        script = (
            f"mount -t tmpfs -o size=8k tmpfs {mnt} && (head -c 100000 /dev/zero > {mnt}/filler 2>/dev/null; true) "
            f"&& {' '.join(CMD)} {rec} {mnt}/data; echo rc=$?; ls -A {mnt}"
        )
        p = subprocess.run(
            ["unshare", "-rm", "sh", "-c", script], env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert "rc=1" in p.stdout and p.stdout.split("rc=1", 1)[1].split() == ["filler"], p.stdout + p.stderr
        why = "No space left on device"
    else:
        import resource

        def limit() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

        p = run([rec, mnt / "data"], check=False, preexec_fn=limit)
        assert p.returncode == 1 and not (mnt / "data").exists()
        why = "File too large"
    errors = [line for line in p.stderr.splitlines() if line.strip()]
    assert "Traceback" not in p.stderr and len(errors) == 1, p.stderr
    assert f"data: cannot write: {why}" in errors[0]


# --------------------------------------------------------------------------- unreadable recordings


def test_every_bad_file_is_named_and_skip_bad_decodes_each(tmp_path: Path) -> None:
    rec = recordings(tmp_path / "rec", {"ann": 3, "bob": 3})
    sf.write(rec / "ann" / "long.flac", voice(20, 3.0), 16000)
    whole = (rec / "ann" / "long.flac").read_bytes()
    (rec / "ann" / "cut.flac").write_bytes(whole[: len(whole) // 2])  # header intact, audio cut
    (rec / "ann" / "long.flac").unlink()
    (rec / "bob" / "noise.mp3").write_bytes(np.random.default_rng(0).bytes(20000))
    sf.write(rec / "bob" / "new\nline.wav", voice(21), 16000)
    (rec / "bob" / "empty.wav").write_bytes(b"")
    (rec / "ann" / "notes.txt").write_text("not audio")
    (rec / "cover.jpg").write_bytes(b"\xff\xd8")
    out = tmp_path / "data"
    p = run([rec, out], check=False)
    assert p.returncode == 1 and not out.exists() and "Traceback" not in p.stderr
    for name in ("bob/noise.mp3", "bob/new\\nline.wav", "bob/empty.wav"):
        assert f"{rec}/{name}: " in p.stderr, (name, p.stderr)
    assert "3 of 10 audio file(s) unreadable" in p.stderr and "--skip-bad true" in p.stderr
    assert "not a regular file" not in p.stderr and "no MP3 stream libsndfile can decode" in p.stderr
    assert "its name holds a line break" in p.stderr
    p = run([rec, out, "--skip-bad", "true"])
    listed = (out / "bad_files").read_text().splitlines()
    assert len(listed) == 4 and all(line.startswith(str(rec)) for line in listed)
    cut = next(line for line in listed if "ann/cut.flac" in line)
    assert "damaged" in cut or "truncated" in cut
    assert sorted(DataDir(out).utt2spk()) == ["ann-u0", "ann-u1", "ann-u2", "bob-u0", "bob-u1", "bob-u2"]
    assert "4 unreadable file(s) left out (listed in bad_files), of 10 audio file(s)" in p.stderr
    assert "2 file(s) skipped as not audio by their extension" in p.stderr


def test_a_truncated_mp3_is_caught_by_skip_bad_and_noted_by_verify(tmp_path: Path) -> None:
    """An MP3 cut short decodes without an error: make_data_dir --skip-bad leaves it out, verify
    and identify score what decodes and say the same words (one rule) in the JSON line and on stderr."""
    import json

    from helpers.audio import write_data_dir
    from helpers.models import make_spkflow_model_dir

    rec = recordings(tmp_path / "rec", {"ann": 2})
    mp3 = rec / "ann" / "long.mp3"
    sf.write(mp3, voice(30, 3.0), 16000, format="MP3", subtype="MPEG_LAYER_III")
    whole = mp3.read_bytes()
    mp3.write_bytes(whole[: len(whole) // 2])
    p = run([rec, tmp_path / "data", "--skip-bad", "true"])
    left = (tmp_path / "data" / "bad_files").read_text()
    assert "long.mp3: truncated: decodes to" in left, p.stderr
    said = left.split("long.mp3: ", 1)[1].strip()
    model = make_spkflow_model_dir(tmp_path / "model")
    env = dict(os.environ, PYTHONPATH=str(ROOT), LC_ALL="C")
    other = rec / "ann" / "u0.wav"
    v = subprocess.run([PY, "-m", "spkflow.bin.verify", "--model", model, mp3, other], env=env, capture_output=True,
                       text=True, check=True)  # fmt: skip
    (row,) = [json.loads(line) for line in v.stdout.splitlines()]
    assert row["note"] == f"{mp3}: {said}" and f"{mp3}: {said}; scored on what decodes" in v.stderr
    assert row["score"] is not None
    enrol = write_data_dir(tmp_path / "enrol", {"ann-u1": str(rec / "ann" / "u1.wav")}, {"ann-u1": "ann"})
    i = subprocess.run([PY, "-m", "spkflow.bin.identify", "--model", model, "--enrol", enrol, mp3, other], env=env,
                       capture_output=True, text=True, check=True)  # fmt: skip
    rows = [json.loads(line) for line in i.stdout.splitlines()]
    assert rows[0]["note"] == f"{mp3}: {said}" and "note" not in rows[1]


def test_a_nested_layout_says_which_speaker_regex(tmp_path: Path) -> None:
    """corpus/subset/speaker/file (LibriSpeech's root): the first folder would make 2 speakers of 6."""
    root = tmp_path / "corpus"
    for subset, spks in (("dev", ("11", "12", "13")), ("test", ("21", "22", "23"))):
        recordings(root / subset, {s: 1 for s in spks})
    p = run([root, tmp_path / "d1"])
    assert "WARNING" in p.stderr and "2 speaker folder(s) hold 6 subfolders" in p.stderr
    regex = "^[^/]+/(?P<spk>[^/]+)/"
    assert f"--speaker-regex '{regex}'" in p.stderr and "that would make 6 speakers" in p.stderr
    p = run([root, tmp_path / "d2", "--speaker-regex", regex])
    assert len(set(DataDir(tmp_path / "d2").utt2spk().values())) == 6 and "subfolders" not in p.stderr
    flat = recordings(tmp_path / "flat", {"ann": 2, "bob": 2})
    assert "subfolders" not in run([flat, tmp_path / "d3"]).stderr


def test_a_run_stopped_while_writing_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGTERM while the new data dir is being written: the temporary folder and the lock go, a
    previous data dir stays as it was, a DATA_DIR the run created goes."""
    rec = recordings(tmp_path / "rec", {"ann": 2})
    old = tmp_path / "old"
    run([rec, old])
    before = tree(old)
    for out in (old, tmp_path / "new"):
        code = (
            "import sys, time\n"
            "from spkflow.corpora.destination import data_dir_destination\n"
            f"with data_dir_destination({str(out)!r}) as tmp:\n"
            "    (tmp / 'wav.scp').write_text('x y\\n')\n"
            "    print('writing', flush=True)\n"
            "    time.sleep(60)\n"
        )
        proc = subprocess.Popen(
            [PY, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        assert siblings(out) and (out / lock.LOCK_NAME).exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert not siblings(out)
        if out == old:
            assert tree(old) == before
        else:
            assert not out.exists()


def test_a_users_tmp_file_is_not_taken_for_a_lock_temporary(tmp_path: Path) -> None:
    """Only the lock's own names are skipped when a folder is checked (spkflow.core.lock.is_lock_file):
    a user's ``notes.tmp`` makes the folder the user's, a contender's lock temporary does not."""
    from spkflow.core.errors import InputError
    from spkflow.corpora.destination import check_destination

    assert lock.is_lock_file(lock.LOCK_NAME) and lock.is_lock_file(f"{lock.LOCK_NAME}.node3.4711.tmp")
    assert not any(map(lock.is_lock_file, ("notes.tmp", ".tmp", f"x{lock.LOCK_NAME}.1.tmp", f"{lock.LOCK_NAME}.1")))
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.tmp").write_text("mine\n")
    with pytest.raises(InputError, match=r"mine: exists and was not written by spkflow \(notes.tmp\)"):
        check_destination(out)
    (out / "notes.tmp").unlink()
    (out / f"{lock.LOCK_NAME}.node3.4711.tmp").write_text("host=node3\n")  # a contender killed mid-lock
    assert check_destination(out) == out.resolve()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_new_data_dir_follows_the_umask(tmp_path: Path, umask: int) -> None:
    """As any mkdir: 0777 less the umask (the temporary folder it is written in is made 0700)."""
    rec = recordings(tmp_path / "rec", {"ann": 2})
    out = tmp_path / "data"
    for _ in range(2):  # made, then replaced
        run([rec, out], preexec_fn=lambda: os.umask(umask))
        assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    both = tmp_path / "both"  # utils/combine_data.sh writes its folder the same way
    subprocess.run(
        ["bash", ROOT / "utils" / "combine_data.sh", both, out, out],
        env=dict(os.environ, PYTHONPATH=str(ROOT), LC_ALL="C"),
        preexec_fn=lambda: os.umask(umask),
        capture_output=True,
        check=True,
    )
    assert both.stat().st_mode & 0o777 == 0o777 & ~umask
