"""Audio access: wav.scp paths (wav/flac), pipes, ark entries, segments, resampling, errors.

All audio is made here (sines with known frequency and amplitude); nothing is mocked.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.paths import ROOT
from helpers.procs import env, process_alive, process_tree, start_from_a_terminal
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.audio import (
    AudioReader,
    OpenSamples,
    ReadWhole,
    load_audio,
    read_file,
)
from spkflow.data.durations import known_durations, utt2dur, write_utt2dur
from spkflow.data.resample import resample


def sine(freq: float, seconds: float, rate: int, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write_dir(d: Path, wav_lines: dict[str, str], segments: dict[str, str] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "wav.scp").write_text("".join(f"{k} {v}\n" for k, v in sorted(wav_lines.items())))
    if segments is not None:
        (d / "segments").write_text("".join(f"{k} {v}\n" for k, v in sorted(segments.items())))
    return d


def peak_freq(x: np.ndarray, rate: int) -> float:
    w = np.hanning(len(x))
    spec = np.abs(np.fft.rfft(x * w))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[np.argmax(spec)])


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_16_bit_audio_reads_as_libsndfile_scales_it_bit_for_bit(tmp_path: Path, fmt: str) -> None:
    """16-bit PCM is read as int16 and scaled by spkflow (faster than libsndfile's float loop):
    every code, the extremes included, gives libsndfile's own float32, whole files and spans."""
    codes = np.concatenate([np.arange(-32768, 32768, dtype=np.int16), [-32768, 32767, 0, -1, 1]]).astype(np.int16)
    stereo = np.stack([codes, codes[::-1]], axis=1)
    path = tmp_path / f"all.{fmt}"
    sf.write(path, stereo, 16000, subtype="PCM_16")
    want = sf.read(path, dtype="float32", always_2d=True)[0]
    got, rate = read_file(str(path), "u")
    assert rate == 16000 and got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(read_file(str(path), "u", 1000, 5000)[0], want[1000:5000])
    assert got.min() == -1.0 and got.max() == np.float32(32767 / 32768)


@pytest.mark.parametrize("fmt,subtype", [("wav", "PCM_16"), ("flac", "PCM_16"), ("wav", "FLOAT"), ("flac", "PCM_24")])
def test_reads_files_in_any_soundfile_format(tmp_path: Path, fmt: str, subtype: str) -> None:
    x = sine(440, 0.5, 16000)
    path = tmp_path / f"a.{fmt}"
    sf.write(path, x, 16000, subtype=subtype)
    reader = AudioReader(write_dir(tmp_path / "data", {"spk1-a": str(path)}))
    y = reader.read("spk1-a")
    assert y.dtype == np.float32 and y.ndim == 1 and y.shape == x.shape
    assert np.max(np.abs(y - x)) < 1e-4  # PCM_16 quantisation step is 3e-5
    assert reader.keys() == ["spk1-a"] and "spk1-a" in reader and len(reader) == 1


def test_multichannel_takes_channel_0_and_float_is_clipped(tmp_path: Path) -> None:
    left, right = sine(300, 0.2, 16000, 0.3), sine(1000, 0.2, 16000, 0.6)
    sf.write(tmp_path / "st.wav", np.stack([left, right], axis=1), 16000, subtype="PCM_16")
    loud = np.full(1600, 1.7, dtype=np.float32)
    sf.write(tmp_path / "loud.wav", loud, 16000, subtype="FLOAT")
    assert np.allclose(load_audio(str(tmp_path / "st.wav")), left, atol=1e-4)
    y = load_audio(str(tmp_path / "loud.wav"))
    assert y.max() == 1.0
    sf.write(tmp_path / "low.wav", -loud, 16000, subtype="FLOAT")  # below -1 only: clipped as well
    assert load_audio(str(tmp_path / "low.wav")).min() == -1.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 700, 1599])
def test_a_float_file_with_a_nan_or_an_infinity_fails_naming_utterance_and_file(
    tmp_path: Path, bad: float, where: int
) -> None:
    x = sine(300, 0.1, 16000, 0.3)
    x[where] = bad
    sf.write(tmp_path / "odd.wav", x, 16000, subtype="FLOAT")
    reader = AudioReader(write_dir(tmp_path / "d", {"u1": str(tmp_path / "odd.wav")}), sample_rate=16000)
    with pytest.raises(UtteranceError, match="NaN or infinite samples") as e:
        reader.read("u1")
    assert e.value.utt == "u1" and "odd.wav" in e.value.source


def read_in_place(reader: AudioReader, utt: str) -> np.ndarray:
    x = reader.open_samples(utt)
    assert isinstance(x, OpenSamples) and x.ndim == 1, utt
    row = np.full(x.shape[0] + 3, np.nan, dtype=np.float32)  # a batch's row, longer than the utterance
    x.read_into(row[: x.shape[0]])
    assert np.isnan(row[x.shape[0] :]).all()  # nothing written past its samples
    return row[: x.shape[0]]


def test_16_bit_samples_read_in_place_are_read_s_bit_for_bit(tmp_path: Path) -> None:
    """WAV, FLAC, two channels (channel 0), whole files and segments of them: the row a batch gets
    in place is what read() returns."""
    rate = 16000
    rng = np.random.default_rng(3)
    wav = {}
    for name, fmt, channels in (("w", "WAV", 1), ("f", "FLAC", 1), ("st", "WAV", 2)):
        x = np.clip(rng.standard_normal((rate, channels)) * 0.3, -1, 1).astype(np.float32)
        path = tmp_path / f"{name}.{fmt.lower()}"
        sf.write(path, x, rate, subtype="PCM_16", format=fmt)
        wav[name] = str(path)
    reader = AudioReader(write_dir(tmp_path / "d", wav), sample_rate=rate)
    segs = {"w-a": "w 0.1 0.45", "f-a": "f 0.3 -1", "st-a": "st 0 0.2", "w-z": "w 0.9 1.2"}  # 1.2: past the end
    by_segment = AudioReader(write_dir(tmp_path / "s", wav, segs), sample_rate=rate)
    for r in (reader, by_segment):
        for utt in r.keys():
            whole = r.read(utt)
            got = read_in_place(r, utt)
            assert got.dtype == whole.dtype and np.array_equal(got, whole), utt


def test_what_read_would_do_more_to_or_fail_on_is_not_read_in_place(tmp_path: Path) -> None:
    rate = 16000
    x = sine(300, 0.5, rate)
    cases = {
        "8k": ("e8k.wav", 8000, "PCM_16"),  # to resample
        "float": ("float.wav", rate, "FLOAT"),  # to clip and check
        "pcm24": ("p24.wav", rate, "PCM_24"),
    }
    wav = {}
    for utt, (name, r, subtype) in cases.items():
        sf.write(tmp_path / name, sine(300, 0.5, r), r, subtype=subtype)
        wav[utt] = str(tmp_path / name)
    sf.write(tmp_path / "ok.wav", x, rate, subtype="PCM_16")
    wav["pipe"] = f"cat {shlex.quote(str(tmp_path / 'ok.wav'))} |"
    wav["missing"] = str(tmp_path / "nowhere.wav")
    cut = (tmp_path / "ok.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(cut[: len(cut) // 2])  # its header says twice what it holds
    wav["cut"] = str(tmp_path / "cut.wav")
    sf.write(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32), rate, subtype="PCM_16")
    wav["empty"] = str(tmp_path / "empty.wav")
    reader = AudioReader(write_dir(tmp_path / "d", wav), sample_rate=rate)
    for utt in wav:
        assert reader.open_samples(utt) is None, utt
    for utt in ("missing", "cut", "empty"):  # read() is then what says why
        with pytest.raises(UtteranceError, match="not found|truncated|no samples"):
            reader.read(utt)


def test_a_flac_short_of_its_header_is_left_to_read_whole(tmp_path: Path) -> None:
    sf.write(tmp_path / "full.flac", sine(300, 3.0, 16000), 16000, subtype="PCM_16")
    data = (tmp_path / "full.flac").read_bytes()
    (tmp_path / "cut.flac").write_bytes(data[: len(data) * 6 // 10])  # STREAMINFO still says 3 s
    reader = AudioReader(write_dir(tmp_path / "d", {"u": str(tmp_path / "cut.flac")}), sample_rate=16000)
    x = reader.open_samples("u")
    assert x is not None and x.shape == (48000,)
    with pytest.raises(ReadWhole) as e:
        x.read_into(np.empty(48000, dtype=np.float32))
    assert e.value.utt == "u"
    with pytest.raises(UtteranceError, match=r"'u' .*cut.flac.*cannot read audio"):
        reader.read("u")


def test_pipe_is_decoded_from_stdout(tmp_path: Path) -> None:
    x = sine(523, 0.4, 16000)
    sf.write(tmp_path / "a.flac", x, 16000)
    cmd = f"cat {shlex.quote(str(tmp_path / 'a.flac'))} |"
    reader = AudioReader(write_dir(tmp_path / "data", {"s-pipe": cmd, "s-file": str(tmp_path / "a.flac")}))
    assert np.array_equal(reader.read("s-pipe"), reader.read("s-file"))
    assert reader.duration("s-pipe") == pytest.approx(0.4)


def test_pipe_with_unknown_sizes_in_wav_header(tmp_path: Path) -> None:
    """A writer streaming WAV to a pipe cannot seek back: RIFF/data sizes stay 0."""
    x = (sine(700, 0.25, 8000) * 32767).astype("<i2")
    header = bytearray(b"RIFF" + (0).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little"))
    header += (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (8000).to_bytes(4, "little")
    header += (16000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    header += b"data" + (0).to_bytes(4, "little")
    (tmp_path / "stream.bin").write_bytes(bytes(header) + x.tobytes())
    y = load_audio(f"cat {tmp_path / 'stream.bin'} |", sample_rate=None, table=True)
    assert np.allclose(y, x / 32768.0)


def test_wav_in_kaldi_ark(tmp_path: Path) -> None:
    """``file.ark:offset`` entries (Kaldi's wav-copy output), read through kaldiio."""
    import kaldiio

    x = (sine(300, 0.5, 8000) * 32767).astype(np.int16)
    kaldiio.save_ark(str(tmp_path / "w.ark"), {"s-u1": (8000, x)}, scp=str(tmp_path / "w.scp"))
    spec = (tmp_path / "w.scp").read_text().split()[1]
    reader = AudioReader(write_dir(tmp_path / "data", {"s-u1": spec}), sample_rate=None)
    assert np.allclose(reader.read("s-u1"), x / 32768.0)
    assert reader.duration("s-u1") == pytest.approx(0.5)
    assert len(load_audio(spec, 16000, table=True)) == 8000


def test_failing_pipe_names_utt_command_stderr_and_exit_code(tmp_path: Path) -> None:
    cmd = f"{shlex.quote(sys.executable)} -c \"import sys; sys.stderr.write('boom: no such input'); sys.exit(3)\" |"
    reader = AudioReader(write_dir(tmp_path / "data", {"spk9-bad": cmd}))
    with pytest.raises(UtteranceError) as err:
        reader.read("spk9-bad")
    msg = str(err.value)
    assert "spk9-bad" in msg and "sys.exit(3)" in msg and "exit code 3" in msg and "boom: no such input" in msg
    assert err.value.utt == "spk9-bad"


def test_pipe_writing_no_audio(tmp_path: Path) -> None:
    with pytest.raises(UtteranceError, match="no audio"):
        load_audio("true |", utt="u", table=True)
    with pytest.raises(UtteranceError, match="cannot decode"):
        load_audio("echo not-audio |", utt="u", table=True)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "prctl"])
def test_a_pipe_command_does_not_outlive_its_reader(stop: signal.Signals, setpriv: bool) -> None:
    """A reader SIGKILLed (a job's worker, gone with its job) or stopped by Ctrl-C while a
    ``cmd1 | cmd2 |`` entry runs: every process of the command ends, though neither would for
    an hour.  Before, both stayed; the test waits for them, not for a time.  Both ways of
    arming the guard: util-linux's ``setpriv``, and ``prctl`` where it is missing."""
    if setpriv and shutil.which("setpriv") is None:
        pytest.skip("no setpriv here (util-linux)")
    e = env()
    e["PYTHONPATH"] = str(ROOT)
    hide = "" if setpriv else "import shutil; shutil.which = lambda *a, **k: None; "
    reader = start_from_a_terminal(
        [sys.executable, "-c", f"{hide}from spkflow.data.audio import load_audio; "
         "load_audio('sleep 3600 | sleep 3600 |', utt='u1', table=True)"],
        env=e,
    )  # fmt: skip
    sleeps: list[int] = []
    try:
        deadline = time.time() + 120
        while len(sleeps) < 2 and reader.poll() is None and time.time() < deadline:
            sleeps = [p for p in process_tree(reader.pid) if _comm(p) == "sleep"]
            time.sleep(0.05)
        assert len(sleeps) == 2, f"the reader never started its command: {reader.communicate()}"
        os.kill(reader.pid, stop)
        reader.communicate()
        deadline = time.time() + 60
        while any(map(process_alive, sleeps)) and time.time() < deadline:
            time.sleep(0.05)
        assert not any(map(process_alive, sleeps)), "the command outlived its reader"
    finally:
        reader.kill()
        reader.communicate()
        for p in sleeps:
            if process_alive(p):
                os.kill(p, signal.SIGKILL)


def test_missing_file_names_utt_and_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "x.flac"
    reader = AudioReader(write_dir(tmp_path / "data", {"spk1-x": str(missing)}))
    with pytest.raises(UtteranceError) as err:
        reader.read("spk1-x")
    assert "spk1-x" in str(err.value) and str(missing) in str(err.value) and "not found" in str(err.value)
    with pytest.raises(UtteranceError, match="spk1-x"):
        reader.duration("spk1-x")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
@pytest.mark.parametrize("fmt", ["flac", "wav"])
def test_corrupt_file_names_utt_and_path(tmp_path: Path, damage: str, fmt: str) -> None:
    path = tmp_path / f"bad.{fmt}"
    sf.write(path, sine(200, 1.0, 16000), 16000, subtype="PCM_16")
    raw = path.read_bytes()
    path.write_bytes({"garbage": b"\x13\x37" * 500, "truncated": raw[: len(raw) // 2], "empty": b""}[damage])
    reader = AudioReader(write_dir(tmp_path / "data", {"spk2-bad": str(path)}))
    # durations come from headers: a truncated FLAC keeps a valid header, only decoding finds it
    ops = (reader.read,) if (damage, fmt) == ("truncated", "flac") else (reader.duration, reader.read)
    for op in ops:
        with pytest.raises(UtteranceError) as err:
            op("spk2-bad")
        assert "spk2-bad" in str(err.value) and str(path) in str(err.value)
    if damage == "truncated" and fmt == "wav":
        assert "truncated" in str(err.value)


def test_resample_8k_to_16k_keeps_frequency_and_amplitude() -> None:
    x = sine(1000, 1.0, 8000, amp=0.5)
    y = resample(x, 8000, 16000)
    assert y.dtype == np.float32 and len(y) == 16000
    assert abs(peak_freq(y, 16000) - 1000) <= 1.0
    mid = y[2000:-2000]  # away from the filter's edge effects
    assert np.max(np.abs(mid)) == pytest.approx(0.5, abs=0.005)
    assert np.sqrt(np.mean(mid**2)) == pytest.approx(0.5 / math.sqrt(2), rel=0.005)
    # the image of 3 kHz at 5 kHz must be suppressed (band-limited interpolation, not zero-order hold)
    z = resample(sine(3000, 1.0, 8000), 8000, 16000)[2000:-2000]
    spec = np.abs(np.fft.rfft(z * np.hanning(len(z))))
    f = np.fft.rfftfreq(len(z), 1 / 16000)
    image = spec[np.argmin(np.abs(f - 5000))] / spec[np.argmin(np.abs(f - 3000))]
    assert 20 * np.log10(image) < -50


def test_resample_rational_and_identity() -> None:
    x = sine(440, 0.5, 44100)
    y = resample(x, 44100, 16000)
    assert len(y) == 8000 and abs(peak_freq(y, 16000) - 440) <= 2.0
    assert resample(x, 44100, 44100) is not None and np.array_equal(resample(x, 44100, 44100), x)
    with pytest.raises(ValueError):
        resample(x, 0, 16000)


def test_reader_resamples_8k_files(tmp_path: Path) -> None:
    sf.write(tmp_path / "d.flac", sine(500, 0.5, 8000), 8000)
    reader = AudioReader(write_dir(tmp_path / "data", {"george-0_george_0": str(tmp_path / "d.flac")}))
    y = reader.read("george-0_george_0")
    assert len(y) == 8000 and abs(peak_freq(y, 16000) - 500) <= 2.0
    native, rate = reader.read_native("george-0_george_0")
    assert rate == 8000 and len(native) == 4000
    assert AudioReader(tmp_path / "data", sample_rate=None).read("george-0_george_0").shape == (4000,)


def test_segments_seek_into_files_and_pipes(tmp_path: Path) -> None:
    rate = 16000
    x = np.concatenate([sine(300, 1.0, rate), sine(900, 1.0, rate), sine(2000, 0.5, rate)])
    sf.write(tmp_path / "rec.flac", x, rate)
    wav = {"rec1": str(tmp_path / "rec.flac"), "rec2": f"cat {tmp_path / 'rec.flac'} |"}
    segs = {
        "a-1": "rec1 0.0 1.0",
        "a-2": "rec1 1.0 2.0",
        "a-3": "rec1 2.0 -1",
        "b-1": "rec2 0.3 1.0",
        "b-2": "rec2 2.0 2.7",
    }  # b-2 ends 0.2 s past the end: truncated
    reader = AudioReader(write_dir(tmp_path / "data", wav, segs))
    assert reader.keys() == sorted(segs)
    assert abs(peak_freq(reader.read("a-1"), rate) - 300) <= 2
    assert abs(peak_freq(reader.read("a-2"), rate) - 900) <= 2
    a3 = reader.read("a-3")
    assert len(a3) == rate // 2 and abs(peak_freq(a3, rate) - 2000) <= 2
    b1 = reader.read("b-1")
    assert len(b1) == int(0.7 * rate) and np.allclose(b1, x[int(0.3 * rate) : rate], atol=1e-4)
    assert len(reader.read("b-2")) == rate // 2
    durs = utt2dur(tmp_path / "data")
    assert durs == pytest.approx({"a-1": 1.0, "a-2": 1.0, "a-3": 0.5, "b-1": 0.7, "b-2": 0.5})


def test_segment_outside_recording_and_bad_segments_line(tmp_path: Path) -> None:
    sf.write(tmp_path / "rec.wav", sine(300, 1.0, 16000), 16000)
    d = write_dir(tmp_path / "data", {"r": str(tmp_path / "rec.wav")}, {"s-1": "r 1.2 2.0", "s-2": "r 0.0 2.0"})
    reader = AudioReader(d)
    with pytest.raises(UtteranceError, match="s-1.*after the end"):
        reader.read("s-1")
    with pytest.raises(UtteranceError, match="s-2.*more than 0.5 s"):
        reader.read("s-2")
    (d / "segments").write_text("s-1 r 0.0 0.5\ns-2 r zero 0.5\n")
    with pytest.raises(InputError, match=r"segments:2: .*not numbers"):
        AudioReader(d)
    (d / "segments").write_text("s-1 other 0.0 0.5\n")
    with pytest.raises(InputError, match=r"segments:1: .*'other'"):
        AudioReader(d)


def test_utt2dur_from_headers_is_written_sorted(tmp_path: Path) -> None:
    lines = {}
    for i, (secs, rate) in enumerate([(0.75, 16000), (1.25, 8000), (0.5, 22050)]):
        path = tmp_path / f"u{i}.{'flac' if i % 2 else 'wav'}"
        sf.write(path, sine(440, secs, rate), rate)
        lines[f"spk{2 - i}-u{i}"] = str(path)
    d = write_dir(tmp_path / "data", lines)
    out = write_utt2dur(d)
    text = out.read_text().splitlines()
    assert [ln.split()[0] for ln in text] == sorted(lines)
    got = {k: float(v) for k, v in (ln.split() for ln in text)}
    assert got == pytest.approx({"spk2-u0": 0.75, "spk1-u1": 1.25, "spk0-u2": 0.5}, abs=1e-5)


def test_unknown_utterance_is_a_key_error(speakers: Path) -> None:
    reader = AudioReader(speakers)
    assert len(reader) == 12
    with pytest.raises(KeyError, match="nope"):
        reader.read("nope")


def test_known_durations_never_run_a_pipe(tmp_path: Path) -> None:
    """Headers and segment times (``-1`` resolved against the recording) are used, a pipe is
    None rather than run; utt2dur, else utt2num_frames (10 ms frames), wins when present."""
    sf.write(tmp_path / "r.wav", sine(300, 2.0, 16000), 16000)
    marker = tmp_path / "ran"
    d = write_dir(
        tmp_path / "d",
        {"r": str(tmp_path / "r.wav"), "p": f"touch {marker}; cat {tmp_path / 'r.wav'} |"},
        segments={"s-a": "r 0.5 1.25", "s-b": "r 1.5 -1", "s-p": "p 0 1"},
    )
    got = known_durations(d, ["s-a", "s-b", "s-p"])
    assert got["s-a"] == pytest.approx(0.75) and got["s-b"] == pytest.approx(0.5) and got["s-p"] is None
    assert not marker.exists()
    (d / "utt2num_frames").write_text("s-a 123\ns-b 7\n")
    assert known_durations(d, ["s-a", "s-b", "s-p"]) == {"s-a": 1.23, "s-b": 0.07, "s-p": None}
    (d / "utt2dur").write_text("s-a 9.5\n")
    assert known_durations(d, ["s-a", "s-b"]) == {"s-a": 9.5, "s-b": None}


@pytest.mark.parametrize("ext,codec", [(".m4a", "aac"), (".webm", "libopus"), (".wma", "wmav2")])
def test_a_file_only_ffmpeg_decodes_reads_as_its_wav_scp_pipe(tmp_path: Path, ext: str, codec: str) -> None:
    """m4a / webm / wma named directly (as verify, identify and the API name files) decode to the
    samples of the wav.scp pipe make_data_dir writes for them; a path with spaces; duration
    from ffmpeg's header; a broken one is named."""
    import subprocess

    from spkflow.data.audio import read_audio, spec_duration
    from spkflow.data.ffmpeg import default_ffmpeg, ffmpeg_pipe, probe_ffmpeg

    rng = np.random.default_rng(3)
    t = np.arange(int(1.3 * 44100)) / 44100
    src = tmp_path / "src.wav"
    sf.write(src, np.stack([0.3 * np.sin(2 * np.pi * 300 * t), 0.05 * rng.standard_normal(t.size)], 1), 44100)
    f = tmp_path / f"my note{ext}"
    subprocess.run([default_ffmpeg(), "-nostdin", "-v", "error", "-i", src, "-c:a", codec, f], check=True)
    wave, rate = read_audio(str(f), utt="u1")
    rate_hdr, seconds = probe_ffmpeg(default_ffmpeg(), str(f))
    piped, piped_rate = read_audio(ffmpeg_pipe(default_ffmpeg(), str(f), rate_hdr), utt="u1", table=True)
    assert rate == piped_rate == rate_hdr and np.array_equal(wave, piped) and wave.dtype == np.float32
    assert abs(wave.size / rate - 1.3) < 0.1 and spec_duration(str(f)) == pytest.approx(seconds)
    corrupt = tmp_path / f"corrupt{ext}"
    corrupt.write_bytes(b"\x00\x01" * 100)
    with pytest.raises(UtteranceError, match="ffmpeg cannot decode it") as err:
        read_audio(str(corrupt), utt="u2")
    assert str(corrupt) in str(err.value)
    with pytest.raises(UtteranceError, match="not found"):
        read_audio(str(tmp_path / f"none{ext}"))
