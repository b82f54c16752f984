"""The pipeline steps of Kaldi's data-dir scripts, over tables held as lists of raw lines.

``sort -k1,1 -u``, ``filter_scp.pl``, ``apply_map.pl``, awk's field splitting and comparisons,
``utt2spk_to_spk2utt.pl``: each reproduced with its exact ordering and white-space rules, so
that :mod:`~spkflow.data.fix`, :mod:`~spkflow.data.subset` and :mod:`~spkflow.data.combine`
write the same bytes as Kaldi's ``fix_data_dir.sh``, ``subset_data_dir.sh``,
``combine_data.sh`` and ``copy_data_dir.sh``.  :func:`commit_tables` writes a set of tables all
or none.

What it does better than the anchor (Kaldi's scripts):

* all-or-nothing: inputs are checked and the result is computed in memory first, so
  on bad input (an error naming the file and line) nothing is touched, where Kaldi's
  fix_data_dir.sh may already have rewritten some files; the outputs are then written
  under temporary names and renamed into place only when all are complete, so a full
  disk leaves the destination as it was;
* a key twice in a table that ``subset_data_dir`` or ``copy_data_dir`` reads is such an
  error (Kaldi's scripts copy both lines);
* ``fix_data_dir`` keeps the *original* bytes of every file it changes in
  ``.backup/`` (Kaldi overwrites part of its backup with already-sorted copies),
  and a second run that changes nothing leaves that backup alone;
* ``combine_data`` refuses a destination that is also a source (Kaldi deletes it).

Deliberate differences, all on bad input: a blank line in a table that Kaldi would
feed to ``filter_scp.pl`` is an error here (Kaldi's pipelines let that die without
``set -e`` and go on with truncated files); a source table of ``combine_data``
without a final newline gets one (Kaldi's ``cat`` glues its last line to the next
source's first line); utt2spk lines without exactly two fields are an error up front.

Standard library only (``--shortest`` without utt2num_frames reads feats.scp
through kaldiio, imported on demand).
"""

from __future__ import annotations

import operator
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError
from spkflow.data.check import first_unsorted_k2
from spkflow.data.tables import PathLike, Table, as_number, c_key, read_lines, write_lines

Log = Callable[[str], None]
Lines = list[str]

__all__ = [
    "Lines",
    "Log",
    "TableSet",
    "awk_fields",
    "awk_gt0",
    "check_no_blank",
    "check_unique",
    "check_utt2spk_lines",
    "commit_tables",
    "filter_file",
    "filter_lines",
    "first_field",
    "id_set",
    "is_clean",
    "is_sorted_k2",
    "line_body",
    "line_fields",
    "line_keys",
    "ok_lines",
    "quiet",
    "sort_k1_unique",
    "sort_lines",
    "spk2utt_to_utt2spk_lines",
    "unique_lines",
    "utt2spk_to_spk2utt_lines",
    "with_newline",
]


def quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- line primitives

_AWK_FIELDS_RE = re.compile(r"[^ \t\n]+")  # awk's default field splitting
_PERL_FIRST_RE = re.compile(r"[^ \t\n\r\f\v]+")  # Perl's \S+


def awk_fields(line: str) -> list[str]:
    return _AWK_FIELDS_RE.findall(line)


def with_newline(line: str) -> str:
    return line if line.endswith("\n") else line + "\n"


def line_body(line: str) -> str:
    return line[:-1] if line.endswith("\n") else line


def first_field(line: str) -> str | None:
    m = _PERL_FIRST_RE.search(line)
    return m.group(0) if m else None


def line_keys(lines: Sequence[str]) -> list[str]:
    """First field of each line, '' for a blank line (Perl's ``m/(\\S+)/``)."""
    return Table("-", lines).keys


def line_fields(lines: Sequence[str]) -> Sequence[Sequence[str]]:
    return Table("-", lines).fields


def id_set(lines: Sequence[str]) -> set[str]:
    """First fields of an id list (``filter_scp.pl``'s first argument)."""
    keys = line_keys(lines)
    if "" in keys:
        raise ValueError("empty line in id list")
    return set(keys)


def filter_lines(
    lines: Sequence[str], ids: Iterable[str] | set[str], *, exclude: bool = False, field_no: int = 1
) -> Lines:
    """``filter_scp.pl [--exclude] [-f field_no]``: the lines whose field is (not) in ``ids``."""
    ids = ids if isinstance(ids, set) else set(ids)
    if field_no == 1:
        keys = line_keys(lines)
    else:
        keys = [f[field_no - 1] if len(f) >= field_no else "" for f in line_fields(lines)]
    if "" in keys:
        raise ValueError("line without the field to filter on")
    if exclude:
        return [line for line, k in zip(lines, keys, strict=True) if k not in ids]
    return [line for line, k in zip(lines, keys, strict=True) if k in ids]


_K1_RE = re.compile(r"[ \t]*[^ \t\n]*")


def is_clean(lines: Sequence[str]) -> bool:
    """No bytes that are not UTF-8: then str order is LC_ALL=C byte order."""
    return Table("-", lines).key is not c_key


def sort_k1_unique(lines: Sequence[str]) -> Lines:
    """``LC_ALL=C sort -k1,1 -u``: by first field (with its leading blanks), first of equals kept."""
    keys: list[str] | list[bytes] = [_K1_RE.match(line).group(0) for line in lines]  # type: ignore[union-attr]
    if not is_clean(lines):
        keys = [c_key(k) for k in keys]  # type: ignore[arg-type]
    if not any(map(operator.ge, keys, keys[1:])):  # already sorted and unique
        return [with_newline(x) for x in lines]
    out: Lines = []
    prev = None
    for i in sorted(range(len(lines)), key=keys.__getitem__):
        if keys[i] != prev:
            out.append(with_newline(lines[i]))
        prev = keys[i]
    return out


def sort_lines(lines: Iterable[str]) -> Lines:
    """``LC_ALL=C sort`` (also ``sort -k1``): whole lines as bytes."""
    nl = [with_newline(x) for x in lines]
    if is_clean(nl):
        return sorted(nl, key=lambda s: s[:-1])
    return sorted(nl, key=lambda s: c_key(s[:-1]))


def is_sorted_k2(lines: Sequence[str]) -> int | None:
    """0-based index of the first line breaking ``sort -k2 -C`` order, or None."""
    n = first_unsorted_k2(Table("-", lines))
    return None if n is None else n - 1


def utt2spk_to_spk2utt_lines(lines: Sequence[str]) -> Lines:
    order: dict[str, list[str]] = {}
    for f in line_fields(lines):
        order.setdefault(f[1], []).append(f[0])
    return [f"{s} {' '.join(u)}\n" for s, u in order.items()]


def spk2utt_to_utt2spk_lines(lines: Sequence[str]) -> Lines:
    out = []
    for f in line_fields(lines):
        out.extend(f"{u} {f[0]}\n" for u in f[1:])
    return out


def awk_gt0(s: str) -> bool:
    """awk's ``$2 > 0``: numeric when the field looks numeric, else a string comparison."""
    x = as_number(s)
    return x > 0 if x is not None else c_key(s) > b"0"


def ok_lines(lines: Sequence[str]) -> Lines:
    """``awk '{ if (NF == 2 && $2 > 0) print }'``."""
    t = Table("-", lines)
    fields = t.fields if t.is_two_column() else [awk_fields(x) for x in lines]
    return [with_newline(line) for line, f in zip(lines, fields, strict=True) if len(f) == 2 and awk_gt0(f[1])]


def check_no_blank(path: PathLike, lines: Sequence[str]) -> None:
    keys = line_keys(lines)
    if "" in keys:
        raise InputError(path, keys.index("") + 1, "empty line")


def check_unique(path: PathLike, lines: Sequence[str]) -> None:
    """InputError at the second line of a key already seen (tables keyed by their first field)."""
    keys = line_keys(lines)
    if len(set(keys)) == len(keys):
        return
    first: dict[str, int] = {}
    for n, k in enumerate(keys, 1):
        if k in first:
            raise InputError(
                path, n, f"duplicate key {k!r} (first on line {first[k]}); utils/fix_data_dir.sh keeps the first"
            )
        first[k] = n


def check_utt2spk_lines(path: PathLike, lines: Sequence[str]) -> None:
    t = Table(path, lines)
    if t.is_two_column():
        return
    for n, (line, f) in enumerate(zip(lines, t.fields, strict=True), 1):
        nf = len(f)
        if nf != 2:
            raise InputError(path, n, f"expected '<utt> <spk>' (2 fields), got {nf}: {line_body(line)!r}")


class TableSet:
    """The tables of a data dir in memory: name -> lines; remembers the originals."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.orig: dict[str, Lines] = {}
        self.cur: dict[str, Lines] = {}

    def load(self, name: str) -> bool:
        p = self.data / name
        if name in self.cur:
            return True
        if not p.is_file():
            return False
        lines = read_lines(p)
        self.orig[name] = lines
        self.cur[name] = list(lines)
        return True

    def __contains__(self, name: str) -> bool:
        return name in self.cur

    def __getitem__(self, name: str) -> Lines:
        return self.cur[name]

    def __setitem__(self, name: str, lines: Lines) -> None:
        self.cur[name] = lines

    def changed(self) -> list[str]:
        return [n for n, v in self.cur.items() if n not in self.orig or v != self.orig[n]]


def filter_file(path: Path, ids: set[str]) -> Lines:
    lines = read_lines(path)
    check_no_blank(path, lines)
    check_unique(path, lines)
    return filter_lines(lines, ids)


def unique_lines(path: Path) -> Lines:
    """The lines of a table whose keys must be unique (InputError at a repeated key)."""
    lines = read_lines(path)
    check_unique(path, lines)
    return lines


def commit_tables(dest: Path, files: dict[str, Lines | bytes]) -> None:
    """Write ``files`` (name -> lines, or bytes copied as they are) into ``dest``, all or none:
    each is written completely under a temporary directory inside ``dest`` first and renamed
    into place only when all are, so a failure (a full disk) changes nothing in ``dest`` (and
    removes ``dest`` again if this call made it)."""
    made = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".new.", dir=dest))
    try:
        for name, content in files.items():
            if isinstance(content, bytes):
                with atomic_write(tmp / name, "wb", encoding=None) as g:
                    g.write(content)
            else:
                write_lines(tmp / name, content)
        for name in files:
            os.replace(tmp / name, dest / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if made:
            shutil.rmtree(dest, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
