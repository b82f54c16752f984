"""Kaldi data directories: read, write and check them.

A data dir is a folder of small text tables keyed by their first field
(``utt2spk``, ``spk2utt``, ``wav.scp``, ``segments``, ``utt2dur``, ``feats.scp``,
...).  This module reads and writes such tables and checks a whole data dir the
way Kaldi's ``utils/validate_data_dir.sh`` does, with the same verdicts on the
same inputs (deliberate differences are listed in :meth:`DataDir.validate`).

Guarantees:

* every problem is an :class:`~spkflow.errors.InputError` naming the file and
  the 1-based line (``data/train/utt2spk:17: duplicate key 'a-01' (first on line 16)``),
  where Kaldi's script only says "file X is not sorted or has duplicates";
* bytes are kept: files are read as UTF-8 with ``surrogateescape`` so any byte
  sequence survives a read/write round trip, and "sorted" means ``LC_ALL=C sort``
  order, i.e. the order of the UTF-8 bytes (:func:`c_key`); validation rejects ids
  (utterance, speaker, recording) that are not UTF-8, naming file and line, since the
  feature and embedding arks cannot store them;
* fields are separated by runs of ASCII white space (what Perl's ``split " "``
  uses in Kaldi's scripts); only ``"\\n"`` ends a line;
* outputs are written atomically (:mod:`spkflow.atomic`): a crash never leaves a
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
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Union

from spkflow.atomic import atomic_write
from spkflow.errors import InputError

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
    "first_unsorted_k2",
    "utt2spk_to_spk2utt",
    "spk2utt_to_utt2spk",
    "DataDir",
    "validate_data_dir",
    "check_utf8_ids",
    "UTT_FILES",
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


def _show(s: str, limit: int = 60) -> str:
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
                raise InputError(path, n, f"expected {num_fields} fields, got {nf}: {_show(line)}")
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
_RAW_BYTE_RE = re.compile("[\udc80-\udcff]")
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
        self.key: Callable[[str], str | bytes] = c_key if _RAW_BYTE_RE.search(self.text) else _same
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
        ks = [self.key(k) for k in keys] if self.key is not _same else keys
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


def _same(s: str) -> str:
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


# --------------------------------------------------------------------------- checks

_NUM_RE = re.compile(r"[ \t\n]*[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[ \t\n]*\Z")


def as_number(s: str) -> float | None:
    """The value of ``s`` when awk would treat it as a number, else None."""
    return float(s) if _NUM_RE.match(s) else None


def sort_k2_key(line: str) -> tuple[bytes, bytes]:
    """Key of GNU ``LC_ALL=C sort -k2`` (field 2 to end of line, with its leading blanks,
    then the whole line as the last resort)."""
    s = line.rstrip("\n")
    i = 0
    while i < len(s) and s[i] in " \t":
        i += 1
    while i < len(s) and s[i] not in " \t":
        i += 1
    return c_key(s[i:]), c_key(s)


def _first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # a prefix of the other: no difference
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _same_keys(ref_path: PathLike, ref: Sequence[str], path: PathLike, keys: Sequence[str], what: str) -> None:
    """Raise InputError at the first line where ``keys`` (of ``path``) and ``ref`` differ."""
    i = _first_difference(ref, keys)
    if i is None:
        return
    ref_name, name = os.path.basename(os.fspath(ref_path)), os.path.basename(os.fspath(path))
    ref_set, key_set = set(ref), set(keys)
    if i < len(keys) and keys[i] not in ref_set:
        raise InputError(
            path,
            i + 1,
            f"{what} {keys[i]!r} is not in {ref_name} "
            f"({name} has {len(keys)} lines, {ref_name} {len(ref)}; "
            "utils/fix_data_dir.sh keeps the common ones)",
        )
    if i < len(ref) and ref[i] not in key_set:
        raise InputError(
            path,
            i + 1 if i < len(keys) else None,
            f"{what} {ref[i]!r} ({ref_name} line {i + 1}) is missing from {name} "
            f"({name} has {len(keys)} lines, {ref_name} {len(ref)}; "
            "utils/fix_data_dir.sh keeps the common ones)",
        )
    raise InputError(path, i + 1, f"{what} order differs from {ref_name} (line {i + 1})")


def _non_printable(ch: str) -> bool:
    """What ``grep '[^[:print:][:space:]]'`` finds in a UTF-8 locale: control characters and
    unassigned code points (bytes that are not UTF-8 never match there, nor here).  Kaldi's
    script falls back to the C locale when it does not find "C.UTF-8" in ``locale -a`` (glibc
    lists "C.utf8"), and then rejects every non-ASCII character; we do not copy that accident."""
    return unicodedata.category(ch) in ("Cc", "Cn") and ch not in WHITESPACE


# Symbols Kaldi forbids in text, matched as whole words like ``LC_ALL=C grep -w``.
_ILLEGAL_TEXT_SYMBOLS = [
    (s, re.compile(r"(?<![A-Za-z0-9_])" + re.escape(s) + r"(?![A-Za-z0-9_])")) for s in ("<s>", "</s>", "#0")
]


class DataDir:
    """A Kaldi data directory on disk.

    >>> d = DataDir("data/train")          # doctest: +SKIP
    >>> d.validate(no_text=True, no_feats=True)
    >>> d.utt2spk()["spk1-utt1"]
    'spk1'
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"DataDir({os.fspath(self.path)!r})"

    def file(self, name: str) -> Path:
        """Path of ``name`` inside the data dir (existing or not)."""
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def utt2spk(self) -> dict[str, str]:
        """``utt -> spk`` (InputError unless every line has exactly 2 fields and keys are unique)."""
        return read_kv(self.file("utt2spk"), num_fields=2)

    def spk2utt(self) -> dict[str, list[str]]:
        """``spk -> [utts]`` from spk2utt, or derived from utt2spk when spk2utt is absent."""
        if self.has("spk2utt"):
            return read_spk2utt(self.file("spk2utt"))
        return utt2spk_to_spk2utt(self.utt2spk())

    def utts(self) -> list[str]:
        return list(self.utt2spk())

    def spks(self) -> list[str]:
        return list(self.spk2utt())

    def table(self, name: str) -> dict[str, str]:
        """Any key-value table of the data dir (``wav.scp``, ``utt2dur``, ...)."""
        return read_kv(self.file(name))

    def utt2dur(self) -> dict[str, float]:
        """``utt -> seconds`` (InputError naming the line of a non-positive or non-numeric value)."""
        p = self.file("utt2dur")
        out: dict[str, float] = {}
        for n, (k, v) in enumerate(read_kv(p, num_fields=2).items(), 1):
            x = as_number(v)
            if x is None or not x > 0:
                raise InputError(p, n, f"duration of {k!r} must be a positive number, got {v!r}")
            out[k] = x
        return out

    # ------------------------------------------------------------------ validation

    def validate(
        self,
        *,
        no_feats: bool = True,
        no_text: bool = True,
        no_wav: bool = False,
        no_spk_sort: bool = False,
        non_print: bool = False,
    ) -> list[str]:
        """Check the data dir like Kaldi's ``validate_data_dir.sh``; return warnings.

        The ``no_*`` flags mean "this file need not exist" (it is still checked when it
        does).  Defaults suit speaker recipes (no ``text``, no ``feats.scp`` needed); the
        ``utils/validate_data_dir.sh`` front end keeps Kaldi's defaults.

        Deliberate differences from Kaldi (stricter; all on inputs Kaldi's later stages
        would trip on): a utt2spk line without exactly 2 fields fails (Kaldi prints
        "wrong format" but exits 0); ``segments`` must list exactly the utterances of
        utt2spk even without ``text`` (Kaldi checks it only when ``text`` exists); a
        spk2utt speaker without utterances fails; utt2dur / utt2num_frames / reco2dur
        values must be numbers (awk compares non-numbers as strings and lets "abc" pass);
        a blank line is always an error; an id (utterance, speaker, recording) with bytes that
        are not UTF-8 fails (:func:`check_utf8_ids`; Kaldi passes it, and stage 2 could not
        write features under it).  On the text checks see :func:`_non_printable`.
        """
        d = self.path
        warnings: list[str] = []
        if not d.is_dir():
            raise InputError(d, None, "no such directory")
        for f in ("spk2utt", "utt2spk"):
            p = self.file(f)
            if not p.is_file():
                raise InputError(p, None, "no such file")
            if p.stat().st_size == 0:
                raise InputError(p, None, "empty file")
        tables: dict[str, Table] = {}

        def table(name: str) -> Table:
            if name not in tables:
                tables[name] = Table(self.file(name))
                check_utf8_ids(tables[name], name)
            return tables[name]

        u2s_t, s2u_t = table("utt2spk"), table("spk2utt")
        u2s_path, s2u_path = u2s_t.path, s2u_t.path
        for n, f in enumerate(u2s_t.fields, 1):
            if len(f) != 2:
                raise InputError(
                    u2s_path, n, f"expected '<utt> <spk>' (2 fields), got {len(f)}: {_show(u2s_t.lines[n - 1])}"
                )
        u2s = [(f[0], f[1]) for f in u2s_t.fields]
        if len(s2u_t.lines) == 1:
            warnings.append(f"{s2u_path}: only one speaker; this is probably a bad idea")
        utts = u2s_t.check_sorted_unique()
        if not no_spk_sort:
            n = first_unsorted_k2(u2s_t)
            if n is not None:
                raise InputError(
                    u2s_path,
                    n,
                    "utt2spk is not sorted by speaker as well as by utterance "
                    f"({u2s[n - 1][1]!r} after {u2s[n - 2][1]!r}); make speaker ids "
                    "prefixes of utterance ids (or pass --no-spk-sort)",
                )
        spks = s2u_t.check_sorted_unique()
        self._check_spk2utt_matches(u2s, u2s_path, s2u_t)

        text = self.file("text")
        if not no_text:
            if not text.is_file():
                raise InputError(text, None, "no such file (if this is by design, use --no-text)")
            self._check_text(table("text"), utts, u2s_path, non_print)

        wav, segments = self.file("wav.scp"), self.file("segments")
        if segments.is_file() and not wav.is_file():
            raise InputError(wav, None, "no such file, but segments exists")
        if not wav.is_file() and not no_wav:
            raise InputError(wav, None, "no such file (if this is by design, use --no-wav)")
        recordings: list[str] | None = None
        if wav.is_file():
            wav_keys = table("wav.scp").check_sorted_unique()
            tilde = re.compile(r"[^ \t\n\r\f\v]+[ \t\n\r\f\v]+~")
            for n, line in enumerate(table("wav.scp").lines, 1):
                if "~" in line and tilde.match(line):
                    raise InputError(wav, n, "do not use '~' in wav.scp (file names are not tilde-expanded)")
            if segments.is_file():
                seg_t = table("segments")
                seg_keys = seg_t.check_sorted_unique()
                reco_set: set[str] = set()
                for n, f in enumerate(seg_t.fields, 1):
                    if len(f) != 4:
                        raise InputError(
                            segments, n, f"expected '<utt> <recording> <start> <end>', got {_show(seg_t.lines[n - 1])}"
                        )
                    if not _awk_greater(f[3], f[2]):
                        raise InputError(segments, n, f"end time {f[3]} is not after start time {f[2]}")
                    reco_set.add(f[1])
                _same_keys(u2s_path, utts, segments, seg_keys, "utterance")
                recordings = c_sorted(reco_set)
                _same_keys(segments, recordings, wav, wav_keys, "recording")
                self._check_r2fc(table, recordings, segments)
            else:
                _same_keys(u2s_path, utts, wav, wav_keys, "utterance")
                self._check_r2fc(table, utts, u2s_path)

        feats = self.file("feats.scp")
        if not feats.is_file() and not no_feats:
            raise InputError(feats, None, "no such file (if this is by design, use --no-feats)")
        if feats.is_file():
            _same_keys(u2s_path, utts, feats, table("feats.scp").check_sorted_unique(), "utterance")

        if self.has("cmvn.scp"):
            _same_keys(s2u_path, spks, self.file("cmvn.scp"), table("cmvn.scp").check_sorted_unique(), "speaker")
        if self.has("spk2gender"):
            t = table("spk2gender")
            keys = t.check_sorted_unique()
            for n, f in enumerate(t.fields, 1):
                if len(f) != 2 or f[1] not in ("m", "f"):
                    raise InputError(t.path, n, f"expected '<spk> m|f', got {_show(t.lines[n - 1])}")
            _same_keys(s2u_path, spks, t.path, keys, "speaker")
        for name, ref_path, ref, what in (
            ("spk2warp", s2u_path, spks, "speaker"),
            ("utt2warp", u2s_path, utts, "utterance"),
        ):
            if self.has(name):
                t = table(name)
                keys = t.check_sorted_unique()
                for n, f in enumerate(t.fields, 1):
                    x = as_number(f[1]) if len(f) == 2 else None
                    if x is None or not 0.5 < x < 1.5:
                        raise InputError(
                            t.path, n, f"expected '<id> <warp factor in (0.5, 1.5)>', got {_show(t.lines[n - 1])}"
                        )
                _same_keys(ref_path, ref, t.path, keys, what)
        for name in (*VAD_LIKE_FILES, "utt2lang", "utt2uniq"):
            if self.has(name):
                _same_keys(u2s_path, utts, self.file(name), table(name).check_sorted_unique(), "utterance")
        for name, integer in (("utt2dur", False), ("utt2num_frames", True)):
            if self.has(name):
                t = table(name)
                _same_keys(u2s_path, utts, t.path, t.check_sorted_unique(), "utterance")
                _check_positive(t, integer=integer)
        if self.has("reco2dur"):
            t = table("reco2dur")
            keys = t.check_sorted_unique()
            if recordings is not None:
                _same_keys(segments, recordings, t.path, keys, "recording")
            else:
                _same_keys(u2s_path, utts, t.path, keys, "recording")
            _check_positive(t, integer=False)
        return warnings

    @staticmethod
    def _check_spk2utt_matches(u2s: list[tuple[str, str]], u2s_path: Path, s2u: Table) -> None:
        """spk2utt expanded in file order must equal utt2spk line by line (Kaldi's ``cmp``)."""
        s2u_path = s2u.path
        expanded: list[tuple[str, str, int]] = []
        for n, f in enumerate(s2u.fields, 1):
            if len(f) < 2:
                raise InputError(s2u_path, n, f"speaker {f[0] if f else ''!r} has no utterances")
            expanded.extend((u, f[0], n) for u in f[1:])
        if len(expanded) == len(u2s) and all(a == b[:2] for a, b in zip(u2s, expanded, strict=True)):
            return
        where = dict(u2s)
        listed = {u: (s, n) for u, s, n in expanded}
        for i in range(max(len(u2s), len(expanded))):
            a = u2s[i] if i < len(u2s) else None
            b = expanded[i] if i < len(expanded) else None
            if a is not None and b is not None and a == b[:2]:
                continue
            if a is not None and a[0] not in listed:
                raise InputError(
                    u2s_path,
                    i + 1,
                    f"utterance {a[0]!r} of speaker {a[1]!r} is not in spk2utt "
                    "(regenerate it: utils/utt2spk_to_spk2utt.pl utt2spk > spk2utt)",
                )
            if a is not None and listed[a[0]][0] != a[1]:
                raise InputError(
                    s2u_path,
                    listed[a[0]][1],
                    f"spk2utt and utt2spk disagree: spk2utt puts {a[0]!r} "
                    f"under {listed[a[0]][0]!r}, utt2spk line {i + 1} says {a[1]!r}",
                )
            assert b is not None
            if b[0] not in where:
                raise InputError(s2u_path, b[2], f"utterance {b[0]!r} (speaker {b[1]!r}) is not in utt2spk")
            other = f"'{a[0]} {a[1]}'" if a is not None else "nothing"
            raise InputError(
                s2u_path,
                b[2],
                f"spk2utt and utt2spk do not match: expanding spk2utt gives "
                f"'{b[0]} {b[1]}' where utt2spk line {i + 1} has {other} "
                "(regenerate it: utils/utt2spk_to_spk2utt.pl utt2spk > spk2utt)",
            )

    @staticmethod
    def _check_text(t: Table, utts: list[str], u2s_path: Path, non_print: bool) -> None:
        lines, text = t.lines, t.path
        if not lines:
            raise InputError(text, None, "empty file")
        if not non_print:
            for n, line in enumerate(lines, 1):
                if any(_non_printable(c) for c in line):
                    raise InputError(text, n, "non-printable character (use --non-print to allow)")
        if t.key is _same:  # the whole file is UTF-8 (Kaldi's validate_text.pl checks only then)
            for n, line in enumerate(lines, 1):
                if not line.endswith("\n"):
                    raise InputError(text, n, "no newline at end of file")
                if "\r" in line:
                    raise InputError(text, n, "contains a CR (0x0D) character")
                body = re.sub("[\t\n ]", ".", line)
                if any(c.isspace() for c in body):
                    raise InputError(text, n, "contains disallowed Unicode white space")
        keys = t.check_sorted_unique()
        for n, line in enumerate(lines, 1):
            for sym, rx in _ILLEGAL_TEXT_SYMBOLS:
                if rx.search(line):
                    raise InputError(text, n, f"contains the illegal symbol {sym!r}")
        _same_keys(u2s_path, utts, text, keys, "utterance")

    def _check_r2fc(self, table: Callable[[str], Table], ref: list[str], ref_path: Path) -> None:
        if not self.has("reco2file_and_channel"):
            return
        t = table("reco2file_and_channel")
        keys = t.check_sorted_unique()
        for n, f in enumerate(t.fields, 1):
            if len(f) != 3 or f[2] not in ("A", "B", "1"):
                raise InputError(t.path, n, f"expected '<recording> <file> A|B', got {_show(t.lines[n - 1])}")
        _same_keys(ref_path, ref, t.path, keys, "recording")


#: Fields of each table that are ids (0-based; None: every field): utterance, speaker and
#: recording ids.  Every other table's first field is its id.
_ID_FIELDS: dict[str, tuple[int, ...] | None] = {"utt2spk": (0, 1), "spk2utt": None, "segments": (0, 1)}


def check_utf8_ids(t: Table, name: str | None = None) -> None:
    """InputError at the first line of ``t`` whose id (utterance, speaker or recording id:
    the first field; both ids of utt2spk and segments; every field of spk2utt) holds bytes
    that are not UTF-8.  Values (paths, transcripts) may hold any bytes.  Free when the file
    is all UTF-8.  ``name`` is the table's file name (default: that of ``t.path``)."""
    if t.key is _same:  # no byte that is not UTF-8 anywhere in the file
        return
    cols = _ID_FIELDS.get(name or t.path.name, (0,))
    for n, f in enumerate(t.fields, 1):
        for i, x in enumerate(f):
            if (cols is None or i in cols) and _RAW_BYTE_RE.search(x):
                shown = x.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                raise InputError(
                    t.path,
                    n,
                    f"id '{shown}' holds bytes that are not UTF-8; utterance, speaker and recording ids must "
                    "be UTF-8 text (features and embeddings are stored under them); rename it",
                )


def validate_data_dir(
    path: PathLike,
    *,
    no_feats: bool = True,
    no_text: bool = True,
    no_wav: bool = False,
    no_spk_sort: bool = False,
    non_print: bool = False,
) -> list[str]:
    """Check the data dir at ``path`` (:meth:`DataDir.validate`, the checks of
    ``utils/validate_data_dir.sh``); returns warnings, raises InputError (file, line) on the
    first problem.  What stage 2 calls on its input before any job starts."""
    return DataDir(path).validate(
        no_feats=no_feats, no_text=no_text, no_wav=no_wav, no_spk_sort=no_spk_sort, non_print=non_print
    )


def _check_positive(t: Table, *, integer: bool) -> None:
    for n, f in enumerate(t.fields, 1):
        x = as_number(f[1]) if len(f) == 2 else None
        if x is None or not x > 0 or (integer and x != int(x)):
            kind = "positive integer" if integer else "positive number"
            raise InputError(t.path, n, f"expected '<id> <{kind}>', got {_show(t.lines[n - 1])}")


def first_unsorted_k2(t: Table) -> int | None:
    """1-based line breaking ``LC_ALL=C sort -k2 -C`` order (field 2 to end of line with its
    leading blanks, then the whole line), or None."""
    if t.key is _same and t.is_two_column():
        # "<utt> <spk>" lines: the sort key is (" <spk>", line), ordered as (spk, line)
        spks = [f[1] for f in t.fields]
        pairs = list(zip(spks, t.lines, strict=True))
        if not any(map(operator.gt, pairs, pairs[1:])):
            return None
    keys: list[tuple[str | bytes, str | bytes]] = []
    for line, f in zip(t.lines, t.fields, strict=True):
        s = line[:-1] if line.endswith("\n") else line
        f0 = f[0] if f else ""
        if t.key is _same and s.startswith(f0) and (len(s) == len(f0) or s[len(f0)] in " \t"):
            keys.append((s[len(f0) :], s))
        else:
            k2, whole = sort_k2_key(line)
            keys.append(
                (k2, whole)
                if t.key is not _same
                else (k2.decode("utf-8", "surrogateescape"), whole.decode("utf-8", "surrogateescape"))
            )
    if not any(map(operator.gt, keys, keys[1:])):
        return None
    return next(i + 2 for i in range(len(keys) - 1) if keys[i] > keys[i + 1])


def _awk_greater(a: str, b: str) -> bool:
    """awk's ``a > b`` on two fields: numeric when both look numeric, else byte comparison."""
    x, y = as_number(a), as_number(b)
    if x is not None and y is not None:
        return x > y
    return c_key(a) > c_key(b)
