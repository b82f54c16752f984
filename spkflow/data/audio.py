"""Audio access for Kaldi data directories: ``wav.scp`` (+ ``segments``) -> float32 waveforms.

What it guarantees
------------------
* :meth:`AudioReader.read` returns a 1-D ``float32`` array in ``[-1, 1]`` at the reader's
  sample rate, whatever the source: a path in any format libsndfile reads (WAV, FLAC, OGG,
  MP3, ...) or of an extension only ffmpeg decodes (m4a, aac, wma, webm: :mod:`spkflow.data.ffmpeg`,
  the arguments of make_data_dir's ``wav.scp`` pipes, so a file named directly gives stage 5's
  samples), and in a Kaldi table also a ``command |`` pipe whose stdout is audio bytes or a Kaldi
  extended filename ``file.ark:OFFSET`` (wav data written by ``wav-copy``; read with kaldiio).
  Every entry point (data dirs, ``verify``, ``identify``, the API) reads through :func:`read_audio`.
* **Who may run commands.**  A ``cmd |`` entry is run (``sh -c``), and ``file.ark:OFFSET`` read
  from an ark, only where a ``wav.scp`` is read as a Kaldi table: :class:`AudioReader` over a
  data dir (the stages, ``--data``, ``--enrol``), and the callers that pass ``table=True`` for a
  recording dir's ``wav.scp``.  A path a user types, lists (a pairs file, a list) or passes to
  the API is a path (``table=False``, the default): ``"touch x |"`` is a file of that name or
  "not found", never a command (Kaldi's readers and ``kaldiio.load_mat`` run any ``... |``).
* A file that cannot be read says why in words: not found, a directory, permission denied (for
  this user); names that are not UTF-8 are read as the bytes they are.
* ``segments`` (``utt rec start end``, seconds) are honoured; ``end == -1`` means "to the end of
  the recording", and an ``end`` at most 0.5 s past the end is truncated silently (both as
  Kaldi's ``extract-segments``).  Sample positions are *rounded* (``round(t * rate)``), where
  Kaldi truncates: ``0.3 * 16000`` is ``4799.9999...`` in floating point and truncating loses a
  sample.  Segments of files are read by seeking, without decoding the whole recording;
  segments of pipes decode the recording once and reuse it for consecutive segments.
* Multi-channel audio: channel 0 is used (Kaldi's ``--channel=0``); the choice is fixed so that
  features never depend on a downmix that differs between tools.
* Float-format files are clipped to ``[-1, 1]``; integer PCM is scaled by ``1 / 2**(bits-1)``
  (soundfile's convention, the same numbers as Kaldi's ``int16 / 32768``).
* Every failure on one utterance raises :class:`spkflow.core.errors.UtteranceError` naming the
  utterance and its source (path, or command with its exit status and the tail of its stderr):
  a missing file, an unreadable or corrupt file, a WAV file shorter than its header says (an
  interrupted copy, which libsndfile would read silently as a shorter utterance), a failing
  pipe, empty audio, a segment outside its recording.  A compressed file (MP3, OGG) that decodes
  to clearly less than its header says is read as far as it goes: :func:`truncation` is the one
  rule that names it (``make_data_dir``'s decode check; the ``note`` of ``verify`` / ``identify``).
* Resampling (:func:`spkflow.data.resample.resample`, its own module) is band-limited polyphase
  filtering (``scipy.signal.resample_poly``) with exact integer ratios: ``len(out) == ceil(len(x)
  * new / orig)``; its measured passband and image rejection against torchaudio's default are in
  docs/audio.md.
* Durations (:meth:`AudioReader.duration`, and the data dir's tables of them in
  :mod:`spkflow.data.durations`) come from file headers without decoding (``soundfile.info``),
  from ``segments`` arithmetic when present, and by decoding only for pipes and ark entries.
  Header-only means a FLAC file cut short is found when it is read, not by ``utt2dur``
  (a cut WAV is found by both).

Compared with Kaldi's ``extract-segments`` + ``wav-to-duration`` and ESPnet's ``SoundScpReader``:
docs/audio.md.
"""

from __future__ import annotations

import io
import os
import re
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.ffmpeg import decode_file, default_ffmpeg, is_ffmpeg_file, probe_ffmpeg
from spkflow.data.pipes import decode_output, is_pipe, pipe_command, run_pipe
from spkflow.data.resample import resample
from spkflow.data.tables import read_kv

__all__ = [
    "AudioReader",
    "ark_location",
    "check_file",
    "decode_audio_bytes",
    "FileSpan",
    "OpenSamples",
    "ReadWhole",
    "Segment",
    "load_audio",
    "read_audio",
    "resample",
    "shown_path",
    "shortfall",
    "spec_duration",
    "truncation",
]

#: how far (seconds) a segment's end may run past the recording before it is an error (Kaldi: 0.5)
MAX_OVERSHOOT = 0.5
_ARK_RE = re.compile(r"^(?P<path>.+):(?P<offset>\d+)$")


@dataclass(frozen=True)
class FileSpan:
    """Where an utterance's samples lie in an audio file (:meth:`AudioReader.file_span`):
    ``frames`` samples from sample ``offset`` of ``path``, at ``rate`` (the file's own).
    ``exact``: a PCM or float WAV, or a FLAC, whose samples read from any sample on
    (:meth:`AudioReader.read_span`) are those of the whole file decoded, bit for bit."""

    path: str
    offset: int
    frames: int
    rate: int
    exact: bool


class ReadWhole(Exception):
    """An :class:`OpenSamples` whose file gave other samples than its header promised: read the
    utterance with :meth:`AudioReader.read`, which says what is wrong (or reads what is there)."""

    def __init__(self, utt: str) -> None:
        super().__init__(utt)
        self.utt = utt


class OpenSamples:
    """An utterance's 16-bit samples left in their open file (:meth:`AudioReader.open_samples`),
    to be written straight into a row of a batch: :meth:`read_into` gives ``out`` the values
    :meth:`AudioReader.read` returns, bit for bit, without the float32 array in between (stage 5
    with the fbank on the device, two workers: 0.28 -> 0.17 ms of CPU a 6 s WAV, docs/gpu.md).
    Only ``shape`` and ``ndim`` of an array: a batch can be planned and padded before the read."""

    ndim = 1

    def __init__(self, utt: str, f: sf.SoundFile, offset: int, frames: int) -> None:
        self.utt, self._file, self.offset, self.shape = utt, f, offset, (frames,)

    def read_into(self, out: np.ndarray) -> None:
        """Write the samples (float32 in [-1, 1)) into ``out`` (their count) and close the file;
        :class:`ReadWhole` when the file gives fewer or cannot be read."""
        f, self._file = self._file, None
        if f is None:
            raise ReadWhole(self.utt)
        try:
            with f:
                if self.offset:
                    f.seek(self.offset)
                data = f.read(self.shape[0], dtype="int16", always_2d=True)
        except Exception:  # noqa: BLE001  (the reader, reading it whole, says what it is)
            raise ReadWhole(self.utt) from None
        if data.shape[0] != self.shape[0]:
            raise ReadWhole(self.utt)
        np.multiply(data[:, 0], PCM16_SCALE, out=out)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(frozen=True)
class Segment:
    """One line of ``segments``: ``utt rec start end`` (seconds; ``end == -1``: to the end)."""

    recording: str
    start: float
    end: float


# --------------------------------------------------------------------------- decoding


def shown_path(path: str) -> str:
    """A path as text for a message: bytes that are not UTF-8 (read with ``surrogateescape``)
    written as ``\\xNN``."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _not_found_hint(path: str) -> str:
    """What a path that is no file but reads like a Kaldi table entry is: a command or an ark
    offset is honoured only in a wav.scp (see the module doc)."""
    if is_pipe(path):
        return (
            f"; {path.strip()!r} is not a file: commands ('cmd |') are run only from a data dir's wav.scp "
            "(verify / identify --data DATA_DIR; AudioReader in Python), never from a path"
        )
    if _ARK_RE.match(path.strip()):
        return "; Kaldi's 'file.ark:offset' is read only from a data dir's wav.scp (verify / identify --data DATA_DIR)"
    return ""


def check_file(path: str, utt: str, *, table: bool = False) -> None:
    """:class:`UtteranceError` naming ``path`` and why, unless it is a file this process can read:
    not found (for a path that is no ``table`` entry, saying that a ``cmd |`` or
    ``file.ark:offset`` is honoured only in a wav.scp), a directory, a device or named pipe given
    as a path (a ``table`` entry may name one, as Kaldi's may), permission denied."""
    shown = shown_path(path)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        hint = "" if table else _not_found_hint(path)
        raise UtteranceError(utt, shown, "audio file not found" + hint) from None
    except OSError as exc:  # EACCES on a folder of the path, ELOOP, ...
        raise UtteranceError(utt, shown, f"cannot open it: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UtteranceError(utt, shown, "is a directory, not an audio file")
    if not table and not stat.S_ISREG(st.st_mode):
        raise UtteranceError(utt, shown, "is not a regular file (a device or a named pipe): give an audio file")
    if not os.access(path, os.R_OK):
        raise UtteranceError(utt, shown, "permission denied: this user may not read it")


def ark_location(spec: str) -> tuple[str, int] | None:
    """``file.ark:123`` -> (file.ark, 123) when the file exists and the spec itself is no file."""
    m = _ARK_RE.match(spec)
    if m is None or os.path.exists(spec):
        return None
    path = m.group("path")
    return (path, int(m.group("offset"))) if os.path.isfile(path) else None


def to_mono_float(data: np.ndarray, utt: str, source: str) -> np.ndarray:
    """[frames] or [frames, channels] (float or signed int) -> float32 [frames], channel 0, in [-1, 1]."""
    if data.ndim == 2:
        data = data[:, 0]
    if data.dtype.kind == "i":  # integer PCM (kaldiio): scale like soundfile, int16 / 32768
        out = data.astype(np.float32) / float(2 ** (data.dtype.itemsize * 8 - 1))
    else:
        out = np.asarray(data, dtype=np.float32)
    if not out.size:
        return out
    # two passes, not three: a NaN makes the maximum NaN, an infinity the maximum or the minimum
    # infinite (10 us of a 6 s utterance's ~150 us read, 2-core VM)
    hi, lo = out.max(), out.min()
    if not (np.isfinite(hi) and np.isfinite(lo)):
        raise UtteranceError(utt, source, "audio contains NaN or infinite samples")
    if hi > 1.0 or lo < -1.0:  # integer PCM never is: no copy then
        out = np.clip(out, -1.0, 1.0)
    return out


def _wav_truncation(path: str) -> str | None:
    """For a RIFF/WAVE file: a message when its data chunk declares more bytes than the file
    holds (an interrupted copy; libsndfile silently reads what is there), else None."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            pos = 12
            while pos + 8 <= size:
                f.seek(pos)
                chunk = f.read(8)
                cid, n = chunk[:4], struct.unpack("<I", chunk[4:8])[0]
                if cid == b"data":
                    if n not in (0, 0xFFFFFFFF) and pos + 8 + n > size:
                        return (
                            f"file is truncated: its header declares {n} bytes of audio, "
                            f"the file holds {size - pos - 8}"
                        )
                    return None
                pos += 8 + n + (n & 1)
    except OSError:
        return None
    return None


def truncation(decoded: int, header: int, rate: int) -> str | None:
    """The note for a file that decodes to clearly fewer samples than its header states (short by
    more than 2048 samples and 1 %: an MP3 or OGG cut short, which decodes without an error), or
    None.  The one rule of ``make_data_dir``'s decode check and of :func:`shortfall`."""
    if header - decoded > max(2048, header // 100):
        return f"truncated: decodes to {decoded / rate:.2f} s of the {header / rate:.2f} s its header says"
    return None


def shortfall(path: str, decoded: int, rate: int) -> str | None:
    """:func:`truncation` of a file read whole (``decoded`` samples at ``rate``) against its header
    (libsndfile's, no decoding); None when it is whole or its header cannot be read."""
    try:
        header = int(sf.info(os.fsencode(path)).frames)
    except Exception:  # noqa: BLE001  (then it could not have been read: the reader named it)
        return None
    return truncation(decoded, header, rate)


#: libsndfile's scale of 16-bit samples (a power of two: int16 x this in float32 is exact)
PCM16_SCALE = np.float32(1 / 32768)


def _read_float(f: sf.SoundFile, frames: int = -1) -> np.ndarray:
    """``frames`` of an open file as float32 [frames, channels], as libsndfile scales them; 16-bit
    PCM read as int16, scaled here by 1 / 32768 (libsndfile's factor, a power of two: the same bits)
    in a third to a half of libsndfile's time for a 16-bit WAV (docs/gpu.md, 16-bit audio)."""
    if f.subtype == "PCM_16":
        return np.multiply(f.read(frames, dtype="int16", always_2d=True), PCM16_SCALE, dtype=np.float32)
    return f.read(frames, dtype="float32", always_2d=True)


def read_file(
    path: str, utt: str, start: int = 0, stop: int | None = None, *, table: bool = False
) -> tuple[np.ndarray, int]:
    """Samples ``[start, stop)`` of an audio file libsndfile reads -> ([frames, channels] float32,
    rate); :class:`UtteranceError` naming the file (:func:`check_file`, a WAV cut short, a
    decoder error).  ``table``: ``path`` is a wav.scp entry (only changes the messages)."""
    check_file(path, utt, table=table)
    problem = _wav_truncation(path)
    if problem is not None:
        raise UtteranceError(utt, shown_path(path), problem)
    try:
        with sf.SoundFile(os.fsencode(path)) as f:
            rate = f.samplerate
            if start:
                f.seek(start)
            frames = -1 if stop is None else max(0, stop - start)
            data = _read_float(f, frames)
    except UtteranceError:
        raise
    except Exception as exc:
        raise UtteranceError(utt, shown_path(path), f"cannot read audio: {exc}") from exc
    return data, int(rate)


def _decode_spec(spec: str, utt: str, table: bool) -> tuple[np.ndarray, int, str]:
    """Decode a whole recording -> ([frames, channels] float32, rate, source name): a wav.scp
    entry (``table``: stripped; a pipe is run, an ark offset read) or a path (as it is)."""
    if table:
        spec = spec.strip()
        if not spec:
            raise UtteranceError(utt, "wav.scp", "empty wav.scp entry")
        if is_pipe(spec):
            command = pipe_command(spec)
            data, rate = decode_output(run_pipe(command, utt), utt, f"{command} |")
            return data, rate, f"{command} |"
        ark = ark_location(spec)
        if ark is not None:
            try:
                import kaldiio

                rate, data = kaldiio.load_mat(spec)
            except Exception as exc:
                raise UtteranceError(utt, spec, f"cannot read wav from ark: {exc}") from exc
            data = np.asarray(data)
            return (data if data.ndim == 2 else data[:, None]), int(rate), spec
    elif not spec:
        raise UtteranceError(utt, "''", "empty path")
    if is_ffmpeg_file(spec):
        check_file(spec, utt, table=table)
        data, rate = decode_output(decode_file(spec, utt), utt, shown_path(spec))
        return data, rate, shown_path(spec)
    data, rate = read_file(spec, utt, table=table)
    return data, rate, shown_path(spec)


def decode_audio_bytes(raw: bytes, utt: str, source: str) -> tuple[np.ndarray, int]:
    """Decode an encoded file held in memory (wav, flac, ogg: what libsndfile reads) -> (float32
    mono [-1, 1], rate); ``source`` names it in errors (e.g. a training shard's member)."""
    try:
        data, rate = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError/RuntimeError/TypeError
        raise UtteranceError(utt, source, f"cannot decode audio ({len(raw)} bytes): {exc}") from exc
    wave = to_mono_float(data, utt, source)
    if wave.size == 0:
        raise UtteranceError(utt, source, "audio has no samples")
    return wave, int(rate)


def read_audio(spec: str, utt: str = "<audio>", *, table: bool = False) -> tuple[np.ndarray, int]:
    """Decode one recording at its native rate -> (float32 mono [-1, 1], rate).

    ``spec`` is a path; with ``table=True`` it is an entry of a ``wav.scp`` read as a Kaldi table,
    where ``cmd |`` is run and ``file.ark:OFFSET`` read (see "Who may run commands" above)."""
    data, rate, source = _decode_spec(spec, utt, table)
    wave = to_mono_float(data, utt, source)
    if wave.size == 0:
        raise UtteranceError(utt, source, "audio has no samples")
    return wave, rate


def load_audio(spec: str, sample_rate: int | None = 16000, utt: str = "<audio>", *, table: bool = False) -> np.ndarray:
    """Decode one recording (a path; with ``table=True`` a wav.scp entry: also ``cmd |`` or
    ``file.ark:offset``) to float32 mono in [-1, 1], resampled to ``sample_rate`` (None: keep
    the native rate)."""
    wave, rate = read_audio(spec, utt, table=table)
    return wave if sample_rate is None else resample(wave, rate, sample_rate)


# --------------------------------------------------------------------------- durations


def spec_duration(spec: str, utt: str = "<audio>", *, table: bool = False) -> float:
    """Duration in seconds of one recording (a path; with ``table=True`` a wav.scp entry):
    header only for files, decoding for pipes/arks."""
    if table:
        spec = spec.strip()
    if not table or (not is_pipe(spec) and ark_location(spec) is None):
        check_file(spec, utt, table=table)
        shown = shown_path(spec)
        if is_ffmpeg_file(spec):
            try:
                return probe_ffmpeg(default_ffmpeg(), spec)[1]
            except (InputError, FileNotFoundError) as exc:
                raise UtteranceError(utt, shown, getattr(exc, "message", str(exc))) from None
        try:
            info = sf.info(os.fsencode(spec))
        except Exception as exc:
            raise UtteranceError(utt, shown, f"cannot read audio header: {exc}") from exc
        if info.frames <= 0 or info.samplerate <= 0:
            raise UtteranceError(utt, shown, "audio has no samples")
        if info.format == "WAV" and (problem := _wav_truncation(spec)) is not None:
            raise UtteranceError(utt, shown, problem)
        return info.frames / info.samplerate
    wave, rate = read_audio(spec, utt, table=True)
    return wave.shape[0] / rate


# --------------------------------------------------------------------------- data-dir reader


def _read_table(path: Path) -> list[tuple[str, str]]:
    """``(key, rest)`` in file order; InputError (file:line) on a malformed line or duplicate key."""

    return list(read_kv(path).items())


#: formats and subtypes libsndfile seeks in sample by sample, losslessly (FileSpan.exact)
_EXACT_FORMATS = ("WAV", "WAVEX", "FLAC")
_EXACT_SUBTYPES = ("FLOAT", "DOUBLE")


class AudioReader:
    """Random access to the utterances of a data dir (``wav.scp`` and optional ``segments``).

    >>> reader = AudioReader("data/test")          # doctest: +SKIP
    >>> x = reader.read(reader.keys()[0])          # float32, mono, 16 kHz
    """

    def __init__(self, data_dir: str | os.PathLike[str], sample_rate: int | None = 16000) -> None:
        self.data_dir = Path(data_dir)
        self.sample_rate = sample_rate
        wav_scp = self.data_dir / "wav.scp"
        if not wav_scp.is_file():
            raise InputError(wav_scp, None, "wav.scp not found")
        self._wav_scp_path = wav_scp
        self._wav: dict[str, str] = {}
        for key, rest in _read_table(wav_scp):
            self._wav[key] = rest
        self._segments: dict[str, Segment] | None = None
        seg_path = self.data_dir / "segments"
        if seg_path.is_file():
            self._segments = {}
            for lineno, (utt, rest) in enumerate(_read_table(seg_path), start=1):
                self._segments[utt] = self._parse_segment(seg_path, lineno, utt, rest)
        self._keys = list(self._segments if self._segments is not None else self._wav)
        self._cache: tuple[str, np.ndarray, int, str] | None = None  # last decoded recording
        self._rec_dur: dict[str, float] = {}

    def _parse_segment(self, path: Path, lineno: int, utt: str, rest: str) -> Segment:
        fields = rest.split()
        if len(fields) != 3:
            raise InputError(path, lineno, f"expected 'utt rec start end', got '{utt} {rest}'")
        rec = fields[0]
        try:
            start, end = float(fields[1]), float(fields[2])
        except ValueError:
            raise InputError(path, lineno, f"start/end are not numbers: '{utt} {rest}'") from None
        if rec not in self._wav:
            raise InputError(path, lineno, f"recording '{rec}' of segment '{utt}' is not in {self._wav_scp_path}")
        if start < 0 or (end != -1 and end <= start):
            raise InputError(path, lineno, f"bad segment times start={start} end={end} for '{utt}'")
        return Segment(rec, start, end)

    # mapping-like access
    def keys(self) -> list[str]:
        """Utterance ids in file order (segments ids when a ``segments`` file exists)."""
        return list(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __contains__(self, utt: object) -> bool:
        return utt in (self._segments if self._segments is not None else self._wav)

    def __getitem__(self, utt: str) -> np.ndarray:
        return self.read(utt)

    def source(self, utt: str) -> str:
        """Human-readable origin of ``utt``: its wav.scp entry, plus ``[start, end]`` for segments."""
        if self._segments is not None:
            seg = self._segment(utt)
            return f"{self._wav[seg.recording]} [{seg.start}, {seg.end}]"
        return self.entry(utt)

    @property
    def has_segments(self) -> bool:
        """Whether utterances are segments of recordings (the data dir has a ``segments`` file)."""
        return self._segments is not None

    def entry(self, utt: str) -> str:
        """The wav.scp entry of ``utt`` (a path or a command ending in ``|``)."""
        try:
            return self._wav[utt]
        except KeyError:
            raise KeyError(f"utterance '{utt}' is not in {self._wav_scp_path}") from None

    def _segment(self, utt: str) -> Segment:
        assert self._segments is not None
        try:
            return self._segments[utt]
        except KeyError:
            raise KeyError(f"utterance '{utt}' is not in {self.data_dir / 'segments'}") from None

    def read(self, utt: str) -> np.ndarray:
        """Waveform of ``utt``: float32 mono in [-1, 1] at ``sample_rate``."""
        wave, rate = self.read_native(utt)
        return wave if self.sample_rate is None else resample(wave, rate, self.sample_rate)

    def read_native(self, utt: str) -> tuple[np.ndarray, int]:
        """Waveform of ``utt`` at the recording's own rate -> (float32 mono, rate)."""
        if self._segments is None:
            return read_audio(self.entry(utt), utt, table=True)
        seg = self._segment(utt)
        spec = self._wav[seg.recording].strip()
        if not is_pipe(spec) and ark_location(spec) is None and not is_ffmpeg_file(spec):
            return self._read_file_segment(utt)
        data, rate, source = self._decoded_recording(seg.recording, spec, utt)
        start, stop = self._segment_bounds(utt, seg, data.shape[0], rate, source)
        return to_mono_float(data[start:stop], utt, source), rate

    def _decoded_recording(self, rec: str, spec: str, utt: str) -> tuple[np.ndarray, int, str]:
        if self._cache is not None and self._cache[0] == rec:
            return self._cache[1], self._cache[2], self._cache[3]
        data, rate, source = _decode_spec(spec, utt, table=True)
        self._cache = (rec, data, rate, source)
        return data, rate, source

    @staticmethod
    def _segment_bounds(utt: str, seg: Segment, frames: int, rate: int, source: str) -> tuple[int, int]:
        start = int(round(seg.start * rate))
        stop = frames if seg.end == -1 else int(round(seg.end * rate))
        if start >= frames:
            raise UtteranceError(
                utt, source, f"segment starts at {seg.start} s, after the end of the recording ({frames / rate:.3f} s)"
            )
        if stop > frames:
            if stop - frames > MAX_OVERSHOOT * rate:
                raise UtteranceError(
                    utt,
                    source,
                    f"segment ends at {seg.end} s, more than {MAX_OVERSHOOT} s "
                    f"after the end of the recording ({frames / rate:.3f} s)",
                )
            stop = frames
        return start, stop

    def _plain_file(self, utt: str) -> tuple[Segment | None, str] | None:
        """(``utt``'s segment or None, its file, checked: :func:`check_file`) where libsndfile reads
        it; None for a ``cmd |`` pipe, an ark entry or a file only ffmpeg decodes."""
        seg = self._segment(utt) if self._segments is not None else None
        spec = (self._wav[seg.recording] if seg is not None else self.entry(utt)).strip()
        if not spec or is_pipe(spec) or ark_location(spec) is not None or is_ffmpeg_file(spec):
            return None
        check_file(spec, utt, table=True)
        return seg, spec

    def file_span(self, utt: str) -> FileSpan | None:
        """Where the samples of ``utt`` lie in a file libsndfile reads (its header, no decoding;
        ``segments`` resolved as :meth:`read` resolves them), or None for a ``cmd |`` pipe, an ark
        entry or a file only ffmpeg decodes.  :class:`UtteranceError` naming the file when it is
        missing, its header unreadable or a WAV cut short, or the segment lies outside it."""
        found = self._plain_file(utt)
        if found is None:
            return None
        seg, spec = found
        shown = shown_path(spec)
        try:
            info = sf.info(os.fsencode(spec))
        except Exception as exc:
            raise UtteranceError(utt, shown, f"cannot read audio header: {exc}") from exc
        if info.format == "WAV" and (problem := _wav_truncation(spec)) is not None:
            raise UtteranceError(utt, shown, problem)
        start, stop = 0, int(info.frames)
        if seg is not None:
            start, stop = self._segment_bounds(utt, seg, stop, info.samplerate, spec)
        exact = info.format in _EXACT_FORMATS and (info.subtype.startswith("PCM_") or info.subtype in _EXACT_SUBTYPES)
        return FileSpan(spec, start, stop - start, int(info.samplerate), exact)

    def open_samples(self, utt: str) -> OpenSamples | None:
        """``utt``'s samples in their open file, to read into a batch (:class:`OpenSamples`): a
        16-bit WAV or FLAC at the reader's rate (or a segment of one), whose samples :meth:`read`
        would only scale.  None for anything else, and wherever :meth:`read` would fail or find
        the file short (a missing file, a header it cannot read, a WAV cut short, a segment
        outside it, no samples): :meth:`read` is then what reads it, and says why."""
        try:
            found = self._plain_file(utt)
            if found is None:
                return None
            seg, spec = found
            f = sf.SoundFile(os.fsencode(spec))
        except Exception:  # noqa: BLE001  (read() names it)
            return None
        try:
            rate = f.samplerate
            if (
                f.subtype != "PCM_16"
                or f.format not in _EXACT_FORMATS
                or (self.sample_rate is not None and rate != self.sample_rate)
                or (f.format != "FLAC" and _wav_truncation(spec) is not None)
            ):
                f.close()
                return None
            start, stop = 0, int(f.frames)
            if seg is not None:
                start, stop = self._segment_bounds(utt, seg, stop, rate, spec)
        except Exception:  # noqa: BLE001
            f.close()
            return None
        if stop <= start:
            f.close()
            return None
        return OpenSamples(utt, f, start, stop - start)

    def read_span(self, utt: str, span: FileSpan, start: int, stop: int) -> np.ndarray:
        """Samples ``[start, stop)`` of ``utt`` (counted from its first sample, at ``span.rate``),
        float32 mono in [-1, 1], by seeking; :class:`UtteranceError` naming the file when it holds
        fewer samples than its header says (a file cut short)."""
        data, _ = read_file(span.path, utt, span.offset + start, span.offset + stop, table=True)
        wave = to_mono_float(data, utt, shown_path(span.path))
        if wave.shape[0] != stop - start:
            raise UtteranceError(
                utt,
                shown_path(span.path),
                f"file is truncated: read {wave.shape[0]} of the {stop - start} samples "
                f"from sample {span.offset + start} (its header says {span.offset + span.frames} or more)",
            )
        return wave

    def _read_file_segment(self, utt: str) -> tuple[np.ndarray, int]:
        span = self.file_span(utt)
        assert span is not None  # a plain file (read_native's test)
        return self.read_span(utt, span, 0, span.frames), span.rate

    def recording_duration(self, rec: str) -> float:
        """Duration in seconds of recording ``rec`` of wav.scp (cached; header only for files)."""
        if rec not in self._rec_dur:
            self._rec_dur[rec] = spec_duration(self._wav[rec], rec, table=True)
        return self._rec_dur[rec]

    def duration(self, utt: str) -> float:
        """Duration of ``utt`` in seconds: from the file header, from segment times (``-1`` and
        overshoot resolved against the recording), or by decoding a pipe/ark entry."""
        if self._segments is None:
            self.entry(utt)
            try:
                return self.recording_duration(utt)
            except UtteranceError as exc:
                raise UtteranceError(utt, exc.source, exc.message) from None
        seg = self._segment(utt)
        try:
            total = self.recording_duration(seg.recording)
        except UtteranceError as exc:
            raise UtteranceError(utt, exc.source, exc.message) from None
        if seg.start >= total or (seg.end != -1 and seg.end - total > MAX_OVERSHOOT):
            raise UtteranceError(
                utt,
                self._wav[seg.recording],
                f"segment [{seg.start}, {seg.end}] lies outside the recording ({total:.3f} s)",
            )
        end = total if seg.end == -1 else min(seg.end, total)
        return end - seg.start
