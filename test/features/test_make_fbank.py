"""scripts/feats/make_fbank.sh end to end (real run.pl jobs, real kaldiio arks), and its Python steps."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi

from helpers.audio import synth_voice, write_data_dir_by_prefix
from helpers.paths import ROOT
from helpers.procs import env, process_tree, run_py, small_disk
from spkflow.core.errors import UtteranceError
from spkflow.data.audio import AudioReader
from spkflow.data.datadir import DataDir
from spkflow.data.jobs import MergeError, split_by_duration, utterance_durations, write_split
from spkflow.data.tables import c_sorted, read_kv, read_spk2utt
from spkflow.features.fbank import FbankOptions, VadOptions, compute_fbank
from spkflow.features.jobs import extract_job, fbank_stamp, filter_data_dir, job_paths, merge_jobs

MAKE_FBANK = ROOT / "scripts" / "feats" / "make_fbank.sh"
CONF = ROOT / "egs" / "TEMPLATE" / "spk1" / "conf"


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants (run.pl puts each job in its own process group,
    so killing the group of make_fbank.sh is not enough)."""
    for p in process_tree(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_make_fbank(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [
        "bash",
        str(MAKE_FBANK),
        "--fbank-conf",
        str(CONF / "fbank.conf"),
        "--vad-conf",
        str(CONF / "vad.conf"),
        *map(str, args),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"make_fbank failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def good_audio(root: Path) -> dict[str, str]:
    """16 kHz wav and 8 kHz flac of mixed lengths (0.3 s .. 3.5 s), 3 speakers."""
    rng = np.random.default_rng(42)
    out = {}
    lengths = [0.3, 3.5, 0.9, 2.2, 0.5, 1.7, 3.0, 0.4, 1.2]
    for i, sec in enumerate(lengths):
        spk = f"s{i % 3}"
        rate, fmt = (8000, "flac") if i % 2 else (16000, "wav")
        utt = f"{spk}-u{i:02d}"
        path = root / "audio" / f"{utt}.{fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(
            path,
            synth_voice(rng, 110 + 30 * (i % 3), (500, 1500, 2500), sec, rate, silence=0.1),
            rate,
            subtype="PCM_16",
        )
        out[utt] = str(path)
    return out


def bad_audio(root: Path) -> dict[str, tuple[str, str]]:
    """utt -> (wav.scp entry, expected reason fragment) for every kind of bad input."""
    a = root / "audio"
    a.mkdir(parents=True, exist_ok=True)
    (a / "empty.wav").write_bytes(b"")
    (a / "corrupt.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk" + os.urandom(200))
    sf.write(a / "short.wav", np.zeros(300, np.float32), 16000, subtype="PCM_16")
    sf.write(a / "rate.wav", 0.1 * np.ones(2000, np.float32), 1000, subtype="PCM_16")
    return {
        "s9-empty": (str(a / "empty.wav"), "cannot read audio"),
        "s9-corrupt": (str(a / "corrupt.wav"), "cannot read audio"),
        "s9-short": (str(a / "short.wav"), "shorter than one frame"),
        "s9-rate": (str(a / "rate.wav"), "cannot resample 1000 Hz"),
        "s9-missing": (str(a / "nope.wav"), "not found"),
        "s8-pipefail": ("false |", "exit code 1"),
    }


def reference(wave16: np.ndarray) -> np.ndarray:
    x = torch.from_numpy(wave16.astype(np.float64))[None] * 32768.0
    return kaldi.fbank(x, num_mel_bins=80, dither=0.0, energy_floor=0.0).numpy()


@pytest.fixture(scope="module")
def skip_bad_run(tmp_path_factory):
    """nj=2 over good 16 kHz + 8 kHz audio and every kind of bad audio, --skip-bad true."""
    root = tmp_path_factory.mktemp("mk")
    good = good_audio(root)
    bad = bad_audio(root)
    data = root / "data" / "train"
    write_data_dir_by_prefix(data, {**good, **{u: e for u, (e, _) in bad.items()}})
    out = root / "dump" / "train"
    p = run_make_fbank("--nj", "2", "--skip-bad", "true", data, out)
    return data, out, good, bad, p


def test_every_utterance_once_sorted_and_kaldi_values(skip_bad_run):
    data, out, good, bad, p = skip_bad_run
    feats_keys = list(read_kv(out / "feats.scp"))
    assert feats_keys == c_sorted(good)  # every good utterance exactly once, LC_ALL=C order
    for name in ("vad.scp", "utt2num_frames", "cmvn_utt.scp", "cmvn_utt_voiced.scp"):
        assert list(read_kv(out / name)) == feats_keys
    arks = {v.rsplit(":", 1)[0] for v in read_kv(out / "feats.scp").values()}
    assert len(arks) == 2 and all(Path(a).parent == (out / "data").resolve() for a in arks)  # 2 jobs
    assert sorted(x.name for x in (out / "log").glob("make_fbank_train.*.log")) == [
        "make_fbank_train.1.log",
        "make_fbank_train.2.log",
    ]
    feats = kaldiio.load_scp(str(out / "feats.scp"))
    vads = kaldiio.load_scp(str(out / "vad.scp"))
    frames = read_kv(out / "utt2num_frames")
    reader = AudioReader(data, sample_rate=16000)  # 8 kHz files come back resampled to 16 kHz
    for utt in feats_keys:
        ours, ref = feats[utt], reference(reader.read(utt))
        assert ours.dtype == np.float32 and ours.shape == ref.shape == (int(frames[utt]), 80)
        assert np.abs(ours - ref).max() < 1e-3, utt
        assert vads[utt].shape == (len(ours),) and 0.2 < vads[utt].mean() <= 1.0
    stats = kaldiio.load_scp(str(out / "cmvn_utt_voiced.scp"))
    u = feats_keys[0]
    v = vads[u] > 0.5
    assert np.allclose(stats[u][0, :-1] / stats[u][0, -1], feats[u][v].mean(0), atol=1e-4)


def test_bad_utterances_listed_and_data_dir_fixed(skip_bad_run):
    data, out, good, bad, p = skip_bad_run
    listed = read_kv(out / "bad_utts")
    assert list(listed) == c_sorted(bad)
    for utt, (_, reason) in bad.items():
        assert reason in listed[utt], (utt, listed[utt])
    # feats.scp + bad_utts account for every utterance of the data dir
    assert sorted(list(read_kv(out / "feats.scp")) + list(listed)) == sorted(read_kv(data / "utt2spk"))
    # the copied data dir agrees with feats.scp; speakers with only bad audio are gone
    assert list(read_kv(out / "utt2spk")) == list(read_kv(out / "feats.scp"))
    assert set(read_spk2utt(out / "spk2utt")) == {"s0", "s1", "s2"}
    assert list(read_kv(out / "wav.scp")) == list(read_kv(out / "feats.scp"))
    DataDir(out).validate(no_feats=False)
    assert "6 bad utterances left out" in p.stderr
    logs = "".join(x.read_text() for x in (out / "log").glob("*.log"))
    assert "WARNING: skipping utterance 's9-short'" in logs


def test_bad_utterance_fails_the_job_naming_it(tmp_path):
    data = tmp_path / "data" / "dev"
    good = good_audio(tmp_path)
    bad = bad_audio(tmp_path)
    write_data_dir_by_prefix(data, {**dict(list(good.items())[:3]), "s9-short": bad["s9-short"][0]})
    out = tmp_path / "fbank"
    p = run_make_fbank("--nj", "2", data, out, check=False)
    assert p.returncode != 0
    assert "s9-short" in p.stderr and "shorter than one frame" in p.stderr
    assert "make_fbank_dev.2.log" in p.stderr  # the failed job's log is named
    assert not (out / "feats.scp").exists()


@pytest.mark.parametrize("kind", ["s9-empty", "s9-corrupt", "s9-short", "s9-rate", "s9-missing", "s8-pipefail"])
def test_each_bad_input_is_named(tmp_path, kind):
    """The job (in-process) stops at the bad utterance with an UtteranceError naming it and
    writes no scp; with skip_bad it lists it."""
    bad = bad_audio(tmp_path)
    good = good_audio(tmp_path)
    first = next(iter(good))
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, {first: good[first], kind: bad[kind][0]})
    (tmp_path / "list").write_text(f"{first}\n{kind}\n")
    with pytest.raises(UtteranceError, match=bad[kind][1]) as e:
        extract_job(data, tmp_path / "list", tmp_path / "arks", "x", 1, FbankOptions(), VadOptions(), progress=False)
    assert e.value.utt == kind
    assert not list((tmp_path / "arks").glob("*.scp"))
    s = extract_job(
        data, tmp_path / "list", tmp_path / "arks", "x", 1, FbankOptions(), VadOptions(), skip_bad=True, progress=False
    )
    assert (s.num_done, s.num_bad) == (1, 1)
    assert list(read_kv(tmp_path / "arks" / "bad_utts_x.1")) == [kind]


def test_interrupted_run_leaves_no_complete_looking_scp(tmp_path):
    good = good_audio(tmp_path)
    data = tmp_path / "data" / "set"
    items = dict(list(good.items())[:4])
    write_data_dir_by_prefix(data, items)
    out = tmp_path / "fbank"
    run_make_fbank("--nj", "2", data, out)
    assert (out / "feats.scp").is_file()
    # the data changes; the rerun hangs in job 2 on a slow pipe and is killed
    last = c_sorted(items)[-1]
    items[last] = f"sleep 60; cat {items[last]} |"
    write_data_dir_by_prefix(data, items)
    job1 = out / "data" / "raw_fbank_set.1.scp"
    t0 = time.time()
    proc = subprocess.Popen(
        ["bash", str(MAKE_FBANK), "--nj", "2", str(data), str(out)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def job1_done() -> bool:  # the first run's scp is there until the rerun removes it
        return job1.exists() and job1.stat().st_mtime >= t0

    try:
        deadline = time.time() + 120
        while time.time() < deadline and not job1_done():
            time.sleep(0.2)
        assert job1_done(), "job 1 never finished"
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        kill_tree(proc.pid)  # a crash: every process of the run dies at once, no cleanup
        proc.wait()
    assert not (out / "feats.scp").exists()  # the old, complete one was removed before the jobs
    assert not (out / "data" / "raw_fbank_set.2.scp").exists()
    assert (out / "data" / "raw_fbank_set.2.ark").exists()  # a partial ark, referenced by nothing
    with pytest.raises(
        RuntimeError,
        match=r"job 2 did not finish: .*raw_fbank_set.2.scp is missing; "
        r"see .*make_fbank_set.2.log",
    ):
        merge_jobs(data, out, out / "data", "set", 2, out / "log")


def two_jobs(tmp_path: Path, *opts: FbankOptions) -> tuple[dict[str, str], Path, Path]:
    """Good audio in a data dir, 2 jobs of stage 2 into ``tmp_path/arks`` (job j with ``opts[j-1]``,
    default options); returns (utt -> audio, data dir, ark dir)."""
    good = good_audio(tmp_path)
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, good)
    split = write_split(data, tmp_path / "split", 2)
    arks = tmp_path / "arks"
    for j, lst in enumerate(split, 1):
        fbank = opts[j - 1] if len(opts) >= j else FbankOptions()
        extract_job(data, lst, arks, "d", j, fbank, VadOptions(), progress=False)
    return good, data, arks


def test_merge_names_missing_and_duplicate_utterances(tmp_path):
    good, data, arks = two_jobs(tmp_path)
    assert merge_jobs(data, tmp_path / "out", arks, "d", 2) == (len(good), 0)
    scp = job_paths(arks, "d", 2, "raw_fbank")[1]
    lines = scp.read_text().splitlines(keepends=True)
    scp.write_text("".join(lines[1:]))
    lost = lines[0].split()[0]
    with pytest.raises(RuntimeError, match=f"neither in feats.scp nor in bad_utts: {lost}"):
        merge_jobs(data, tmp_path / "out", arks, "d", 2)
    scp.write_text("".join(lines))
    other = job_paths(arks, "d", 1, "raw_fbank")[1]
    other.write_text(other.read_text() + lines[0])
    with pytest.raises(RuntimeError, match=f"'{lost}' was processed by jobs 1 and 2"):
        merge_jobs(data, tmp_path / "out", arks, "d", 2)


def test_split_by_duration():
    rng = np.random.default_rng(0)
    utts = [f"u{i:03d}" for i in range(200)]
    durs = {u: float(d) for u, d in zip(utts, rng.gamma(2.0, 2.0, 200), strict=True)}
    durs["u010"] = 60.0  # one very long recording
    for nj in (1, 2, 3, 7, 200):
        parts = split_by_duration(utts, durs, nj)
        assert [u for p in parts for u in p] == utts and len(parts) == nj and all(parts)
        total = sum(durs.values())
        for p in parts:  # within one (the longest) utterance of the ideal share
            assert abs(sum(durs[u] for u in p) - total / nj) <= max(durs.values()) + 1e-9
    with pytest.raises(ValueError):
        split_by_duration(utts[:2], durs, 3)
    # equal counts would give 100 utterances each; duration balance moves the cut
    skew = {u: (10.0 if i < 20 else 1.0) for i, u in enumerate(utts)}
    a, b = split_by_duration(utts, skew, 2)
    assert abs(sum(skew[u] for u in a) - sum(skew[u] for u in b)) <= 10.0 and len(a) < 100


def test_durations_from_utt2dur_or_headers(tmp_path):
    good = good_audio(tmp_path)
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, {**good, "s5-pipe": f"cat {next(iter(good.values()))} |"})
    durs = utterance_durations(data)
    assert list(durs) == list(read_kv(data / "utt2spk"))
    assert abs(durs["s0-u00"] - (0.3 + 0.2)) < 0.01  # header (0.1 s padding each side)
    assert durs["s5-pipe"] > 0  # unknown without decoding: the mean of the others
    (data / "utt2dur").write_text("".join(f"{u} 2.5\n" for u in read_kv(data / "utt2spk")))
    assert set(utterance_durations(data).values()) == {2.5}


def test_filter_data_dir_with_segments(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "wav.scp").write_text("r1 /a.wav\nr2 /b.wav\n")
    (d / "segments").write_text("a-1 r1 0 1\na-2 r1 1 2\nb-1 r2 0 1\n")
    (d / "utt2spk").write_text("a-1 a\na-2 a\nb-1 b\n")
    (d / "spk2utt").write_text("a a-1 a-2\nb b-1\n")
    (d / "spk2gender").write_text("a m\nb f\n")
    (d / "utt2dur").write_text("a-1 1\na-2 1\nb-1 1\n")
    (d / "trials").write_text("a-1 b-1 nontarget\na-1 a-2 target\n")
    removed = filter_data_dir(d, {"b-1", "a-2"})
    assert (d / "utt2spk").read_text() == "a-1 a\n"
    assert (d / "spk2utt").read_text() == "a a-1\n"
    assert (d / "wav.scp").read_text() == "r1 /a.wav\n"
    assert (d / "segments").read_text() == "a-1 r1 0 1\n"
    assert (d / "spk2gender").read_text() == "a m\n"
    assert (d / "trials").read_text() == ""
    assert removed["trials"] == 2 and removed["utt2spk"] == 2


def test_usage_and_bad_arguments(tmp_path):
    p = subprocess.run(["bash", str(MAKE_FBANK), str(tmp_path)], capture_output=True, text=True, env=env())
    assert p.returncode != 0 and "Usage:" in p.stderr
    p = subprocess.run(
        ["bash", str(MAKE_FBANK), str(tmp_path / "nodata"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=env(),
    )
    assert p.returncode != 0 and "wav.scp does not exist" in p.stderr
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, {"a-1": "/x.wav"})
    p = subprocess.run(
        ["bash", str(MAKE_FBANK), "--nj", "0", str(data), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=env(),
    )
    assert p.returncode != 0 and "--nj must be a positive integer" in p.stderr
    p = subprocess.run(["bash", str(MAKE_FBANK), str(data), str(data)], capture_output=True, text=True, env=env())
    assert p.returncode != 0 and "must differ" in p.stderr


def test_features_match_compute_fbank_for_job_output(tmp_path):
    """The job writes what compute_fbank returns (bit for bit), VAD and stats alongside."""
    good = good_audio(tmp_path)
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, good)
    lst = tmp_path / "list"
    lst.write_text("".join(u + "\n" for u in c_sorted(good)))
    extract_job(data, lst, tmp_path / "arks", "t", 1, FbankOptions(), VadOptions(), progress=False)
    feats = kaldiio.load_scp(str(job_paths(tmp_path / "arks", "t", 1, "raw_fbank")[1]))
    reader = AudioReader(data, sample_rate=None)
    for utt in c_sorted(good):
        w, sr = reader.read_native(utt)
        assert np.array_equal(feats[utt], compute_fbank(w, sr, FbankOptions()))


def test_segments_data_dir(tmp_path):
    """Utterances cut from recordings by ``segments``: split by segment duration, features of
    exactly the segment's samples."""
    rng = np.random.default_rng(8)
    rec = tmp_path / "rec.wav"
    sig = synth_voice(rng, 120, (500, 1500), 3.0, silence=0.0)
    sf.write(rec, sig, 16000, subtype="PCM_16")
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, {"a-1": "x", "a-2": "x", "b-1": "x"})
    (data / "wav.scp").write_text(f"r1 {rec}\n")
    (data / "segments").write_text("a-1 r1 0.0 0.8\na-2 r1 0.8 2.0\nb-1 r1 2.0 3.0\n")
    split = write_split(data, tmp_path / "split", 2)
    assert [p.read_text().split() for p in split] == [["a-1", "a-2"], ["b-1"]]  # 2.0 s | 1.0 s
    for j, lst in enumerate(split, 1):
        extract_job(data, lst, tmp_path / "arks", "seg", j, FbankOptions(), VadOptions(), progress=False)
    merge_jobs(data, tmp_path / "out", tmp_path / "arks", "seg", 2)
    feats = kaldiio.load_scp(str(tmp_path / "out" / "feats.scp"))
    x = sf.read(rec, dtype="float32")[0]
    for utt, (s, e) in {"a-1": (0, 12800), "a-2": (12800, 32000), "b-1": (32000, 48000)}.items():
        assert np.array_equal(feats[utt], compute_fbank(x[s:e], 16000))


@pytest.mark.corpus
def test_real_heldout_audio_16k_long_and_8k_short(tmp_path, corpus):
    """Real recordings of two corpora the feature code was not written against: LibriSpeech
    (16 kHz FLAC, 6-20 s) and FSDD (8 kHz digits, under 1 s, resampled to 16 kHz): two jobs give
    every utterance once, sorted, with Kaldi's fbank values."""
    libri = sorted(corpus("LIBRISPEECH").rglob("*.flac"))[:6]
    fsdd = sorted((corpus("FSDD") / "recordings").glob("*"))[:6]
    assert libri and fsdd
    entries = {f"{p.stem.split('-')[0]}-{p.stem}": str(p) for p in libri}
    entries.update({f"{p.stem.split('_')[1]}-{p.stem}": str(p) for p in fsdd})
    data, out = tmp_path / "data", tmp_path / "dump"
    write_data_dir_by_prefix(data, entries)
    run_make_fbank("--nj", "2", data, out)
    keys = list(read_kv(out / "feats.scp"))
    assert keys == c_sorted(entries)
    feats = kaldiio.load_scp(str(out / "feats.scp"))
    reader = AudioReader(data, sample_rate=16000)
    lengths = []
    for utt in keys:
        ours, ref = feats[utt], reference(reader.read(utt))
        assert ours.shape == ref.shape and np.abs(ours - ref).max() < 1e-3, utt
        lengths.append(len(ours))
    assert min(lengths) < 100 and max(lengths) > 600  # short and long utterances were both there
    assert {sf.info(p).samplerate for p in entries.values()} == {8000, 16000}


def test_recordings_below_the_features_rate_are_named(tmp_path):
    """An 8 kHz file among 16 kHz ones is upsampled by the jobs: stage 2 says so, naming it (a
    file header and an ffmpeg pipe's -ar), before the jobs run."""
    rng = np.random.default_rng(4)
    entries = {}
    for utt, rate in (("a-1", 16000), ("a-2", 8000), ("b-1", 16000)):
        path = tmp_path / "audio" / f"{utt}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, synth_voice(rng, 120.0, (500.0, 1500.0), 0.8, rate), rate, subtype="PCM_16")
        entries[utt] = str(path)
    entries["b-2"] = f"cat {entries['b-1']} | ffmpeg -i - -ar 11025 -f wav - |"  # never run: only its -ar is read
    data = write_data_dir_by_prefix(tmp_path / "data", {k: v for k, v in entries.items() if k != "b-2"})
    p = run_make_fbank("--nj", "1", data, tmp_path / "dump")
    assert "sample rates of 3 recordings: 8000 Hz x 1, 16000 Hz x 2" in p.stderr
    assert "Warning: " in p.stderr and "1 recording(s) at 8000 Hz, below the model's 16000 Hz" in p.stderr
    assert "(e.g. a-2)" in p.stderr
    from spkflow.data.durations import native_rates

    write_data_dir_by_prefix(tmp_path / "pipes", entries)
    rates, checked, unknown = native_rates(tmp_path / "pipes")
    assert rates == {16000: ["a-1", "b-1"], 8000: ["a-2"], 11025: ["b-2"]} and (checked, unknown) == (4, 0)
    (tmp_path / "pipes" / "wav.scp").write_text(f"a-1 {entries['a-1']}\nb-1 cat x |\n")
    assert native_rates(tmp_path / "pipes") == ({16000: ["a-1"]}, 2, 1)


# ----------------------------------------------------------------------------- reliability (issue 16)


def test_two_runs_with_different_configs_into_one_dir(tmp_path):
    """Started at the same moment (80 and 40 mel bins): one run is refused naming the other,
    the other's features are what is left (before the lock both said "Succeeded" and the
    features were 40-dimensional whichever run finished last)."""
    data = tmp_path / "data" / "set"
    write_data_dir_by_prefix(data, good_audio(tmp_path))
    conf40 = tmp_path / "fbank40.conf"
    conf40.write_text((CONF / "fbank.conf").read_text().replace("--num-mel-bins=80", "--num-mel-bins=40"))
    out = tmp_path / "dump"
    runs = {
        bins: subprocess.Popen(
            ["bash", str(MAKE_FBANK), "--nj", "2", "--fbank-conf", str(conf), str(data), str(out)],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for bins, conf in ((80, CONF / "fbank.conf"), (40, conf40))
    }
    results = {bins: (p.wait(timeout=300), p.stderr.read()) for bins, p in runs.items()}
    ok = [bins for bins, (code, _) in results.items() if code == 0]
    assert len(ok) == 1, results
    (loser_code, loser_err), winner = results[80 if ok == [40] else 40], ok[0]
    assert loser_code == 1
    assert f"{out} is in use by another run: pid {runs[winner].pid} on " in loser_err
    assert "make_fbank.sh" in loser_err and "Succeeded" not in loser_err
    feats = kaldiio.load_scp(str(out / "feats.scp"))
    assert {m.shape[1] for m in feats.values()} == {winner}
    assert list(feats) == c_sorted(read_kv(data / "utt2spk"))
    assert not (out / ".spkflow.core.lock").exists()


def test_merge_refuses_jobs_made_with_other_options(tmp_path):
    _, data, arks = two_jobs(tmp_path, FbankOptions(), FbankOptions(num_mel_bins=40))
    with pytest.raises(MergeError, match=r"different fbank/VAD options: 1 of 2 part\(s\) differ\n  job 2 \("):
        merge_jobs(data, tmp_path / "out", arks, "d", 2, stamp=fbank_stamp(FbankOptions(), VadOptions(), False, 3))
    with pytest.raises(MergeError, match="different fbank/VAD options"):  # without a stamp: with each other
        merge_jobs(data, tmp_path / "out", arks, "d", 2)
    assert not (tmp_path / "out" / "feats.scp").exists()


def test_disk_full_in_a_job_one_line_and_nothing_left(tmp_path):
    good = good_audio(tmp_path)
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, good)
    lst = tmp_path / "list"
    lst.write_text("".join(f"{u}\n" for u in c_sorted(good)))
    with small_disk(tmp_path / "disk", 64) as preexec:
        p = run_py(["-m", "spkflow.bin.compute_fbank", data, lst, tmp_path / "disk", "set", "1"], preexec)
        assert p.returncode == 1
        assert "Traceback" not in p.stderr
        err = [ln for ln in p.stderr.splitlines() if "ERROR" in ln]
        assert len(err) == 1 and err[0].startswith(f"compute_fbank: ERROR: {tmp_path / 'disk'}/")
        assert "cannot write: " in err[0] and ("no space left on device" in err[0] or "file too large" in err[0])
        assert os.listdir(tmp_path / "disk") == []  # no ark, no scp, no temporary


def test_disk_full_in_the_merge_leaves_no_output(tmp_path):
    """Before: vad.scp, cmvn_utt*.scp and utt2num_frames stayed behind when feats.scp failed."""
    good, data, arks = two_jobs(tmp_path)
    out = tmp_path / "out"
    with small_disk(out, 12) as preexec:  # 3 pages: the 5 outputs do not fit
        if preexec is not None:  # RLIMIT_FSIZE: a limit between utt2num_frames and the scps
            size = (arks / "raw_fbank_d.1.scp").stat().st_size
            preexec = (lambda lim: lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim)))(size)
        p = run_py(["-m", "spkflow.bin.merge_fbank", data, out, arks, "d", "2"], preexec)
        assert p.returncode == 1, p.stderr
        assert "Traceback" not in p.stderr
        assert p.stderr.startswith(f"merge_fbank: ERROR: {out}/") and "cannot write" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
        assert os.listdir(out) == []
    # with room, the same merge succeeds
    assert run_py(["-m", "spkflow.bin.merge_fbank", data, out, arks, "d", "2"]).returncode == 0
    assert list(read_kv(out / "feats.scp")) == c_sorted(good)


def test_bad_data_dir_is_refused_before_any_job(tmp_path):
    """A key that is not UTF-8 (before: "surrogates not allowed", no file, no line) and spk2utt
    disagreeing with utt2spk (before: accepted, the error came at stage 4)."""
    good = good_audio(tmp_path)
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, good)
    odd = "s1-u\udcff9"  # a latin-1 byte in an utterance id
    raw = dict(good)
    raw[odd] = good[c_sorted(good)[0]]
    keys = c_sorted(raw)

    def enc(s: str) -> bytes:
        return s.encode("utf-8", "surrogateescape")

    (data / "wav.scp").write_bytes(b"".join(enc(f"{u} {raw[u]}\n") for u in keys))
    (data / "utt2spk").write_bytes(b"".join(enc(f"{u} {u.split('-')[0]}\n") for u in keys))
    spk2utt: dict[str, list[str]] = {}
    for u in keys:
        spk2utt.setdefault(u.split("-")[0], []).append(u)
    (data / "spk2utt").write_bytes(b"".join(enc(f"{s} {' '.join(us)}\n") for s, us in spk2utt.items()))
    out = tmp_path / "dump"
    p = run_make_fbank("--nj", "2", data, out, check=False)
    assert p.returncode == 1
    assert f"utt2spk:{keys.index(odd) + 1}:" in p.stderr and "not UTF-8" in p.stderr
    assert "Traceback" not in p.stderr and "surrogates" not in p.stderr
    assert not (out / "feats.scp").exists() and not list((out / "log").glob("make_fbank_*.log"))

    write_data_dir_by_prefix(data, good)
    lines = (data / "spk2utt").read_text().splitlines()
    spk, *members = lines[0].split()
    lines[0] = " ".join([spk, *members[1:]])  # one utterance of utt2spk missing from spk2utt
    (data / "spk2utt").write_text("\n".join(lines) + "\n")
    p = run_make_fbank("--nj", "2", data, out, check=False)
    assert p.returncode == 1
    assert f"utterance '{members[0]}' of speaker '{spk}' is not in spk2utt" in p.stderr
    assert "not a valid data dir" in p.stderr
    assert not (out / "feats.scp").exists() and not list((out / "log").glob("make_fbank_*.log"))
