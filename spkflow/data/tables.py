"""Kaldi tables: the small text files of a data dir, read and written byte-exactly.

A data dir is a folder of small text tables keyed by their first field
(``utt2spk``, ``spk2utt``, ``wav.scp``, ``segments``, ``utt2dur``, ``feats.scp``,
...).  This module reads and writes such tables; :class:`spkflow.data.datadir.DataDir` is the
folder, :mod:`spkflow.data.check` checks a whole data dir the way Kaldi's
``utils/validate_data_dir.sh`` does.

Guarantees:

* every problem is an :class:`~spkflow.core.errors.InputError` naming the file and
  the 1-based line (``data/train/utt2spk:17: duplicate key 'a-01' (first on line 16)``),
  where Kaldi's script only says "file X is not sorted or has duplicates";
* bytes are kept: files are read as UTF-8 with ``surrogateescape`` so any byte
  sequence survives a read/write round trip, and "sorted" means ``LC_ALL=C sort``
  order, i.e. the order of the UTF-8 bytes (:func:`c_key`); validation rejects ids
  (utterance, speaker, recording) that are not UTF-8, naming file and line, since the
  feature and embedding arks cannot store them;
* fields are separated by runs of ASCII white space (what Perl's ``split " "``
  uses in Kaldi's scripts); only ``"\\n"`` ends a line;
* outputs are written atomically (:mod:`spkflow.core.atomic`): a crash never leaves a
  half-written table under the final name;
* standard library only, so the ``utils/`` front ends start fast with any Python.

Compared with the anchor (Kaldi's ``validate_data_dir.sh`` + ``check_sorted_and_uniq``),
this stops at the first problem with its exact location and a suggested fix, and
works on data dirs without ``text`` (speaker recipes) through ``no_text``.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Union

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError

PathLike = Union[str, "os.PathLike[str]"]

#: ASCII white space, the field separator of Perl's ``split " "`` and ``\\s``.
WHITESPACE = " \t\n\r\f\v"
_FIELDS_RE = re.compile(r"[^ \t\n\r\f\v]+")

__all__ = [
    "WHITESPACE",
    "c_key",
    "c_sorted",
    "read_lines",
    "split_fields",
    "read_kv_lines",
    "read_kv",
    "read_spk2utt",
    "read_keys",
    "write_lines",
    "write_kv",
    "format_kv",
    "check_sorted_unique",
    "Table",
    "utt2spk_to_spk2utt",
    "spk2utt_to_utt2spk",
    "UTT_FILES",
    "RAW_BYTE_RE",
    "as_number",
    "same_key",
    "show_line",
    "SPK_FILES",
    "VAD_LIKE_FILES",
]

#: Optional utterance-indexed files that follow Kaldi's rules for ``vad.scp``: when present
#: they must list exactly the utterances of utt2spk (validate), they are filtered to the kept
#: utterances but never remove one (fix_data_dir), and they are subset, combined and copied
#: along, with utterance ids renamed by copy_data_dir's prefix/suffix.  Besides vad.scp:
#: the per-utterance CMVN statistics written by stage 2 (``scripts/feats/make_fbank.sh``).
VAD_LIKE_FILES = ("vad.scp", "cmvn_utt.scp", "cmvn_utt_voiced.scp")
#: Files indexed by utterance id (or by recording id when ``segments`` exists, for wav.scp / reco2dur).
UTT_FILES = (
    "utt2spk",
    "feats.scp",
    *VAD_LIKE_FILES,
    "text",
    "segments",
    "wav.scp",
    "utt2lang",
    "utt2uniq",
    "utt2dur",
    "utt2num_frames",
    "utt2warp",
)
#: Files indexed by speaker id.
SPK_FILES = ("spk2utt", "spk2gender", "cmvn.scp", "spk2warp")


# --------------------------------------------------------------------------- primitives


def c_key(s: str) -> bytes:
    """Sort key giving ``LC_ALL=C sort`` order (UTF-8 bytes, unsigned)."""
    return s.encode("utf-8", "surrogateescape")


def c_sorted(items: Iterable[str]) -> list[str]:
    """``items`` sorted in ``LC_ALL=C`` order."""
    return sorted(items, key=c_key)


def read_lines(path: PathLike) -> list[str]:
    """All lines of ``path`` with their ``"\\n"`` (the last one may lack it); bytes preserved."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as f:
            return f.readlines()
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, None, "is a directory, expected a file") from None


def split_fields(line: str) -> list[str]:
    """White-space separated fields of ``line`` (like Perl's ``split " "``)."""
    return _FIELDS_RE.findall(line)


def _key_value(line: str) -> tuple[str, str] | None:
    """``(first field, rest of line stripped)``, or None for a blank line."""
    s = line.strip(WHITESPACE)
    if not s:
        return None
    m = _FIELDS_RE.match(s)
    assert m is not None
    return m.group(0), s[m.end() :].lstrip(WHITESPACE)


def show_line(s: str, limit: int = 60) -> str:
    s = s.rstrip("\n")
    return repr(s if len(s) <= limit else s[:limit] + "...")


def read_kv_lines(
    path: PathLike, *, value_required: bool = True, num_fields: int | None = None
) -> list[tuple[str, str]]:
    """``(key, rest of line)`` for every line, in file order (duplicates kept).

    Raises :class:`InputError` (file, line) for a blank line, a line with a key but
    no value when ``value_required``, or a line whose number of fields is not
    ``num_fields`` when that is given.
    """
    out: list[tuple[str, str]] = []
    for n, line in enumerate(read_lines(path), 1):
        kv = _key_value(line)
        if kv is None:
            raise InputError(path, n, "empty line")
        if num_fields is not None:
            nf = len(split_fields(line))
            if nf != num_fields:
                raise InputError(path, n, f"expected {num_fields} fields, got {nf}: {show_line(line)}")
        elif value_required and not kv[1]:
            raise InputError(path, n, f"expected '<key> <value>', got only the key {kv[0]!r}")
        out.append(kv)
    return out


def _unique(path: PathLike, pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    seen: dict[str, int] = {}
    out: dict[str, str] = {}
    for n, (k, v) in enumerate(pairs, 1):
        if k in seen:
            raise InputError(path, n, f"duplicate key {k!r} (first on line {seen[k]})")
        seen[k] = n
        out[k] = v
    return out


def read_kv(path: PathLike, *, value_required: bool = True, num_fields: int | None = None) -> dict[str, str]:
    """``key -> rest of line`` (file order).  InputError on a malformed line or a duplicate key."""
    return _unique(path, read_kv_lines(path, value_required=value_required, num_fields=num_fields))


def read_keys(path: PathLike) -> list[str]:
    """First field of every line, in file order (InputError on a blank line)."""
    return [k for k, _ in read_kv_lines(path, value_required=False)]


def read_spk2utt(path: PathLike) -> dict[str, list[str]]:
    """``speaker -> [utterances]`` in file order.

    InputError for a duplicate speaker, a speaker without utterances, or an
    utterance listed twice (under the same or another speaker).
    """
    out: dict[str, list[str]] = {}
    spk_line: dict[str, int] = {}
    utt_line: dict[str, int] = {}
    for n, line in enumerate(read_lines(path), 1):
        fields = split_fields(line)
        if not fields:
            raise InputError(path, n, "empty line")
        spk, utts = fields[0], fields[1:]
        if not utts:
            raise InputError(path, n, f"speaker {spk!r} has no utterances")
        if spk in spk_line:
            raise InputError(path, n, f"duplicate speaker {spk!r} (first on line {spk_line[spk]})")
        for u in utts:
            if u in utt_line:
                raise InputError(path, n, f"utterance {u!r} listed twice (also on line {utt_line[u]})")
            utt_line[u] = n
        spk_line[spk] = n
        out[spk] = utts
    return out


def format_kv(key: str, value: str | Sequence[str]) -> str:
    """One table line ``"key value\\n"`` (a sequence value is joined by spaces)."""
    if not isinstance(value, str):
        value = " ".join(value)
    if not key or any(c in WHITESPACE for c in key):
        raise ValueError(f"bad key {key!r}: keys are non-empty and contain no white space")
    if "\n" in value:
        raise ValueError(f"value of {key!r} contains a newline")
    return f"{key} {value}\n" if value else f"{key}\n"


def write_lines(path: PathLike, lines: Iterable[str]) -> None:
    """Write ``lines`` (each ending in ``"\\n"``) atomically, bytes preserved."""
    with atomic_write(path, "wb", encoding=None) as f:
        f.write("".join(lines).encode("utf-8", "surrogateescape"))


def write_kv(
    path: PathLike,
    items: Mapping[str, str | Sequence[str]] | Iterable[tuple[str, str | Sequence[str]]],
    *,
    sort: bool = True,
) -> None:
    """Write a table atomically, one ``key value`` per line, in ``LC_ALL=C`` key order
    (``sort=False`` keeps the given order).  Raises ValueError on a duplicate or bad key."""
    pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
    if sort:
        pairs.sort(key=lambda kv: c_key(kv[0]))
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {k!r} while writing {os.fspath(path)}")
        seen.add(k)
    write_lines(path, (format_kv(k, v) for k, v in pairs))


# White space that Python's str.split() splits on but Perl's split " " does not, and the
# stand-ins of bytes that are not UTF-8 (which break "str order == byte order").
_ODD_WS_RE = re.compile("[\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
RAW_BYTE_RE = re.compile("[\udc80-\udcff]")
_KEYS_RE = re.compile(r"^[ \t\r\f\v]*([^ \t\n\r\f\v]*)", re.M)
_TWO_COLUMN_RE = re.compile(r"(?:[^ \t\n\r\f\v]+ [^ \t\n\r\f\v]+\n)*")
_TWO_FIELDS_RE = re.compile(r"^([^ \t\n\r\f\v]+) ([^ \t\n\r\f\v]+)$", re.M)


class Table:
    """A table read once: its lines, the fields of each line, and its key order.

    ``fields`` is Perl's ``split " "`` of each line (fast path ``str.split`` when no
    non-ASCII white space is present); ``key`` maps a string to its ``LC_ALL=C`` sort
    key (identity unless the file holds bytes that are not UTF-8).
    """

    def __init__(self, path: PathLike, lines: Sequence[str] | None = None) -> None:
        self.path = Path(path)
        self.lines = read_lines(path) if lines is None else list(lines)
        # every line newline-terminated here, so that per-line regexes see each line once
        text = "".join(self.lines)
        n_nl = text.count("\n")
        if n_nl == len(self.lines) - 1 and self.lines and not self.lines[-1].endswith("\n"):
            text += "\n"
        elif n_nl != len(self.lines):
            text = "".join(x if x.endswith("\n") else x + "\n" for x in self.lines)
        self.text = text
        self.key: Callable[[str], str | bytes] = c_key if RAW_BYTE_RE.search(self.text) else same_key
        self._fields: Sequence[Sequence[str]] | None = None
        self._two_column: bool | None = None
        self._keys: list[str] | None = None

    @property
    def fields(self) -> Sequence[Sequence[str]]:
        if self._fields is None:
            if self.is_two_column():
                self._fields = _TWO_FIELDS_RE.findall(self.text)
            elif _ODD_WS_RE.search(self.text) is None:
                self._fields = [line.split() for line in self.lines]
            else:
                self._fields = [split_fields(line) for line in self.lines]
        return self._fields

    @property
    def keys(self) -> list[str]:
        """First field of every line ('' for a blank line)."""
        if self._keys is None:
            self._keys = _KEYS_RE.findall(self.text)[: len(self.lines)]
        return self._keys

    def is_two_column(self) -> bool:
        """Every line is exactly ``"<a> <b>\\n"`` (one space, no other white space)."""
        if self._two_column is None:
            self._two_column = _TWO_COLUMN_RE.fullmatch(self.text) is not None
        return self._two_column

    def check_sorted_unique(self) -> list[str]:
        """See :func:`check_sorted_unique`."""
        lines, path = self.lines, self.path
        if lines and not lines[-1].endswith("\n"):
            raise InputError(path, len(lines), "no newline at end of file")
        keys = self.keys
        ks = [self.key(k) for k in keys] if self.key is not same_key else keys
        if "" not in keys and not any(map(operator.ge, ks, ks[1:])):
            return keys
        first: dict[str, int] = {}
        for n, k in enumerate(keys, 1):
            if not k:
                raise InputError(path, n, "empty line")
            if k in first:
                raise InputError(path, n, f"duplicate key {k!r} (first on line {first[k]})")
            if n > 1 and ks[n - 1] < ks[n - 2]:
                raise InputError(
                    path,
                    n,
                    f"not sorted: {k!r} comes after {keys[n - 2]!r} (line {n - 1}); "
                    "sort with LC_ALL=C sort, or run utils/fix_data_dir.sh",
                )
            first[k] = n
        raise AssertionError("unreachable")


def same_key(s: str) -> str:
    return s


def check_sorted_unique(path: PathLike) -> list[str]:
    """Check what Kaldi's ``check_sorted_and_uniq`` checks: every line ends with a
    newline and the first fields are strictly increasing in ``LC_ALL=C`` order.

    Returns the keys; raises InputError at the first offending line.
    """
    return Table(path).check_sorted_unique()


def utt2spk_to_spk2utt(utt2spk: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Invert ``utt -> spk``.  Speakers in order of first appearance, utterances in input
    order (exactly what Kaldi's ``utt2spk_to_spk2utt.pl`` prints)."""
    pairs = utt2spk.items() if isinstance(utt2spk, Mapping) else utt2spk
    out: dict[str, list[str]] = {}
    for utt, spk in pairs:
        out.setdefault(spk, []).append(utt)
    return out


def spk2utt_to_utt2spk(spk2utt: Mapping[str, Sequence[str]] | Iterable[tuple[str, Sequence[str]]]) -> dict[str, str]:
    """Expand ``spk -> [utts]`` into ``utt -> spk`` (spk2utt order, like ``spk2utt_to_utt2spk.pl``)."""
    pairs = spk2utt.items() if isinstance(spk2utt, Mapping) else spk2utt
    out: dict[str, str] = {}
    for spk, utts in pairs:
        for u in utts:
            if u in out:
                raise ValueError(f"utterance {u!r} belongs to both {out[u]!r} and {spk!r}")
            out[u] = spk
    return out


# --------------------------------------------------------------------------- numbers

_NUM_RE = re.compile(r"[ \t\n]*[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[ \t\n]*\Z")


def as_number(s: str) -> float | None:
    """The value of ``s`` when awk would treat it as a number, else None."""
    return float(s) if _NUM_RE.match(s) else None
