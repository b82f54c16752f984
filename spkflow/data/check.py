"""Checks of a Kaldi data dir: what :meth:`spkflow.data.datadir.DataDir.validate` runs.

The checks of Kaldi's ``utils/validate_data_dir.sh`` (with ``check_sorted_and_uniq``):
sortedness and duplicate keys, utt2spk / spk2utt agreement, every table covering exactly
the utterances (speakers, recordings) it should, value formats, and UTF-8 ids
(:func:`check_utf8_ids`).  The tables are read by :mod:`spkflow.data.tables`;
:class:`~spkflow.data.datadir.DataDir` calls this module, never the other way round.

Guarantees:

* the first problem raises :class:`~spkflow.core.errors.InputError` naming the file and the
  1-based line (``data/train/utt2spk:17: ...``) with a suggested fix where there is one;
* checking only reads: nothing in the data dir is changed, on success or on failure;
* standard library only, like :mod:`spkflow.data.tables`.
"""

from __future__ import annotations

import operator
import os
import re
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

from spkflow.core.errors import InputError
from spkflow.data.tables import (
    RAW_BYTE_RE,
    VAD_LIKE_FILES,
    WHITESPACE,
    PathLike,
    Table,
    as_number,
    c_key,
    c_sorted,
    same_key,
    show_line,
)

__all__ = ["check_data_dir", "check_utf8_ids", "first_unsorted_k2"]


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


def check_data_dir(
    path: PathLike,
    *,
    no_feats: bool = True,
    no_text: bool = True,
    no_wav: bool = False,
    no_spk_sort: bool = False,
    non_print: bool = False,
) -> list[str]:
    """Check the data dir at ``path`` (the checks of ``utils/validate_data_dir.sh``; the body of
    :meth:`DataDir.validate <spkflow.data.datadir.DataDir.validate>`, where the flags and the
    deliberate differences from Kaldi are documented); returns warnings, raises InputError (file,
    line) on the first problem."""
    d = Path(path)
    warnings: list[str] = []
    if not d.is_dir():
        raise InputError(d, None, "no such directory")
    for f in ("spk2utt", "utt2spk"):
        p = d / f
        if not p.is_file():
            raise InputError(p, None, "no such file")
        if p.stat().st_size == 0:
            raise InputError(p, None, "empty file")
    tables: dict[str, Table] = {}

    def table(name: str) -> Table:
        if name not in tables:
            tables[name] = Table(d / name)
            check_utf8_ids(tables[name], name)
        return tables[name]

    u2s_t, s2u_t = table("utt2spk"), table("spk2utt")
    u2s_path, s2u_path = u2s_t.path, s2u_t.path
    for n, f in enumerate(u2s_t.fields, 1):
        if len(f) != 2:
            raise InputError(
                u2s_path, n, f"expected '<utt> <spk>' (2 fields), got {len(f)}: {show_line(u2s_t.lines[n - 1])}"
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
    _check_spk2utt_matches(u2s, u2s_path, s2u_t)

    text = d / "text"
    if not no_text:
        if not text.is_file():
            raise InputError(text, None, "no such file (if this is by design, use --no-text)")
        _check_text(table("text"), utts, u2s_path, non_print)

    wav, segments = d / "wav.scp", d / "segments"
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
                        segments, n, f"expected '<utt> <recording> <start> <end>', got {show_line(seg_t.lines[n - 1])}"
                    )
                if not _awk_greater(f[3], f[2]):
                    raise InputError(segments, n, f"end time {f[3]} is not after start time {f[2]}")
                reco_set.add(f[1])
            _same_keys(u2s_path, utts, segments, seg_keys, "utterance")
            recordings = c_sorted(reco_set)
            _same_keys(segments, recordings, wav, wav_keys, "recording")
            _check_r2fc(d, table, recordings, segments)
        else:
            _same_keys(u2s_path, utts, wav, wav_keys, "utterance")
            _check_r2fc(d, table, utts, u2s_path)

    feats = d / "feats.scp"
    if not feats.is_file() and not no_feats:
        raise InputError(feats, None, "no such file (if this is by design, use --no-feats)")
    if feats.is_file():
        _same_keys(u2s_path, utts, feats, table("feats.scp").check_sorted_unique(), "utterance")

    if (d / "cmvn.scp").is_file():
        _same_keys(s2u_path, spks, d / "cmvn.scp", table("cmvn.scp").check_sorted_unique(), "speaker")
    if (d / "spk2gender").is_file():
        t = table("spk2gender")
        keys = t.check_sorted_unique()
        for n, f in enumerate(t.fields, 1):
            if len(f) != 2 or f[1] not in ("m", "f"):
                raise InputError(t.path, n, f"expected '<spk> m|f', got {show_line(t.lines[n - 1])}")
        _same_keys(s2u_path, spks, t.path, keys, "speaker")
    for name, ref_path, ref, what in (
        ("spk2warp", s2u_path, spks, "speaker"),
        ("utt2warp", u2s_path, utts, "utterance"),
    ):
        if (d / name).is_file():
            t = table(name)
            keys = t.check_sorted_unique()
            for n, f in enumerate(t.fields, 1):
                x = as_number(f[1]) if len(f) == 2 else None
                if x is None or not 0.5 < x < 1.5:
                    raise InputError(
                        t.path, n, f"expected '<id> <warp factor in (0.5, 1.5)>', got {show_line(t.lines[n - 1])}"
                    )
            _same_keys(ref_path, ref, t.path, keys, what)
    for name in (*VAD_LIKE_FILES, "utt2lang", "utt2uniq"):
        if (d / name).is_file():
            _same_keys(u2s_path, utts, d / name, table(name).check_sorted_unique(), "utterance")
    for name, integer in (("utt2dur", False), ("utt2num_frames", True)):
        if (d / name).is_file():
            t = table(name)
            _same_keys(u2s_path, utts, t.path, t.check_sorted_unique(), "utterance")
            _check_positive(t, integer=integer)
    if (d / "reco2dur").is_file():
        t = table("reco2dur")
        keys = t.check_sorted_unique()
        if recordings is not None:
            _same_keys(segments, recordings, t.path, keys, "recording")
        else:
            _same_keys(u2s_path, utts, t.path, keys, "recording")
        _check_positive(t, integer=False)
    return warnings


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


def _check_text(t: Table, utts: list[str], u2s_path: Path, non_print: bool) -> None:
    lines, text = t.lines, t.path
    if not lines:
        raise InputError(text, None, "empty file")
    if not non_print:
        for n, line in enumerate(lines, 1):
            if any(_non_printable(c) for c in line):
                raise InputError(text, n, "non-printable character (use --non-print to allow)")
    if t.key is same_key:  # the whole file is UTF-8 (Kaldi's validate_text.pl checks only then)
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


def _check_r2fc(d: Path, table: Callable[[str], Table], ref: list[str], ref_path: Path) -> None:
    if not (d / "reco2file_and_channel").is_file():
        return
    t = table("reco2file_and_channel")
    keys = t.check_sorted_unique()
    for n, f in enumerate(t.fields, 1):
        if len(f) != 3 or f[2] not in ("A", "B", "1"):
            raise InputError(t.path, n, f"expected '<recording> <file> A|B', got {show_line(t.lines[n - 1])}")
    _same_keys(ref_path, ref, t.path, keys, "recording")


#: Fields of each table that are ids (0-based; None: every field): utterance, speaker and
#: recording ids.  Every other table's first field is its id.
_ID_FIELDS: dict[str, tuple[int, ...] | None] = {"utt2spk": (0, 1), "spk2utt": None, "segments": (0, 1)}


def check_utf8_ids(t: Table, name: str | None = None) -> None:
    """InputError at the first line of ``t`` whose id (utterance, speaker or recording id:
    the first field; both ids of utt2spk and segments; every field of spk2utt) holds bytes
    that are not UTF-8.  Values (paths, transcripts) may hold any bytes.  Free when the file
    is all UTF-8.  ``name`` is the table's file name (default: that of ``t.path``)."""
    if t.key is same_key:  # no byte that is not UTF-8 anywhere in the file
        return
    cols = _ID_FIELDS.get(name or t.path.name, (0,))
    for n, f in enumerate(t.fields, 1):
        for i, x in enumerate(f):
            if (cols is None or i in cols) and RAW_BYTE_RE.search(x):
                shown = x.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                raise InputError(
                    t.path,
                    n,
                    f"id '{shown}' holds bytes that are not UTF-8; utterance, speaker and recording ids must "
                    "be UTF-8 text (features and embeddings are stored under them); rename it",
                )


def _check_positive(t: Table, *, integer: bool) -> None:
    for n, f in enumerate(t.fields, 1):
        x = as_number(f[1]) if len(f) == 2 else None
        if x is None or not x > 0 or (integer and x != int(x)):
            kind = "positive integer" if integer else "positive number"
            raise InputError(t.path, n, f"expected '<id> <{kind}>', got {show_line(t.lines[n - 1])}")


def first_unsorted_k2(t: Table) -> int | None:
    """1-based line breaking ``LC_ALL=C sort -k2 -C`` order (field 2 to end of line with its
    leading blanks, then the whole line), or None."""
    if t.key is same_key and t.is_two_column():
        # "<utt> <spk>" lines: the sort key is (" <spk>", line), ordered as (spk, line)
        spks = [f[1] for f in t.fields]
        pairs = list(zip(spks, t.lines, strict=True))
        if not any(map(operator.gt, pairs, pairs[1:])):
            return None
    keys: list[tuple[str | bytes, str | bytes]] = []
    for line, f in zip(t.lines, t.fields, strict=True):
        s = line[:-1] if line.endswith("\n") else line
        f0 = f[0] if f else ""
        if t.key is same_key and s.startswith(f0) and (len(s) == len(f0) or s[len(f0)] in " \t"):
            keys.append((s[len(f0) :], s))
        else:
            k2, whole = sort_k2_key(line)
            keys.append(
                (k2, whole)
                if t.key is not same_key
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
