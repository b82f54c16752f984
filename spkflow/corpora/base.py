"""What every corpus preparation shares: the record of one utterance, and writing a data dir.

A corpus module turns a corpus folder into a :class:`CorpusData` (utterances with speaker,
absolute audio path and optional transcript, plus optional per-speaker gender).
:func:`write_data_dir` turns that into a Kaldi data dir that ``utils/validate_data_dir.sh``
(ours and Kaldi's) accepts, guaranteeing:

* utterance ids are prefixed by their speaker id and a ``-`` (DESIGN.md), so sorting by
  utterance also groups speakers (what Kaldi's ``validate_data_dir.sh`` requires of
  ``utt2spk``/``spk2utt`` order);
* ids contain no white space; every file is ``LC_ALL=C`` sorted, duplicate-free, written
  atomically; ``wav.scp`` holds absolute paths;
* the data dir appears complete and validated or not at all, and nothing of the user's is
  touched: it is built and checked in a sibling temporary folder, then renamed into place;
  a previous folder there is replaced only when spkflow wrote it (a marker file) or with
  ``overwrite``, and concurrent runs are refused (:mod:`spkflow.corpora.destination`);
* ``utt2dur`` is computed from audio headers (:func:`spkflow.data.durations.utt2dur`), which also proves
  that every audio file exists and is readable; a ``trials`` list can be added
  (:mod:`spkflow.corpora.trials`).

Anchor: Kaldi's ``egs/*/s5/local/*data_prep*.sh`` (awk/sed pipelines, then
``utils/fix_data_dir.sh`` silently drops whatever does not match).  Here a mismatch is an
error naming the file and line, and nothing is dropped silently.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError
from spkflow.corpora.destination import data_dir_destination
from spkflow.corpora.trials import format_trial, make_trials, write_trials
from spkflow.data.datadir import DataDir
from spkflow.data.durations import format_duration
from spkflow.data.durations import utt2dur as compute_utt2dur
from spkflow.data.tables import WHITESPACE, c_sorted, utt2spk_to_spk2utt, write_kv, write_lines

log = logging.getLogger(__name__)

#: audio extensions accepted by the corpus scanners (case-insensitive)
AUDIO_EXTENSIONS = (".flac", ".wav")


@dataclass(frozen=True)
class Utterance:
    """One utterance of a corpus: ids, absolute audio path (or ``cmd |``), transcript."""

    utt: str
    spk: str
    wav: str
    text: str | None = None


@dataclass
class CorpusData:
    """The utterances of one data set of a corpus (any order), plus per-speaker extras.

    ``durations`` (seconds per utterance) replaces reading audio headers for ``utt2dur`` where
    the corpus module knows them more cheaply (m4a behind a decoding pipe); ``trials`` is a trial
    list given by the corpus (an official list, converted), written in its own order.
    """

    name: str
    utterances: list[Utterance]
    spk2gender: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] | None = None
    trials: list[tuple[str, str, bool]] | None = None


@dataclass(frozen=True)
class CorpusOption:
    """One keyword option of a corpus module's ``collect`` (``--name-with-dashes`` on the CLI)."""

    name: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    kind: str = "str"  # str | list (space-separated) | bool (true|false)


@dataclass(frozen=True)
class CorpusSpec:
    """What the single front end (``python -m spkflow.bin.prepare_corpus``) needs of a corpus:
    the db.sh variable that points at it, a path inside it that proves a folder is a copy
    (``{option}`` is filled from the options), the public git release tried when the folder is
    missing (None: no automatic download), its layout (for ``--help``) and its options."""

    name: str
    db_var: str
    marker: str
    layout: str
    url: str | None = None
    options: tuple[CorpusOption, ...] = ()


def is_audio(name: str) -> bool:
    """Whether ``name`` has one of :data:`AUDIO_EXTENSIONS` (any case)."""
    return name.lower().endswith(AUDIO_EXTENSIONS)


def strip_audio_ext(name: str) -> str:
    return name[: name.rfind(".")] if is_audio(name) else name


def speaker_prefixed(spk: str, stem: str) -> str:
    """``stem`` if it already starts with ``<spk>-``, else ``<spk>-<stem>``."""
    return stem if stem.startswith(spk + "-") else f"{spk}-{stem}"


def check_id(what: str, value: str, where: str) -> None:
    if not value or any(c in WHITESPACE for c in value):
        raise ValueError(f"{where}: {what} {value!r} is empty or contains white space")


def pick_unique_audio(paths: Sequence[Path], key: str) -> Path:
    """One audio file per utterance: the same stem with two extensions (``x.wav`` and
    ``x.flac``) is ambiguous and an error, not a silent choice."""
    if len(paths) > 1:
        listed = ", ".join(str(p) for p in paths)
        raise InputError(paths[1], None, f"utterance {key!r} has more than one audio file: {listed}; keep one format")
    return paths[0]


def resolve_audio(root: Path, rel: str, src: Path, line: int) -> Path:
    """Absolute path of audio ``rel`` (relative to ``root``), accepting a copy with the other
    audio extension (a corpus converted WAV -> FLAC without rewriting its lists)."""
    p = Path(rel)
    path = p if p.is_absolute() else root / p
    if path.is_file():
        return path.resolve()
    stem = str(path)[: -len(path.suffix)] if path.suffix else str(path)
    for ext in AUDIO_EXTENSIONS + tuple(e.upper() for e in AUDIO_EXTENSIONS):
        alt = Path(stem + ext)
        if alt.is_file():
            return alt.resolve()
    raise InputError(src, line, f"audio file not found: {path} (nor with another of {AUDIO_EXTENSIONS})")


def _check(data: CorpusData) -> list[Utterance]:
    if not data.utterances:
        raise ValueError(f"{data.name}: no utterances found")
    seen: dict[str, Utterance] = {}
    for u in data.utterances:
        check_id("utterance id", u.utt, data.name)
        check_id("speaker id", u.spk, data.name)
        if not u.utt.startswith(u.spk + "-"):
            raise ValueError(f"{data.name}: utterance id {u.utt!r} is not prefixed by its speaker {u.spk!r} + '-'")
        if u.utt in seen:
            raise ValueError(f"{data.name}: utterance id {u.utt!r} occurs twice ({seen[u.utt].wav} and {u.wav})")
        seen[u.utt] = u
    if data.durations is not None and (lost := [u for u in seen if u not in data.durations]):
        raise ValueError(f"{data.name}: no duration for {len(lost)} utterance(s), e.g. {lost[0]!r}")
    for a, b, _ in data.trials or ():
        if a not in seen or b not in seen:
            raise ValueError(f"{data.name}: trial {a} {b} names an utterance that is not in the data set")
    return [seen[k] for k in c_sorted(seen)]


def write_data_dir(
    data: CorpusData,
    out_dir: str | os.PathLike[str],
    *,
    utt2dur: bool = True,
    trials: bool = False,
    nontarget_ratio: float = 10.0,
    seed: int = 0,
    max_targets_per_spk: int | None = None,
    text: bool = True,
    progress: bool = False,
    overwrite: bool = False,
    sources: Sequence[str | os.PathLike[str]] = (),
    files: Sequence[str] = (),
    extra: dict[str, str] | None = None,
) -> DataDir:
    """Write ``data`` as a Kaldi data dir at ``out_dir`` (see the module docstring).

    Files: ``wav.scp``, ``utt2spk``, ``spk2utt``; ``text`` when ``text`` and every utterance has
    a transcript; ``spk2gender`` when the corpus gives a gender for every speaker; ``utt2dur``
    when ``utt2dur``; ``trials``: the corpus's own list when it gives one, else a sampled list
    when ``trials`` (both is an error; ``max_targets_per_spk``: see :func:`make_trials`);
    ``extra``: more files (name -> text), e.g. ``bad_files``.
    Put in place by :func:`~spkflow.corpora.destination.data_dir_destination` (``overwrite``,
    ``sources``, ``files``: see there) after :meth:`DataDir.validate` passed on the new files.
    """
    if trials and data.trials is not None:
        raise ValueError(f"{data.name}: the corpus gives its own trial list; do not ask for a sampled one")

    utts = _check(data)
    with data_dir_destination(out_dir, overwrite=overwrite, sources=sources, files=files) as tmp:
        write_kv(tmp / "wav.scp", [(u.utt, u.wav) for u in utts])
        write_kv(tmp / "utt2spk", [(u.utt, u.spk) for u in utts])
        spk2utt = utt2spk_to_spk2utt([(u.utt, u.spk) for u in utts])
        write_kv(tmp / "spk2utt", spk2utt)
        if text and all(u.text is not None for u in utts):
            write_kv(tmp / "text", [(u.utt, u.text or "") for u in utts])
        if data.spk2gender and all(s in data.spk2gender for s in spk2utt):
            write_kv(tmp / "spk2gender", [(s, data.spk2gender[s]) for s in spk2utt])
        if utt2dur and data.durations is not None:
            write_kv(tmp / "utt2dur", [(u.utt, format_duration(data.durations[u.utt])) for u in utts])
        elif utt2dur:
            durs = compute_utt2dur(tmp, progress=progress)
            write_kv(tmp / "utt2dur", [(k, format_duration(v)) for k, v in durs.items()])
        if data.trials is not None:  # the corpus's own list, in its order
            write_lines(tmp / "trials", [format_trial(t) + "\n" for t in data.trials])
        elif trials:
            pairs = make_trials(
                {u.utt: u.spk for u in utts},
                nontarget_ratio=nontarget_ratio,
                seed=seed,
                max_targets_per_spk=max_targets_per_spk,
            )
            write_trials(tmp / "trials", pairs)
        for name, content in (extra or {}).items():
            write_text_atomic(tmp / name, content)
        try:
            DataDir(tmp).validate(no_feats=True, no_text=True)
        except ValueError as exc:  # InputError too: named after DATA_DIR, not the temporary folder
            raise ValueError(f"{str(exc).replace(str(tmp), str(out_dir))}; nothing was changed") from None
    return DataDir(Path(out_dir))


def summary(d: DataDir) -> str:
    """``data/x: 125 speakers, 1500 utterances, 3.2 h`` (hours when utt2dur exists)."""
    u2s = d.utt2spk()
    msg = f"{d.path}: {len(set(u2s.values()))} speakers, {len(u2s)} utterances"
    if d.has("utt2dur"):
        msg += f", {sum(d.utt2dur().values()) / 3600:.2f} h"
    if d.has("trials"):
        with open(d.file("trials"), encoding="utf-8") as f:
            kinds = [line.rsplit(None, 1)[-1] for line in f if line.strip()]
        ntar = kinds.count("target")
        msg += f", trials {ntar} target + {len(kinds) - ntar} nontarget"
    return msg


def scan_files(root: Path, depth: int) -> Iterable[tuple[Path, str]]:
    """Audio files exactly ``depth`` directory levels below ``root`` -> (path, relative dirs
    joined by '/'), in sorted order (deterministic across file systems)."""
    if depth == 0:
        with os.scandir(root) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if e.is_file() and is_audio(e.name):
                yield Path(e.path), ""
        return
    with os.scandir(root) as it:
        dirs = sorted((e for e in it if e.is_dir()), key=lambda e: e.name)
    for d in dirs:
        for p, rel in scan_files(Path(d.path), depth - 1):
            yield p, d.name + ("/" + rel if rel else "")


def match_names(
    paths: Iterable[tuple[Path, str]], pattern: re.Pattern[str], corpus: str
) -> Iterable[tuple[Path, re.Match[str]]]:
    """Files whose stem matches ``pattern``; others are counted and reported once."""
    skipped: list[Path] = []
    for p, _ in paths:
        m = pattern.fullmatch(strip_audio_ext(p.name))
        if m is None:
            skipped.append(p)
            continue
        yield p, m
    if skipped:
        log.warning("%s: ignored %d audio files not named like the corpus (e.g. %s)", corpus, len(skipped), skipped[0])
