"""Your own recordings as a corpus: a folder (one subfolder per speaker) or a list of files ->
:class:`~spkflow.corpora.base.CorpusData`, written like every corpus by
:func:`~spkflow.corpora.base.write_data_dir`.  The front end is ``python -m
spkflow.bin.make_data_dir AUDIO_DIR DATA_DIR``.

Rules
-----
* **Which files**: every file under the folder (any depth, hidden ones skipped) whose extension
  libsndfile reads (:data:`SNDFILE_EXTENSIONS`: wav, flac, ogg / opus, mp3, aiff, ...) or ffmpeg
  decodes in a ``wav.scp`` pipe (:data:`FFMPEG_EXTENSIONS`: m4a, mp4, aac, wma, webm; the
  ffmpeg of the pinned ``imageio-ffmpeg``, as the VoxCeleb2 recipe); other files are counted
  and one named.  Symbolic links are followed, and a folder whose resolved path was already read
  (a link loop, two links to one folder) is read once.  Or the files a list names:
  ``path [speaker]`` per line (tab-separated when paths hold spaces), relative paths against the
  list's folder.
* **Speaker**: the first folder of the file's path below the root; ``speaker_regex`` instead
  (``re.search`` on the path relative to the root, ``/``-separated; group ``spk`` or the first
  group, else the whole match).  A file without one (at the top level, or a list line without a
  speaker) is its own speaker, Kaldi's convention for unknown speakers.  A folder that looks like
  ``corpus/subset/speaker/file`` (every file two folders deep or more, twice as many
  second-level folders as first-level ones) gets a warning with the ``--speaker-regex`` to use.
* **Utterance ids**: the speaker, ``-``, the file name without extension (kept as it is when it
  already starts with ``<speaker>-``, as LibriSpeech's do); when two files of one speaker share
  a name, with their last two folders before it (``/`` -> ``-``).  White space in ids
  becomes ``_``.  Unique, or an error naming both files.
* **Checked**: each file's header (libsndfile; ffmpeg's stream line for the piped formats) gives
  its rate and duration, so a folder of hours is read in seconds; a file whose header cannot be
  read, a WAV shorter than its header says, a name with a line break (no wav.scp line can
  hold it), one ending in ``|`` or white space (a wav.scp line would run it as a command or cut
  it: a list of files never becomes a command) or a name that is not UTF-8 (the ids are made of
  it) is bad.  With ``skip_bad``
  every file is also decoded to its end (:func:`decode_check`: a FLAC or MP3 cut short passes
  the header check) and the bad ones are left out and listed (:attr:`FolderReport.bad`);
  without it, all bad files are found in one pass and raised together (:class:`BadFilesError`,
  one line per file), not the first one alone.
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
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import soundfile as sf

from spkflow.core.errors import InputError, UtteranceError
from spkflow.corpora.base import CorpusData, Utterance
from spkflow.data.audio import shown_path, spec_duration, truncation
from spkflow.data.ffmpeg import FFMPEG_EXTENSIONS, ffmpeg_pipe, probe_ffmpeg
from spkflow.data.steps import is_sorted_k2
from spkflow.data.tables import WHITESPACE, c_key

__all__ = [
    "FFMPEG_EXTENSIONS",
    "SNDFILE_EXTENSIONS",
    "BadFilesError",
    "FolderReport",
    "collect_folder",
    "decode_check",
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
    non_audio: list[str] = field(default_factory=list)  # files skipped for their extension
    revisited: list[str] = field(default_factory=list)  # folders reached a second time through a link
    files: list[str] = field(default_factory=list)  # the audio files taken
    nested: str | None = None  # the warning about a corpus/subset/speaker layout

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
        if self.non_audio:
            out.append(
                f"{len(self.non_audio)} file(s) skipped as not audio by their extension, e.g. {self.non_audio[0]}"
            )
        if self.revisited:
            out.append(
                f"{len(self.revisited)} folder(s) reached again through a symbolic link were read once, "
                f"e.g. {self.revisited[0]}"
            )
        if self.nested:
            out.append("WARNING: " + self.nested)
        if self.bad:
            out.append(
                f"WARNING: {len(self.bad)} unreadable file(s) left out (listed in bad_files), of "
                f"{len(self.bad) + len(self.durations)} audio file(s)"
            )
        return out

    def bad_lines(self) -> list[str]:
        """One line per bad file: its path (escaped where it holds a line break) and why."""
        return [f"{_show(p)}: {why}" for p, why in self.bad.items()]


def _show(path: str) -> str:
    """A path as one line: with its line breaks escaped (as Python writes them) when it has any,
    bytes that are not UTF-8 as ``\\xNN``."""
    return repr(path)[1:-1] if "\n" in path or "\r" in path else shown_path(path)


class BadFilesError(InputError):
    """Unreadable audio files, all of them (``lines``: one per file), found in one pass."""

    def __init__(self, where: str | os.PathLike[str], lines: list[str], total: int) -> None:
        self.lines = lines
        super().__init__(
            where,
            None,
            f"{len(lines)} of {total} audio file(s) unreadable (listed above); nothing was written: fix or remove "
            "them, or pass --skip-bad true to leave them out",
        )


def _clean(s: str) -> str:
    return "".join("_" if c in WHITESPACE else c for c in s)


def _utf8(text: str) -> bool:
    """Whether a name read from the file system (``surrogateescape``) is UTF-8 text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _header(path: Path, ffmpeg: str | None) -> tuple[str, int, float]:
    """(wav.scp entry, native rate, seconds) of one file."""
    if path.suffix.lower() in FFMPEG_EXTENSIONS:
        if ffmpeg is None:
            from spkflow.data.ffmpeg import default_ffmpeg

            ffmpeg = default_ffmpeg()
        rate, seconds = probe_ffmpeg(ffmpeg, str(path))
        return ffmpeg_pipe(ffmpeg, str(path), rate), rate, seconds
    try:
        info = sf.info(os.fsencode(path))
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError / TypeError
        why = getattr(exc, "error_string", None) or str(exc)
        if getattr(exc, "code", None) == 7 or "possibly a pipe" in why:  # said of any file it cannot decode
            why = (
                f"no {path.suffix.lstrip('.').upper() or 'audio'} stream libsndfile can decode (not audio, or damaged)"
            )
        raise InputError(path, None, f"cannot read the audio header: {why}") from None
    if info.frames <= 0 or info.samplerate <= 0:
        raise InputError(path, None, "no audio samples")
    if info.format == "WAV":
        spec_duration(str(path), str(path))  # UtteranceError for a WAV cut short
    return str(path), int(info.samplerate), info.frames / info.samplerate


def decode_check(path: Path, wav: str, rate: int, seconds: float, ffmpeg: str | None) -> None:
    """Decode the whole file; :class:`InputError` when it fails or yields clearly less audio than
    its header says (a FLAC or MP3 cut short: the header alone does not show it)."""
    if wav.endswith("|"):  # the ffmpeg pipe: decode to nothing, any error is a bad file
        exe = ffmpeg or wav.split()[0]
        proc = subprocess.run(
            [exe, "-hide_banner", "-nostdin", "-v", "error", "-i", str(path), "-f", "null", "-"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if proc.returncode != 0 or proc.stderr.strip():
            tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise InputError(path, None, f"ffmpeg cannot decode it all: {tail}")
        return
    frames = 0
    try:
        with sf.SoundFile(os.fsencode(path)) as f:
            while True:
                block = f.read(1 << 13, dtype="float32", always_2d=True)
                if not len(block):
                    break
                frames += len(block)
    except Exception as exc:  # LibsndfileError: "flac decoder lost sync", ...
        raise InputError(path, None, f"damaged: decoding stops after {frames / rate:.2f} s: {exc}") from None
    if (short := truncation(frames, round(seconds * rate), rate)) is not None:
        raise InputError(path, None, short)


def _walk(root: Path, report: FolderReport) -> list[Path]:
    """The audio files below ``root`` in sorted order, following symbolic links; a folder whose
    resolved path was already read (a link loop, two links to one folder) is read once."""
    exts = SNDFILE_EXTENSIONS + FFMPEG_EXTENSIONS
    found = []
    seen = {os.path.realpath(root)}
    for d, dirs, files in os.walk(root, followlinks=True):
        keep = []
        for x in sorted(dirs):
            if x.startswith("."):
                continue
            real = os.path.realpath(os.path.join(d, x))
            if real in seen:
                report.revisited.append(os.path.join(d, x))
                continue
            seen.add(real)
            keep.append(x)
        dirs[:] = keep
        for f in sorted(files):
            if f.startswith("."):
                continue
            if f.lower().endswith(exts):
                found.append(Path(d) / f)
            else:
                report.non_audio.append(_show(os.path.join(d, f)))
    return found


def _nested_hint(rels: list[str]) -> str | None:
    """The warning for ``corpus/subset/speaker/file`` read with the first folder as speaker:
    every file two or more folders deep and at least twice as many second-level folders as
    first-level ones (LibriSpeech's root: 2 subsets holding 261 speakers)."""
    if not rels or any(r.count("/") < 2 for r in rels):
        return None
    first = {r.split("/")[0] for r in rels}
    second = {tuple(r.split("/")[:2]) for r in rels}
    if len(second) < 2 * len(first):
        return None
    example = sorted(second)[0]
    return (
        f"{len(first)} speaker folder(s) hold {len(second)} subfolders (e.g. {'/'.join(example)}/): if the speakers "
        f"are the second level (corpus/subset/speaker/file), rerun with --speaker-regex '^[^/]+/(?P<spk>[^/]+)/' "
        f"(that would make {len({s for _, s in second})} speakers)"
    )


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
    report = FolderReport()
    entries: list[tuple[Path, str | None, str]] = []  # (path, speaker, where: for errors)
    if list_file is not None:
        lst = Path(list_file)
        entries = [(p, spk, f"{lst}:{n}") for p, spk, n in _read_list(lst)]
    else:
        top = Path(root)  # type: ignore[arg-type]
        if not top.is_dir():
            raise InputError(top, None, "not a folder")
        rels = []
        for p in _walk(top, report):
            rel = p.relative_to(top).as_posix()
            spk: str | None
            if pattern is not None:
                m = pattern.search(rel)
                if m is None:
                    raise InputError(
                        _show(str(p)), None, f"path {rel!r} does not match --speaker-regex {speaker_regex!r}"
                    )
                spk = m.groupdict().get("spk") or (m.group(1) if m.re.groups else m.group(0))
            else:
                spk = rel.split("/")[0] if "/" in rel else None
                rels.append(rel)
            entries.append((p, spk, str(p)))
        if not entries:
            skipped = f"; {len(report.non_audio)} other file(s) skipped" if report.non_audio else ""
            raise InputError(
                top, None, f"no audio files ({', '.join(SNDFILE_EXTENSIONS + FFMPEG_EXTENSIONS)}){skipped}"
            )
        report.nested = _nested_hint(rels)
    rows: list[tuple[str, str, str, float, Path]] = []  # (spk, stem key, wav entry, seconds, path)
    for path, spk, where in entries:
        try:
            if "\n" in str(path) or "\r" in str(path):
                raise InputError(path, None, "its name holds a line break, which a wav.scp line cannot: rename it")
            if str(path).rstrip().endswith("|") or str(path) != str(path).strip():
                raise InputError(  # Kaldi strips the line, and runs an entry ending in '|'
                    path,
                    None,
                    "its name ends in '|' or white space, which a wav.scp line would run as a command "
                    "or cut off: rename it",
                )
            if not path.is_file():
                raise InputError(where, None, f"audio file not found: {path}")
            wav, rate, seconds = _header(path, ffmpeg)
            if skip_bad:
                decode_check(path, wav, rate, seconds, ffmpeg)
        except (UtteranceError, InputError) as exc:  # UtteranceError: a WAV cut short
            report.bad[str(path)] = exc.message
            continue
        stem = _clean(path.name[: -len(path.suffix)] if path.suffix else path.name)
        if not _utf8(f"{spk or ''}{stem}"):
            what = "file name" if not _utf8(stem) else f"speaker ({_show(spk or '')})"
            report.bad[str(path)] = (
                f"its {what} is not UTF-8 text, and utterance and speaker ids must be: rename it "
                "(convmv -f latin1 -t utf-8 -r DIR, for names from Latin-1)"
            )
            continue
        if not spk:
            report.own_speaker += 1
            spk = stem
        rows.append((_clean(spk), stem, wav, seconds, path))
        report.rates[rate] += 1
        report.durations.append(seconds)
        report.files.append(str(path))
        if rate < model_rate:
            report.low_rate.setdefault(rate, []).append(str(path))
    if report.bad and not skip_bad:
        raise BadFilesError(root or list_file or "", report.bad_lines(), len(entries))
    if not rows:
        raise InputError(root or list_file or "", None, f"no readable audio file ({len(report.bad)} unreadable)")
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
    _check_speaker_order(out, seen)
    return out


def _check_speaker_order(utts: list[Utterance], paths: dict[str, Path]) -> None:
    """Kaldi wants utt2spk sorted by speaker as well as by utterance.  Speaker ``A`` beside ``A-1``
    breaks it (``A-1-x`` sorts before ``A-u1``): refused before anything is written, naming both
    speakers and a rename that works (characters up to ``-`` made ``_``, which sorts after it)."""
    ordered = sorted(utts, key=lambda u: c_key(u.utt))
    i = is_sorted_k2([f"{u.utt} {u.spk}\n" for u in ordered])  # the rule the data dir's validation applies
    if i is not None:
        last, u = ordered[i - 1], ordered[i]
        fixed = "".join("_" if c <= "-" else c for c in last.spk)
        raise InputError(
            paths[u.utt].parent,
            None,
            f"speaker {last.spk!r} sorts after speaker {u.spk!r} but its utterance ids ('<speaker>-<file>') "
            f"sort before theirs, and a Kaldi data dir needs both orders to agree: rename the folder "
            f"{last.spk!r} (e.g. to {fixed!r}) or give --speaker-regex",
        )
