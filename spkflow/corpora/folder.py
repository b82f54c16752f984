"""Your own recordings as a corpus: a folder (one subfolder per speaker) or a list of files ->
:class:`~spkflow.corpora.base.CorpusData`, written like every corpus by
:func:`~spkflow.corpora.base.write_data_dir`.  The front end is ``python -m
spkflow.bin.make_data_dir AUDIO_DIR DATA_DIR``.

Rules
-----
* **Which files**: every file under the folder (any depth, hidden ones skipped) whose extension
  libsndfile reads (:data:`SNDFILE_EXTENSIONS`: wav, flac, ogg / opus, mp3, aiff, ...) or ffmpeg
  decodes in a ``wav.scp`` pipe (:data:`FFMPEG_EXTENSIONS`: m4a, mp4, aac, wma, webm; the
  ffmpeg of the pinned ``imageio-ffmpeg``, as the VoxCeleb2 recipe).  Or the files a list names:
  ``path [speaker]`` per line (tab-separated when paths hold spaces), relative paths against the
  list's folder.
* **Speaker**: the first folder of the file's path below the root; ``speaker_regex`` instead
  (``re.search`` on the path relative to the root, ``/``-separated; group ``spk`` or the first
  group, else the whole match).  A file without one (at the top level, or a list line without a
  speaker) is its own speaker, Kaldi's convention for unknown speakers.
* **Utterance ids**: the speaker, ``-``, the file name without extension (kept as it is when it
  already starts with ``<speaker>-``, as LibriSpeech's do); when two files of one speaker share
  a name, with their last two folders before it (``/`` -> ``-``).  White space in ids
  becomes ``_``.  Unique, or an error naming both files.
* **Checked, not decoded**: each file's header (libsndfile; ffmpeg's stream line for the piped
  formats) gives its rate and duration, so a folder of hours is read in seconds; a file whose
  header cannot be read, or a WAV shorter than its header says, is an error naming it, or with
  ``skip_bad`` left out and listed (:attr:`FolderReport.bad`).
* :class:`FolderReport` gives the counts, durations and rates seen, and names the files whose
  rate is below the model's (they are upsampled: no energy above half their rate, and the same
  recording at 8 and 16 kHz scores only 0.78-0.84 cosine with the demo model).

Anchor: Kaldi's and ESPnet's ``local/data.sh`` scripts, one per corpus, and lhotse's
``RecordingSet.from_dir`` (recordings only: no speakers, no checks).  Here one command covers any
folder of speakers, and nothing is dropped silently.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import soundfile as sf

from spkflow.core.errors import InputError, UtteranceError
from spkflow.corpora.base import CorpusData, Utterance
from spkflow.data.audio import spec_duration
from spkflow.data.ffmpeg import FFMPEG_EXTENSIONS, ffmpeg_pipe, probe_ffmpeg
from spkflow.data.tables import WHITESPACE

__all__ = [
    "FFMPEG_EXTENSIONS",
    "SNDFILE_EXTENSIONS",
    "FolderReport",
    "collect_folder",
    "probe_ffmpeg",
]

log = logging.getLogger(__name__)

#: read by libsndfile directly (1.2: MP3 and Opus included)
SNDFILE_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".au", ".caf", ".w64")


@dataclass
class FolderReport:
    """What was found: per-file rates, bad files (path -> reason), own-speaker files, notes."""

    rates: Counter[int] = field(default_factory=Counter)
    low_rate: dict[int, list[str]] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    own_speaker: int = 0
    durations: list[float] = field(default_factory=list)

    def lines(self, model_rate: int) -> list[str]:
        """The summary the command logs: rates and duration range, then warnings."""
        d = sorted(self.durations)
        out = []
        if d:
            med = d[len(d) // 2]
            out.append(
                f"durations {d[0]:.2f}-{d[-1]:.2f} s (median {med:.2f} s, total {sum(d) / 3600:.2f} h); rates: "
                + ", ".join(f"{r} Hz x {n}" for r, n in sorted(self.rates.items()))
            )
        for rate, files in sorted(self.low_rate.items()):
            out.append(
                f"WARNING: {len(files)} file(s) at {rate} Hz, below the model's {model_rate} Hz: they are upsampled "
                f"(no energy above {rate // 2} Hz; a recording at 8 and at 16 kHz scores only ~0.8 cosine with "
                f"itself), e.g. {files[0]}"
            )
        if self.own_speaker:
            out.append(f"{self.own_speaker} file(s) without a speaker folder: each is its own speaker")
        if self.bad:
            first = next(iter(self.bad.items()))
            out.append(f"WARNING: {len(self.bad)} unreadable file(s) left out (bad_files), e.g. {first[0]}: {first[1]}")
        return out


def _clean(s: str) -> str:
    return "".join("_" if c in WHITESPACE else c for c in s)


def _header(path: Path, ffmpeg: str | None) -> tuple[str, int, float]:
    """(wav.scp entry, native rate, seconds) of one file."""
    if path.suffix.lower() in FFMPEG_EXTENSIONS:
        if ffmpeg is None:
            from spkflow.data.ffmpeg import default_ffmpeg

            ffmpeg = default_ffmpeg()
        rate, seconds = probe_ffmpeg(ffmpeg, str(path))
        return ffmpeg_pipe(ffmpeg, str(path), rate), rate, seconds
    try:
        info = sf.info(str(path))
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError / TypeError
        raise InputError(path, None, f"cannot read the audio header: {exc}") from None
    if info.frames <= 0 or info.samplerate <= 0:
        raise InputError(path, None, "no audio samples")
    if info.format == "WAV":
        spec_duration(str(path), str(path))  # UtteranceError for a WAV cut short
    return str(path), int(info.samplerate), info.frames / info.samplerate


def _walk(root: Path) -> list[Path]:
    exts = SNDFILE_EXTENSIONS + FFMPEG_EXTENSIONS
    found = []
    for d, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        found += [Path(d) / f for f in sorted(files) if not f.startswith(".") and f.lower().endswith(exts)]
    return found


def _read_list(path: Path) -> list[tuple[Path, str | None, int]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            text = line.rstrip("\n")
            fields = text.split("\t") if "\t" in text else text.split()
            fields = [x.strip() for x in fields if x.strip()]
            if len(fields) not in (1, 2):
                raise InputError(
                    path, n, f"expected 'path [speaker]' (tab-separated for paths with spaces), got {text!r}"
                )
            p = Path(fields[0])
            out.append((p if p.is_absolute() else path.parent / p, fields[1] if len(fields) == 2 else None, n))
    if not out:
        raise InputError(path, None, "no files listed")
    return out


def collect_folder(
    root: str | os.PathLike[str] | None = None,
    *,
    list_file: str | os.PathLike[str] | None = None,
    speaker_regex: str | None = None,
    model_rate: int = 16000,
    skip_bad: bool = False,
    ffmpeg: str | None = None,
) -> tuple[CorpusData, FolderReport]:
    """The recordings of ``root`` (or of ``list_file``) with speakers and durations, and what
    was seen (see the module docstring).  :class:`InputError` names a bad file, a file the
    regex does not match, or two files that would get one id."""
    if (root is None) == (list_file is None):
        raise ValueError("give a folder or a list of files, not both")
    pattern = re.compile(speaker_regex) if speaker_regex else None
    if pattern is not None and list_file is not None:
        raise ValueError("--speaker-regex applies to a folder; a list names its speakers itself")
    entries: list[tuple[Path, str | None, str]] = []  # (path, speaker, where: for errors)
    if list_file is not None:
        lst = Path(list_file)
        entries = [(p, spk, f"{lst}:{n}") for p, spk, n in _read_list(lst)]
    else:
        top = Path(root)  # type: ignore[arg-type]
        if not top.is_dir():
            raise InputError(top, None, "not a folder")
        for p in _walk(top):
            rel = p.relative_to(top).as_posix()
            spk: str | None
            if pattern is not None:
                m = pattern.search(rel)
                if m is None:
                    raise InputError(p, None, f"path {rel!r} does not match --speaker-regex {speaker_regex!r}")
                spk = m.groupdict().get("spk") or (m.group(1) if m.re.groups else m.group(0))
            else:
                spk = rel.split("/")[0] if "/" in rel else None
            entries.append((p, spk, str(p)))
        if not entries:
            raise InputError(top, None, f"no audio files ({', '.join(SNDFILE_EXTENSIONS + FFMPEG_EXTENSIONS)})")
    report = FolderReport()
    rows: list[tuple[str, str, str, float, Path]] = []  # (spk, stem key, wav entry, seconds, path)
    for path, spk, where in entries:
        try:
            if not path.is_file():
                raise InputError(where, None, f"audio file not found: {path}")
            wav, rate, seconds = _header(path, ffmpeg)
        except UtteranceError as exc:  # a WAV cut short
            if not skip_bad:
                raise InputError(path, None, exc.message) from None
            report.bad[str(path)] = exc.message
            continue
        except InputError as exc:
            if not skip_bad:
                raise
            report.bad[str(path)] = exc.message
            continue
        stem = _clean(path.name[: -len(path.suffix)] if path.suffix else path.name)
        if not spk:
            report.own_speaker += 1
            spk = stem
        rows.append((_clean(spk), stem, wav, seconds, path))
        report.rates[rate] += 1
        report.durations.append(seconds)
        if rate < model_rate:
            report.low_rate.setdefault(rate, []).append(str(path))
    if not rows:
        raise InputError(root or list_file or "", None, "no readable audio file")
    utts = _utterances(rows)
    durations = {u.utt: r[3] for u, r in zip(utts, rows, strict=True)}
    return CorpusData(str(root or list_file), utts, durations=durations), report


def _utt_id(spk: str, stem: str) -> str:
    return stem if stem.startswith(spk + "-") else f"{spk}-{stem}"


def _utterances(rows: list[tuple[str, str, str, float, Path]]) -> list[Utterance]:
    count = Counter((spk, stem) for spk, stem, *_ in rows)
    seen: dict[str, Path] = {}
    out = []
    for spk, stem, wav, _, path in rows:
        key = stem
        if count[(spk, stem)] > 1:  # one speaker, two files of one name: the path tells them apart
            parts = [p for p in path.parent.parts if p not in ("/", "")]
            key = _clean("-".join([*parts[-2:], stem]))
        utt = _utt_id(spk, key)
        if utt in seen:
            raise InputError(path, None, f"utterance id {utt!r} also made for {seen[utt]}: rename one of them")
        seen[utt] = path
        out.append(Utterance(utt, spk, wav))
    return out
