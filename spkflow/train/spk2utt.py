"""A spk2utt file as the batch planner reads it: one flat array of utterance ids, speakers in C order.

:func:`load_spk2utt` reads Kaldi's ``spk2utt`` (fields split on ASCII white space) into a
:class:`Spk2Utt`: speakers in ``LC_ALL=C`` order, each speaker's utterances in file order, and
the line each came from, so every error names the file and line (a speaker twice, an utterance
under two speakers, a speaker without utterances).  NumPy only.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Mapping, Sequence

import numpy as np

from spkflow.core.errors import InputError

__all__ = ["Spk2Utt", "as_spk2utt", "load_spk2utt"]


@dataclasses.dataclass(frozen=True, eq=False)
class Spk2Utt:
    """A spk2utt table in compact form: speakers in LC_ALL=C order, utterances speaker-major.

    (Python orders ``str`` by code point, which for UTF-8 text is LC_ALL=C byte order.)

    ``utts[offsets[i]:offsets[i + 1]]`` are the utterances of ``speakers[i]`` in the order
    they were given.  ``lines[i]`` is the 1-based line of ``speakers[i]`` in ``path``
    (None for a table built from a mapping).  Build it with :func:`load_spk2utt` or
    :meth:`from_mapping`; both validate.
    """

    path: str
    speakers: list[str]
    offsets: np.ndarray
    utts: list[str]
    lines: list[int] | None = None

    @property
    def counts(self) -> np.ndarray:
        """Utterances per speaker (int64, in ``speakers`` order)."""
        return np.diff(self.offsets)

    @property
    def num_speakers(self) -> int:
        return len(self.speakers)

    @property
    def num_utts(self) -> int:
        return len(self.utts)

    def utt_array(self) -> np.ndarray:
        """The utterance ids as a numpy object array (built once, then cached)."""
        arr = self.__dict__.get("_utt_array")
        if arr is None:
            arr = np.empty(len(self.utts), dtype=object)
            arr[:] = self.utts
            object.__setattr__(self, "_utt_array", arr)
        return arr

    def speaker_of(self) -> np.ndarray:
        """Speaker index of every utterance (int64, ``utts`` order)."""
        return np.repeat(np.arange(self.num_speakers, dtype=np.int64), self.counts)

    def where(self, speaker_index: int) -> str:
        """``path:line`` of a speaker, for messages."""
        if self.lines is None:
            return f"{self.path} (speaker '{self.speakers[speaker_index]}')"
        return f"{self.path}:{self.lines[speaker_index]}"

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Sequence[str]], path: str = "<spk2utt>") -> Spk2Utt:
        """Validate and pack a ``{speaker: [utterance, ...]}`` mapping."""
        if isinstance(mapping, Spk2Utt):
            return mapping
        speakers = sorted(mapping)
        if not speakers:
            raise InputError(path, None, "spk2utt is empty")
        utts: list[str] = []
        counts = np.empty(len(speakers), dtype=np.int64)
        for i, spk in enumerate(speakers):
            if not isinstance(spk, str) or not spk or any(c.isspace() for c in spk):
                raise InputError(path, None, f"bad speaker id {spk!r}")
            u = mapping[spk]
            if isinstance(u, str):
                raise InputError(path, None, f"speaker '{spk}': utterances must be a list of ids, got a string")
            if len(u) == 0:
                raise InputError(path, None, f"speaker '{spk}' has no utterances")
            utts.extend(u)
            counts[i] = len(u)
        offsets = np.zeros(len(speakers) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        table = cls(path=path, speakers=speakers, offsets=offsets, utts=utts, lines=None)
        _check_unique_utts(table)
        return table


def load_spk2utt(path: str | os.PathLike[str]) -> Spk2Utt:
    """Read and validate a Kaldi spk2utt file (``spk utt1 utt2 ...`` per line, UTF-8).

    Errors (:class:`~spkflow.core.errors.InputError`, located by file and line): an empty file,
    an empty line, a speaker with no utterances, a speaker on two lines, an utterance
    twice on one line or under two speakers, bytes that are not UTF-8.  Tokens are split
    on ASCII whitespace, as Kaldi's tools do.

    We keep this reader here rather than use ``spkflow.data.tables.read_spk2utt`` because the
    planner needs the packed form (one list of utterances and speaker offsets) and the
    1M-utterance case has to parse in well under a second: per-line ``split(' ')`` into
    one flat list, one set for the cross-speaker duplicate check, and the slow
    locating pass only after a check failed.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, data.count(b"\n", 0, e.start) + 1, f"not UTF-8 ({e.reason})") from None
    del data
    if any(c in text for c in "\t\r\v\f"):
        text = text.translate({9: 32, 13: 32, 11: 32, 12: 32})
    lines = text.split("\n")
    del text
    while lines and lines[-1].strip() == "":
        lines.pop()  # the final newline (and blank lines at the end)
    if not lines:
        raise InputError(path, None, "spk2utt is empty")

    speakers: list[str] = []
    line_of: list[int] = []
    counts: list[int] = []
    utts: list[str] = []
    for lineno, line in enumerate(lines, start=1):
        toks = line.split(" ")
        if "" in toks:  # irregular spacing: tolerate it, as Kaldi's tools do
            toks = [t for t in toks if t]
            if not toks:
                raise InputError(path, lineno, "empty line")
        if len(toks) == 1:
            raise InputError(path, lineno, f"speaker '{toks[0]}' has no utterances")
        speakers.append(toks[0])
        line_of.append(lineno)
        counts.append(len(toks) - 1)
        utts.extend(toks[1:])
    del lines

    order = sorted(range(len(speakers)), key=speakers.__getitem__)
    for a, b in itertools.pairwise(order):
        if speakers[a] == speakers[b]:
            first, second = sorted((line_of[a], line_of[b]))
            raise InputError(path, second, f"speaker '{speakers[a]}' is also on line {first}")
    offsets_in = np.zeros(len(speakers) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets_in[1:])
    if order != list(range(len(speakers))):  # not LC_ALL=C sorted: repack in sorted order
        packed: list[str] = []
        for i in order:
            packed.extend(utts[offsets_in[i] : offsets_in[i + 1]])
        utts = packed
        speakers = [speakers[i] for i in order]
        line_of = [line_of[i] for i in order]
        counts = [counts[i] for i in order]
        offsets_in = np.zeros(len(speakers) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets_in[1:])
    table = Spk2Utt(path=path, speakers=speakers, offsets=offsets_in, utts=utts, lines=line_of)
    _check_unique_utts(table)
    return table


def _check_unique_utts(table: Spk2Utt) -> None:
    """Every utterance once: fast set check, then locate the first repeat for the message."""
    if len(set(table.utts)) == len(table.utts):
        return
    # Slow path, only on bad input: walk speakers in file order and name the second use.
    order: Sequence[int] = range(table.num_speakers)
    if table.lines is not None:
        order = sorted(order, key=table.lines.__getitem__)
    seen: dict[str, int] = {}
    for i in order:
        line = table.lines[i] if table.lines is not None else None
        mine: set[str] = set()
        for u in table.utts[table.offsets[i] : table.offsets[i + 1]]:
            if u in mine:
                raise InputError(table.path, line, f"utterance '{u}' is listed twice for speaker '{table.speakers[i]}'")
            mine.add(u)
            j = seen.setdefault(u, i)
            if j != i:
                raise InputError(
                    table.path,
                    line,
                    f"utterance '{u}' of speaker '{table.speakers[i]}' is also listed under "
                    f"speaker '{table.speakers[j]}' ({table.where(j)})",
                )
    raise AssertionError("duplicate utterance not located")  # pragma: no cover


def as_spk2utt(spk2utt: Spk2Utt | Mapping[str, Sequence[str]] | str | os.PathLike[str]) -> Spk2Utt:
    if isinstance(spk2utt, Spk2Utt):
        return spk2utt
    if isinstance(spk2utt, (str, os.PathLike)):
        return load_spk2utt(spk2utt)
    return Spk2Utt.from_mapping(spk2utt)
