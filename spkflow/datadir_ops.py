"""Operations on Kaldi data directories: fix, subset, combine, copy.

Each function does what the Kaldi script of the same name does
(``utils/fix_data_dir.sh``, ``subset_data_dir.sh``, ``combine_data.sh``,
``copy_data_dir.sh``) and writes the same bytes for the same inputs: the tables
are handled as lists of raw lines and every step of Kaldi's shell pipelines
(``sort -k1,1 -u``, ``filter_scp.pl``, ``apply_map.pl``, awk one-liners, Perl's
``rand`` for ``--speakers``) is reproduced with its exact ordering and
white-space rules.

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
through kaldiio, imported on demand).  One module for the four operations (about
970 lines) because they share the pipeline steps above; split it by operation if it grows.
"""

from __future__ import annotations

import operator
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

from spkflow.atomic import atomic_write
from spkflow.datadir import (
    VAD_LIKE_FILES,
    PathLike,
    Table,
    as_number,
    c_key,
    read_lines,
    split_fields,
    write_lines,
)
from spkflow.datadir_check import first_unsorted_k2
from spkflow.errors import InputError

Log = Callable[[str], None]
Lines = list[str]

__all__ = [
    "FixReport",
    "fix_data_dir",
    "subset_data_dir",
    "combine_data",
    "copy_data_dir",
    "filter_lines",
    "subset_lines",
    "PerlRandom",
]


def _quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- line primitives

_AWK_FIELDS_RE = re.compile(r"[^ \t\n]+")  # awk's default field splitting
_PERL_FIRST_RE = re.compile(r"[^ \t\n\r\f\v]+")  # Perl's \S+


def _awk_fields(line: str) -> list[str]:
    return _AWK_FIELDS_RE.findall(line)


def _nl(line: str) -> str:
    return line if line.endswith("\n") else line + "\n"


def _body(line: str) -> str:
    return line[:-1] if line.endswith("\n") else line


def _first(line: str) -> str | None:
    m = _PERL_FIRST_RE.search(line)
    return m.group(0) if m else None


def _keys(lines: Sequence[str]) -> list[str]:
    """First field of each line, '' for a blank line (Perl's ``m/(\\S+)/``)."""
    return Table("-", lines).keys


def _fields(lines: Sequence[str]) -> Sequence[Sequence[str]]:
    return Table("-", lines).fields


def _id_set(lines: Sequence[str]) -> set[str]:
    """First fields of an id list (``filter_scp.pl``'s first argument)."""
    keys = _keys(lines)
    if "" in keys:
        raise ValueError("empty line in id list")
    return set(keys)


def filter_lines(
    lines: Sequence[str], ids: Iterable[str] | set[str], *, exclude: bool = False, field_no: int = 1
) -> Lines:
    """``filter_scp.pl [--exclude] [-f field_no]``: the lines whose field is (not) in ``ids``."""
    ids = ids if isinstance(ids, set) else set(ids)
    if field_no == 1:
        keys = _keys(lines)
    else:
        keys = [f[field_no - 1] if len(f) >= field_no else "" for f in _fields(lines)]
    if "" in keys:
        raise ValueError("line without the field to filter on")
    if exclude:
        return [line for line, k in zip(lines, keys, strict=True) if k not in ids]
    return [line for line, k in zip(lines, keys, strict=True) if k in ids]


_K1_RE = re.compile(r"[ \t]*[^ \t\n]*")


def _clean(lines: Sequence[str]) -> bool:
    """No bytes that are not UTF-8: then str order is LC_ALL=C byte order."""
    return Table("-", lines).key is not c_key


def _sort_k1_unique(lines: Sequence[str]) -> Lines:
    """``LC_ALL=C sort -k1,1 -u``: by first field (with its leading blanks), first of equals kept."""
    keys: list[str] | list[bytes] = [_K1_RE.match(line).group(0) for line in lines]  # type: ignore[union-attr]
    if not _clean(lines):
        keys = [c_key(k) for k in keys]  # type: ignore[arg-type]
    if not any(map(operator.ge, keys, keys[1:])):  # already sorted and unique
        return [_nl(x) for x in lines]
    out: Lines = []
    prev = None
    for i in sorted(range(len(lines)), key=keys.__getitem__):
        if keys[i] != prev:
            out.append(_nl(lines[i]))
        prev = keys[i]
    return out


def _sort_lines(lines: Iterable[str]) -> Lines:
    """``LC_ALL=C sort`` (also ``sort -k1``): whole lines as bytes."""
    nl = [_nl(x) for x in lines]
    if _clean(nl):
        return sorted(nl, key=lambda s: s[:-1])
    return sorted(nl, key=lambda s: c_key(s[:-1]))


def _is_sorted_k2(lines: Sequence[str]) -> int | None:
    """0-based index of the first line breaking ``sort -k2 -C`` order, or None."""
    n = first_unsorted_k2(Table("-", lines))
    return None if n is None else n - 1


def _utt2spk_to_spk2utt(lines: Sequence[str]) -> Lines:
    order: dict[str, list[str]] = {}
    for f in _fields(lines):
        order.setdefault(f[1], []).append(f[0])
    return [f"{s} {' '.join(u)}\n" for s, u in order.items()]


def _spk2utt_to_utt2spk(lines: Sequence[str]) -> Lines:
    out = []
    for f in _fields(lines):
        out.extend(f"{u} {f[0]}\n" for u in f[1:])
    return out


def _awk_gt0(s: str) -> bool:
    """awk's ``$2 > 0``: numeric when the field looks numeric, else a string comparison."""
    x = as_number(s)
    return x > 0 if x is not None else c_key(s) > b"0"


def _ok_lines(lines: Sequence[str]) -> Lines:
    """``awk '{ if (NF == 2 && $2 > 0) print }'``."""
    t = Table("-", lines)
    fields = t.fields if t.is_two_column() else [_awk_fields(x) for x in lines]
    return [_nl(line) for line, f in zip(lines, fields, strict=True) if len(f) == 2 and _awk_gt0(f[1])]


def _check_no_blank(path: PathLike, lines: Sequence[str]) -> None:
    keys = _keys(lines)
    if "" in keys:
        raise InputError(path, keys.index("") + 1, "empty line")


def _check_unique(path: PathLike, lines: Sequence[str]) -> None:
    """InputError at the second line of a key already seen (tables keyed by their first field)."""
    keys = _keys(lines)
    if len(set(keys)) == len(keys):
        return
    first: dict[str, int] = {}
    for n, k in enumerate(keys, 1):
        if k in first:
            raise InputError(
                path, n, f"duplicate key {k!r} (first on line {first[k]}); utils/fix_data_dir.sh keeps the first"
            )
        first[k] = n


def _check_utt2spk_lines(path: PathLike, lines: Sequence[str]) -> None:
    t = Table(path, lines)
    if t.is_two_column():
        return
    for n, (line, f) in enumerate(zip(lines, t.fields, strict=True), 1):
        nf = len(f)
        if nf != 2:
            raise InputError(path, n, f"expected '<utt> <spk>' (2 fields), got {nf}: {_body(line)!r}")


class _Files:
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


# --------------------------------------------------------------------------- file lists
#
# The tables each operation handles, in Kaldi's order (the order fixes the order of log
# lines).  The optional utterance-indexed files that follow vad.scp's rules
# (:data:`spkflow.datadir.VAD_LIKE_FILES`: filtered to the kept utterances but never a
# reason to drop one, subset / combined / copied along, renamed by copy's prefix/suffix)
# appear wherever Kaldi names vad.scp.

#: fix_data_dir: every table it reads, sorts (``sort -k1,1 -u``) and may rewrite.
_FIX_FILES = (
    "utt2spk",
    "spk2utt",
    "feats.scp",
    "text",
    "segments",
    "wav.scp",
    "cmvn.scp",
    *VAD_LIKE_FILES,
    "reco2file_and_channel",
    "spk2gender",
    "utt2lang",
    "utt2uniq",
    "utt2dur",
    "reco2dur",
    "utt2num_frames",
)
#: fix_data_dir: utterance-indexed tables filtered to the kept utterances (+ wav.scp / reco2dur
#: without segments).
_FIX_UTT_FILTERED = (
    "utt2spk",
    "utt2uniq",
    "feats.scp",
    *VAD_LIKE_FILES,
    "text",
    "segments",
    "utt2lang",
    "utt2dur",
    "utt2num_frames",
)
#: subset_data_dir: tables filtered by utterance / by speaker.
_SUBSET_UTT_FILES = (
    "feats.scp",
    *VAD_LIKE_FILES,
    "utt2lang",
    "utt2dur",
    "utt2num_frames",
    "utt2uniq",
    "wav.scp",
    "utt2warp",
    "text",
)
_SUBSET_SPK_FILES = ("spk2warp", "spk2gender", "cmvn.scp")
#: combine_data: tables concatenated when every source has them.
_COMBINE_FILES = (
    "utt2spk",
    "utt2lang",
    "utt2dur",
    "utt2num_frames",
    "reco2dur",
    "feats.scp",
    "text",
    "cmvn.scp",
    *VAD_LIKE_FILES,
    "reco2file_and_channel",
    "wav.scp",
    "spk2gender",
)
#: copy_data_dir: utterance-indexed tables renamed by utterance id (segments or, without it,
#: wav.scp go between the two parts; reco2dur is appended when it is utterance-indexed).
_COPY_UTT_FILES_HEAD = ("feats.scp", *VAD_LIKE_FILES, "utt2lang")
_COPY_UTT_FILES_TAIL = ("text", "utt2dur", "utt2num_frames")
#: copy_data_dir: speaker-indexed tables renamed by speaker id, and tables copied byte for byte.
_COPY_SPK_FILES = ("spk2gender", "cmvn.scp")
_COPY_RAW_FILES = ("reco2file_and_channel", "frame_shift", "stm", "glm", "ctm")
#: copy_data_dir: a file of dest that the source lacks is moved to dest/.backup.
_COPY_STALE_FILES = (
    "feats.scp",
    "cmvn.scp",
    *VAD_LIKE_FILES,
    "utt2lang",
    "utt2uniq",
    "utt2dur",
    "utt2num_frames",
    "text",
    "wav.scp",
    "reco2file_and_channel",
    "frame_shift",
    "stm",
    "glm",
    "ctm",
)


# --------------------------------------------------------------------------- fix_data_dir


@dataclass
class FixReport:
    """What :func:`fix_data_dir` did."""

    kept: int  # utterances kept
    total: int  # utterances in utt2spk before (after removing duplicate keys)
    changed: list[str] = field(default_factory=list)  # files rewritten (originals in .backup/)


def fix_data_dir(
    data: PathLike, *, utt_extra_files: Sequence[str] = (), spk_extra_files: Sequence[str] = (), log: Log = _quiet
) -> FixReport:
    """Make a data dir consistent, exactly like Kaldi's ``utils/fix_data_dir.sh``.

    Sorts every table by key (dropping later duplicates of a key), keeps only the
    speakers present in spk2gender / cmvn.scp (when they exist), keeps only the
    utterances present in utt2spk, feats.scp, text, segments, utt2lang, wav.scp
    (when indexed by utterance), and utt2dur / utt2num_frames (lines with a
    positive value), filters every utterance-, speaker- and recording-indexed file
    to match, and regenerates spk2utt.  Like Kaldi, vad.scp and utt2uniq are
    filtered but do not remove utterances; so are cmvn_utt.scp and
    cmvn_utt_voiced.scp (:data:`~spkflow.datadir.VAD_LIKE_FILES`).

    Raises InputError (file, line) when the data dir cannot be fixed: a malformed
    utt2spk line, a blank line, utterance ids that do not sort with their
    speakers, no utterance left.  Then nothing is written.  Otherwise each
    changed file is written atomically after its original is copied to ``.backup/``.
    """
    d = Path(data)
    if not d.is_dir():
        raise InputError(d, None, "no such directory")
    if not (d / "utt2spk").is_file():
        raise InputError(d / "utt2spk", None, "no such file")
    F = _Files(d)
    names = list(dict.fromkeys([*_FIX_FILES, *utt_extra_files, *spk_extra_files]))
    for name in names:
        if F.load(name):
            if name != "spk2utt":  # spk2utt is regenerated from utt2spk, as in Kaldi
                _check_no_blank(d / name, F[name])
            s = _sort_k1_unique(F[name])
            if s != F[name]:
                log(f"fix_data_dir.sh: file {d / name} is not in sorted order or not unique, sorting it")
            F[name] = s
    # utt2spk_to_spk2utt.pl dies on a line without 2 fields: locate it in the original file.
    u2s_t = Table(d / "utt2spk", F["utt2spk"])
    if not u2s_t.is_two_column() and any(len(f) != 2 for f in u2s_t.fields):
        _check_utt2spk_lines(d / "utt2spk", F.orig["utt2spk"])

    def filter_file(ids: set[str], name: str) -> None:
        before = F[name]
        F[name] = filter_lines(before, ids)
        if len(F[name]) != len(before):
            log(f"fix_data_dir.sh: filtered {d / name} from {len(before)} to {len(F[name])} lines")

    def filter_recordings() -> None:
        if "segments" not in F:
            return
        if "wav.scp" not in F:
            raise InputError(d / "wav.scp", None, "no such file, but segments exists")
        recos = sorted({f[1] if len(f) > 1 else "" for f in map(_awk_fields, F["segments"])}, key=c_key)
        if not recos:
            raise InputError(d / "segments", None, "empty list of recordings")
        recos = filter_lines([r + "\n" for r in recos], _id_set(F["wav.scp"]))
        reco_set = {r[:-1] for r in recos}

        def swap(lines: Lines) -> Lines:
            out = []
            for line in lines:
                f = _awk_fields(line) + ["", "", "", ""]
                out.append(f"{f[1]} {f[0]} {f[2]} {f[3]}\n")
            return out

        before = swap(F["segments"])
        after = filter_lines(before, reco_set)
        if len(after) != len(before):
            log(f"fix_data_dir.sh: filtered {d / 'segments'} from {len(before)} to {len(after)} lines")
        F["segments"] = swap(after)
        for name in ("wav.scp", "reco2file_and_channel", "reco2dur"):
            if name in F:
                filter_file(reco_set, name)

    def filter_speakers() -> None:
        spk2utt = _utt2spk_to_spk2utt(F["utt2spk"])
        speakers = [_first(x) + "\n" for x in spk2utt]  # type: ignore[operator]
        for name in ("cmvn.scp", "spk2gender"):
            if name in F:
                speakers = filter_lines(speakers, _id_set(F[name]))
        spk_set = {s[:-1] for s in speakers}
        F["spk2utt"] = filter_lines(spk2utt, spk_set)
        F["utt2spk"] = _spk2utt_to_utt2spk(F["spk2utt"])
        for name in ("cmvn.scp", "spk2gender", *spk_extra_files):
            if name in F:
                filter_file(spk_set, name)

    def filter_utts() -> tuple[int, int]:
        u2s = F["utt2spk"]
        if _sort_lines(u2s) != u2s or _is_sorted_k2(u2s) is not None:
            # Kaldi: "utt2spk is not in sorted order ... (fix this yourself)".  Point at the
            # user's line: the first (sorted) utt2spk line whose speaker breaks the order.
            sorted_u2s = _sort_k1_unique(F.orig["utt2spk"])
            i = _is_sorted_k2(sorted_u2s)
            line = sorted_u2s[i if i is not None else 0]
            n = F.orig["utt2spk"].index(line) + 1 if line in F.orig["utt2spk"] else None
            raise InputError(
                d / "utt2spk",
                n,
                f"utterance {_first(line)!r} does not sort with its speaker "
                "(utt2spk sorted by utterance must also be sorted by speaker): "
                "make speaker ids prefixes of utterance ids",
            )
        if _sort_lines(F["spk2utt"]) != F["spk2utt"]:
            raise InputError(
                d / "spk2utt",
                None,
                "speakers do not sort like their utterances (make speaker ids prefixes of utterance ids)",
            )
        if "utt2uniq" in F and _sort_lines(F["utt2uniq"]) != F["utt2uniq"]:
            raise InputError(d / "utt2uniq", None, "not in sorted order (fix this yourself)")
        utts = [k + "\n" for k in _keys(u2s)]  # u2s is "<utt> <spk>\n" lines here
        sources: list[tuple[str, Lines]] = []
        for name in ("feats.scp", "text", "segments", "utt2lang"):
            if name in F:
                sources.append((name, F[name]))
        if "segments" not in F and "wav.scp" in F:
            sources.append(("wav.scp", F["wav.scp"]))
        for name in ("utt2dur", "utt2num_frames"):
            if name in F:
                sources.append((name, _ok_lines(F[name])))
        for _, lines in sources:
            utts = filter_lines(utts, _id_set(lines))
        if not utts:
            raise InputError(
                d,
                None,
                "fix_data_dir.sh: no utterances remained: not proceeding further "
                "(no utterance is in all of " + ", ".join(["utt2spk"] + [n for n, _ in sources]) + ")",
            )
        new, old = len(utts), len(u2s)
        if new != old:
            log(f"fix_data_dir.sh: kept {new} utterances out of {old}")
        else:
            log(f"fix_data_dir.sh: kept all {old} utterances.")
        utt_set = {u[:-1] for u in utts}
        names = list(_FIX_UTT_FILTERED)
        if "segments" not in F:
            names.append("wav.scp")
            if "reco2dur" in F and F["reco2dur"]:
                names.append("reco2dur")
        for name in (*names, *utt_extra_files):
            if name in F:
                F[name] = filter_lines(F[name], utt_set)
        return new, old

    filter_recordings()
    filter_speakers()
    kept, total = filter_utts()
    filter_speakers()
    filter_recordings()
    F["spk2utt"] = _utt2spk_to_spk2utt(F["utt2spk"])

    changed = F.changed()
    backup = d / ".backup"
    backup.mkdir(exist_ok=True)
    for name in changed:
        if name in F.orig:
            write_lines(backup / name, F.orig[name])
    _commit(d, {name: F[name] for name in changed})
    log(f"fix_data_dir.sh: old files are kept in {backup}")
    return FixReport(kept=kept, total=total, changed=changed)


# --------------------------------------------------------------------------- subset_data_dir


class PerlRandom:
    """Perl's ``srand``/``rand`` (Perl >= 5.20 uses its own drand48 on every platform)."""

    _A, _C, _M = 0x5DEECE66D, 0xB, 1 << 48

    def __init__(self, seed: int = 0) -> None:
        self.x = ((seed & 0xFFFFFFFF) << 16) + 0x330E

    def rand(self) -> float:
        self.x = (self._A * self.x + self._C) % self._M
        return self.x / float(self._M)


def _shuffle_list(lines: Sequence[str], seed: int = 0) -> Lines:
    """Kaldi's ``shuffle_list.pl``: sort lines by the string form of Perl ``rand()``."""
    r = PerlRandom(seed)
    keyed = [(f"{r.rand():.15g}", i, line) for i, line in enumerate(lines)]
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [_nl(line) for _, _, line in keyed]


def subset_lines(lines: Sequence[str], n: int, mode: str = "spread") -> Lines:
    """``subset_scp.pl``: ``n`` lines, spread evenly (default), or the ``first`` / ``last`` n."""
    if n > len(lines):
        raise ValueError(f"requested {n} lines of {len(lines)}")
    if mode == "first":
        return list(lines[:n])
    if mode == "last":
        return list(lines[len(lines) - n :]) if n > 0 else []
    out: Lines = []

    def select(start: int, end: int, needed: int) -> None:
        diff = end - start
        if diff == 1:
            if needed > 0:
                out.append(lines[start])
            return
        half, half_needed = diff // 2, needed // 2
        select(start, start + half, half_needed)
        select(start + half, end, needed - half_needed)

    if n > 0:
        select(0, len(lines), n)
    return out


def _per_spk(spk2utt: Sequence[str], n: int) -> Lines:
    """The awk of ``subset_data_dir.sh --per-spk`` (keeps its trailing space)."""
    out = []
    for line in spk2utt:
        f = _awk_fields(line)
        nf = len(f)
        skip = 1
        while n * (skip + 1) <= nf - 1:
            skip += 1
        picked = [f[x - 1] for x in range(2, nf + 1, skip) if x <= n * skip + 1]
        out.append(f[0] + " " + "".join(u + " " for u in picked) + "\n")
    return out


def _sort_n_k2(lines: Sequence[str]) -> Lines:
    """``LC_ALL=C sort -n -k2`` (number at the start of field 2, then the whole line)."""
    num_re = re.compile(r"[ \t]*(-?)(\d*)(\.\d*)?")

    def key(line: str) -> tuple[Decimal, bytes]:
        s = _body(line)
        i = len(s) - len(s.lstrip(" \t"))
        while i < len(s) and s[i] not in " \t":
            i += 1
        m = num_re.match(s, i)
        assert m is not None
        digits = (m.group(2) or "") + (m.group(3) or "")
        try:
            v = Decimal(m.group(1) + (digits if digits.strip(".") else "0"))
        except InvalidOperation:
            v = Decimal(0)
        return v, c_key(s)

    return sorted(lines, key=key)


def subset_data_dir(
    src: PathLike,
    dest: PathLike,
    *,
    num_utt: int | None = None,
    mode: str = "spread",
    utt_list: PathLike | None = None,
    spk_list: PathLike | None = None,
    log: Log = _quiet,
) -> int:
    """Kaldi's ``utils/subset_data_dir.sh``; returns the number of utterances kept.

    ``mode`` (with ``num_utt``): ``spread`` (Kaldi's default, evenly spread utterances),
    ``first``, ``last``, ``per_spk`` (``num_utt`` per speaker, evenly spread),
    ``speakers`` (random speakers until ``num_utt`` utterances, Perl ``srand(0)``
    order like Kaldi), ``shortest``.  Or ``utt_list`` / ``spk_list`` (first field of each
    line).  Every file of ``src`` is filtered to match; other files in ``dest`` are left
    alone (as Kaldi does).
    """
    s, t = Path(src), Path(dest)
    u2s_path = s / "utt2spk"
    if not u2s_path.is_file():
        raise InputError(u2s_path, None, "no such file")
    src_u2s = read_lines(u2s_path)
    _check_no_blank(u2s_path, src_u2s)
    _check_unique(u2s_path, src_u2s)
    if utt_list is None and spk_list is None:
        if num_utt is None:
            raise ValueError("give num_utt, utt_list or spk_list")
        if num_utt > len(src_u2s):
            raise InputError(u2s_path, None, f"cannot subset to {num_utt} utterances: there are only {len(src_u2s)}")
        if num_utt < 1:
            raise ValueError(f"number of utterances must be positive, got {num_utt}")
    if mode == "shortest" and not (s / "feats.scp").is_file():
        raise InputError(s / "feats.scp", None, "--shortest needs feats.scp")

    def ids_from(path: PathLike) -> set[str]:
        lines = read_lines(path)
        _check_no_blank(path, lines)
        return _id_set(lines)

    def src_spk2utt() -> Lines:
        lines = read_lines(s / "spk2utt")
        _check_no_blank(s / "spk2utt", lines)
        _check_unique(s / "spk2utt", lines)
        seen: dict[str, int] = {}
        for n, line in enumerate(lines, 1):
            f = split_fields(line)
            if len(f) < 2:
                raise InputError(s / "spk2utt", n, "speaker without utterances")
            for u in f[1:]:
                if u in seen:
                    raise InputError(s / "spk2utt", n, f"utterance {u!r} listed twice (first on line {seen[u]})")
                seen[u] = n
        return lines

    out: dict[str, Lines] = {}
    if spk_list is not None:
        out["spk2utt"] = filter_lines(src_spk2utt(), ids_from(spk_list))
        out["utt2spk"] = _spk2utt_to_utt2spk(out["spk2utt"])
    elif utt_list is not None:
        _check_utt2spk_lines(u2s_path, src_u2s)
        out["utt2spk"] = filter_lines(src_u2s, ids_from(utt_list))
        out["spk2utt"] = _utt2spk_to_spk2utt(out["utt2spk"])
    elif mode == "speakers":
        assert num_utt is not None
        picked, tot = [], 0
        for line in _shuffle_list(src_spk2utt()):
            if tot < num_utt:
                picked.append(line)
            tot += len(_awk_fields(line)) - 1
        out["spk2utt"] = _sort_lines(picked)
        out["utt2spk"] = _spk2utt_to_utt2spk(out["spk2utt"])
    elif mode == "per_spk":
        assert num_utt is not None
        out["spk2utt"] = _per_spk(src_spk2utt(), num_utt)
        out["utt2spk"] = _spk2utt_to_utt2spk(out["spk2utt"])
    else:
        assert num_utt is not None
        _check_utt2spk_lines(u2s_path, src_u2s)
        if mode == "shortest":
            if (s / "utt2num_frames").is_file():
                lens = read_lines(s / "utt2num_frames")
            else:
                import kaldiio  # noqa: PLC0415 - only this rarely used mode needs it

                lens = [f"{k} {m.shape[0]}\n" for k, m in kaldiio.load_scp_sequential(os.fspath(s / "feats.scp"))]
            keep = {_awk_fields(x)[0] for x in _sort_n_k2(lens)[:num_utt]}
            out["utt2spk"] = filter_lines(src_u2s, keep)
        elif mode in ("spread", "first", "last"):
            out["utt2spk"] = [_nl(x) for x in subset_lines(src_u2s, num_utt, mode)]
        else:
            raise ValueError(f"unknown subset mode {mode!r}")
        out["spk2utt"] = _utt2spk_to_spk2utt(out["utt2spk"])

    utts = _id_set(out["utt2spk"])
    spks = _id_set(out["spk2utt"]) if out["spk2utt"] else set()
    for name in _SUBSET_UTT_FILES:
        if (s / name).is_file():
            out[name] = _filter_file(s / name, utts)
    for name in _SUBSET_SPK_FILES:
        if (s / name).is_file():
            out[name] = _filter_file(s / name, spks)
    if (s / "segments").is_file():
        out["segments"] = _filter_file(s / "segments", utts)
        reco = {f[1] for f in map(_awk_fields, out["segments"]) if len(f) > 1}
        if (s / "wav.scp").is_file():
            out["wav.scp"] = _filter_file(s / "wav.scp", reco)
    else:
        reco = {f[0] for f in map(_awk_fields, out.get("wav.scp", [])) if f}
    for name in ("reco2file_and_channel", "reco2dur"):
        if (s / name).is_file():
            out[name] = _filter_file(s / name, reco)
    if (s / "stm").is_file():
        stm = read_lines(s / "stm")
        out["stm"] = [x for x in stm if x.startswith(";;")] + filter_lines([x for x in stm if _first(x)], reco)
    files: dict[str, Lines | bytes] = dict(out)
    if (s / "frame_shift").is_file():
        files["frame_shift"] = (s / "frame_shift").read_bytes()
    _commit(t, files)
    log(f"subset_data_dir.sh: reducing #utt from {len(src_u2s)} to {len(out['utt2spk'])}")
    return len(out["utt2spk"])


def _filter_file(path: Path, ids: set[str]) -> Lines:
    lines = read_lines(path)
    _check_no_blank(path, lines)
    _check_unique(path, lines)
    return filter_lines(lines, ids)


def _unique_lines(path: Path) -> Lines:
    """The lines of a table whose keys must be unique (InputError at a repeated key)."""
    lines = read_lines(path)
    _check_unique(path, lines)
    return lines


def _commit(dest: Path, files: dict[str, Lines | bytes]) -> None:
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


# --------------------------------------------------------------------------- combine_data


def combine_data(
    dest: PathLike,
    srcs: Sequence[PathLike],
    *,
    extra_files: Sequence[str] = (),
    skip_fix: bool = False,
    log: Log = _quiet,
) -> None:
    """Kaldi's ``utils/combine_data.sh``: concatenate and sort the tables of ``srcs``
    into a fresh ``dest`` (replacing it), then run :func:`fix_data_dir` on it.

    A table is combined only when every source has it, except utt2uniq (made from
    utt2spk where missing) and segments (made from utt2dur where missing).
    """
    t = Path(dest)
    dirs = [Path(x) for x in srcs]
    if not dirs:
        raise ValueError("no source data dirs")
    lines: Lines
    for x in dirs:
        if not (x / "utt2spk").is_file():
            raise InputError(x / "utt2spk", None, "no such file")
        lines = read_lines(x / "utt2spk")
        _check_no_blank(x / "utt2spk", lines)
        _check_utt2spk_lines(x / "utt2spk", lines)
        if t.exists() and x.resolve() == t.resolve():
            raise InputError(x, None, "the destination is also a source; combine into a new directory")
    frame_shift_dir: Path | None = None
    for x in dirs:
        if (x / "feats.scp").is_file() and (x / "frame_shift").is_file():
            if (
                frame_shift_dir is not None
                and (frame_shift_dir / "frame_shift").read_bytes() != (x / "frame_shift").read_bytes()
            ):
                raise InputError(
                    x / "frame_shift", None, f"differs from {frame_shift_dir / 'frame_shift'}; cannot combine features"
                )
            frame_shift_dir = x
    out: dict[str, Lines] = {}
    if any((x / "utt2uniq").is_file() for x in dirs):
        lines = []
        for x in dirs:
            if (x / "utt2uniq").is_file():
                lines += [_nl(v) for v in read_lines(x / "utt2uniq")]
            else:
                lines += [f"{f[0]} {f[0]}\n" for f in map(_awk_fields, read_lines(x / "utt2spk")) if f]
        out["utt2uniq"] = _sort_lines(lines)
        log("combine_data.sh: combined utt2uniq")
    extra = " ".join(extra_files).replace("utt2uniq", "").split()
    if any((x / "segments").is_file() for x in dirs):
        lines = []
        for x in dirs:
            if (x / "segments").is_file():
                lines += [_nl(v) for v in read_lines(x / "segments")]
            else:
                if not (x / "utt2dur").is_file() or (x / "utt2dur").stat().st_size == 0:
                    raise InputError(
                        x / "utt2dur",
                        None,
                        "needed to make segments for combining; create it first (utt2dur: '<utt> <seconds>')",
                    )
                log(f"combine_data.sh [info]: will generate missing segments for {x}")
                lines += [
                    f"{f[0]} {f[0]} 0 {f[1] if len(f) > 1 else ''}\n"
                    for f in map(_awk_fields, read_lines(x / "utt2dur"))
                ]
        out["segments"] = _sort_lines(lines)
        log("combine_data.sh: combined segments")
    for name in (*_COMBINE_FILES, *extra):
        present = [(x / name).is_file() for x in dirs]
        if all(present):
            out[name] = _sort_lines(_nl(v) for x in dirs for v in read_lines(x / name))
            log(f"combine_data.sh: combined {name}")
        elif any(present):
            log(f"combine_data.sh [info]: **not combining {name} as it does not exist everywhere**")
    out["spk2utt"] = _utt2spk_to_spk2utt(out["utt2spk"])

    parent = t.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{t.name}.", dir=parent))
    try:
        for name, lines in out.items():
            write_lines(tmp / name, lines)
        if frame_shift_dir is not None:
            shutil.copyfile(frame_shift_dir / "frame_shift", tmp / "frame_shift")
        if not skip_fix:
            fix_data_dir(tmp, log=lambda m: log(m.replace(os.fspath(tmp), os.fspath(t))))
        if t.exists() or t.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{t.name}.old.", dir=parent))
            os.rename(t, old / "d")
            os.rename(tmp, t)
            shutil.rmtree(old)
        else:
            os.rename(tmp, t)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


# --------------------------------------------------------------------------- copy_data_dir


def _apply_map(path: PathLike, lines: Sequence[str], mapping: dict[str, str], field_no: int) -> Lines:
    """``apply_map.pl -f field_no``: fields re-joined by single spaces."""
    out = []
    for n, line in enumerate(lines, 1):
        f = split_fields(line)
        if len(f) >= field_no:
            k = f[field_no - 1]
            if k not in mapping:
                raise InputError(path, n, f"{k!r} is not in utt2spk/spk2utt of the source")
            f[field_no - 1] = mapping[k]
        out.append(" ".join(f) + "\n")
    return out


def copy_data_dir(
    src: PathLike,
    dest: PathLike,
    *,
    utt_prefix: str = "",
    utt_suffix: str = "",
    spk_prefix: str = "",
    spk_suffix: str = "",
    log: Log = _quiet,
) -> list[str]:
    """Kaldi's ``utils/copy_data_dir.sh``: copy a data dir, adding prefixes/suffixes to
    utterance and speaker ids (recording ids stay).  Returns the validation flags Kaldi
    would pass to validate_data_dir.sh (``--no-feats`` / ``--no-text``)."""
    s, t = Path(src), Path(dest)
    if not (s / "utt2spk").is_file():
        raise InputError(s / "utt2spk", None, "no such file")
    if os.path.abspath(s) == os.path.abspath(t):
        raise ValueError("copy_data_dir.sh: <srcdir> and <destdir> must be different")
    u2s = read_lines(s / "utt2spk")
    _check_no_blank(s / "utt2spk", u2s)
    _check_utt2spk_lines(s / "utt2spk", u2s)
    _check_unique(s / "utt2spk", u2s)
    s2u = read_lines(s / "spk2utt")
    _check_no_blank(s / "spk2utt", s2u)
    _check_unique(s / "spk2utt", s2u)
    utt_map = {f[0]: f"{utt_prefix}{f[0]}{utt_suffix}" for f in map(_awk_fields, u2s)}
    spk_map = {f[0]: f"{spk_prefix}{f[0]}{spk_suffix}" for f in map(_awk_fields, s2u)}
    out: dict[str, Lines] = {}
    raw: dict[str, bytes] = {}
    if (s / "utt2uniq").is_file():
        out["utt2uniq"] = [
            f"{utt_prefix}{f[0] if f else ''}{utt_suffix} {f[1] if len(f) > 1 else ''}\n"
            for f in map(_awk_fields, read_lines(s / "utt2uniq"))
        ]
    elif utt_prefix or utt_suffix:
        out["utt2uniq"] = [f"{utt_prefix}{f[0]}{utt_suffix} {f[0]}\n" for f in map(_awk_fields, u2s)]
    out["utt2spk"] = _apply_map(s / "utt2spk", _apply_map(s / "utt2spk", u2s, utt_map, 1), spk_map, 2)
    out["spk2utt"] = _utt2spk_to_spk2utt(out["utt2spk"])
    by_utt = list(_COPY_UTT_FILES_HEAD)
    has_seg = (s / "segments").is_file()
    if has_seg:
        by_utt.append("segments")
        if (s / "wav.scp").is_file():
            raw["wav.scp"] = (s / "wav.scp").read_bytes()
    else:
        by_utt.append("wav.scp")
    by_utt += _COPY_UTT_FILES_TAIL
    if (s / "reco2dur").is_file():
        if has_seg:
            raw["reco2dur"] = (s / "reco2dur").read_bytes()
        else:
            by_utt.append("reco2dur")
    for name in by_utt:
        if (s / name).is_file():
            out[name] = _apply_map(s / name, _unique_lines(s / name), utt_map, 1)
    for name in _COPY_SPK_FILES:
        if (s / name).is_file():
            out[name] = _apply_map(s / name, _unique_lines(s / name), spk_map, 1)
    for name in _COPY_RAW_FILES:
        if (s / name).is_file():
            raw[name] = (s / name).read_bytes()
    for name in ("wav.scp", "reco2dur", "reco2file_and_channel"):  # copied as bytes, keyed by recording
        if name in raw:
            _unique_lines(s / name)
    _commit(t, {**out, **raw})
    log(f"copy_data_dir.sh: copied data from {s} to {t}")
    for name in _COPY_STALE_FILES:
        if (t / name).is_file() and not (s / name).is_file():
            log(f"copy_data_dir.sh: file {name} exists in dest {t} but not in src {s}.  Moving it to")
            log(f" ... {t}/.backup/{name}")
            (t / ".backup").mkdir(exist_ok=True)
            os.replace(t / name, t / ".backup" / name)
    flags = []
    if not (s / "feats.scp").is_file():
        flags.append("--no-feats")
    if not (s / "text").is_file():
        flags.append("--no-text")
    return flags
