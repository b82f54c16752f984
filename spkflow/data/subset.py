"""``subset_data_dir``: a part of a data dir, as Kaldi's ``utils/subset_data_dir.sh`` picks it, byte for byte.

By utterance list, by speaker list, the first / last / spread N utterances, N per speaker, the
shortest, or N speakers drawn with Perl's ``rand`` (:class:`PerlRandom`, the same draws as
Perl's for the same seed).  Written all or none (:func:`spkflow.data.steps.commit_tables`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from spkflow.core.errors import InputError
from spkflow.data.steps import (
    Lines,
    Log,
    awk_fields,
    check_no_blank,
    check_unique,
    check_utt2spk_lines,
    commit_tables,
    filter_file,
    filter_lines,
    first_field,
    id_set,
    line_body,
    quiet,
    sort_lines,
    spk2utt_to_utt2spk_lines,
    utt2spk_to_spk2utt_lines,
    with_newline,
)
from spkflow.data.tables import VAD_LIKE_FILES, PathLike, c_key, read_lines, split_fields

__all__ = ["PerlRandom", "subset_data_dir", "subset_lines"]

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
    return [with_newline(line) for _, _, line in keyed]


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
        f = awk_fields(line)
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
        s = line_body(line)
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
    log: Log = quiet,
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
    check_no_blank(u2s_path, src_u2s)
    check_unique(u2s_path, src_u2s)
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
        check_no_blank(path, lines)
        return id_set(lines)

    def src_spk2utt() -> Lines:
        lines = read_lines(s / "spk2utt")
        check_no_blank(s / "spk2utt", lines)
        check_unique(s / "spk2utt", lines)
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
        out["utt2spk"] = spk2utt_to_utt2spk_lines(out["spk2utt"])
    elif utt_list is not None:
        check_utt2spk_lines(u2s_path, src_u2s)
        out["utt2spk"] = filter_lines(src_u2s, ids_from(utt_list))
        out["spk2utt"] = utt2spk_to_spk2utt_lines(out["utt2spk"])
    elif mode == "speakers":
        assert num_utt is not None
        picked, tot = [], 0
        for line in _shuffle_list(src_spk2utt()):
            if tot < num_utt:
                picked.append(line)
            tot += len(awk_fields(line)) - 1
        out["spk2utt"] = sort_lines(picked)
        out["utt2spk"] = spk2utt_to_utt2spk_lines(out["spk2utt"])
    elif mode == "per_spk":
        assert num_utt is not None
        out["spk2utt"] = _per_spk(src_spk2utt(), num_utt)
        out["utt2spk"] = spk2utt_to_utt2spk_lines(out["spk2utt"])
    else:
        assert num_utt is not None
        check_utt2spk_lines(u2s_path, src_u2s)
        if mode == "shortest":
            if (s / "utt2num_frames").is_file():
                lens = read_lines(s / "utt2num_frames")
            else:
                import kaldiio  # noqa: PLC0415 - only this rarely used mode needs it

                lens = [f"{k} {m.shape[0]}\n" for k, m in kaldiio.load_scp_sequential(os.fspath(s / "feats.scp"))]
            keep = {awk_fields(x)[0] for x in _sort_n_k2(lens)[:num_utt]}
            out["utt2spk"] = filter_lines(src_u2s, keep)
        elif mode in ("spread", "first", "last"):
            out["utt2spk"] = [with_newline(x) for x in subset_lines(src_u2s, num_utt, mode)]
        else:
            raise ValueError(f"unknown subset mode {mode!r}")
        out["spk2utt"] = utt2spk_to_spk2utt_lines(out["utt2spk"])

    utts = id_set(out["utt2spk"])
    spks = id_set(out["spk2utt"]) if out["spk2utt"] else set()
    for name in _SUBSET_UTT_FILES:
        if (s / name).is_file():
            out[name] = filter_file(s / name, utts)
    for name in _SUBSET_SPK_FILES:
        if (s / name).is_file():
            out[name] = filter_file(s / name, spks)
    if (s / "segments").is_file():
        out["segments"] = filter_file(s / "segments", utts)
        reco = {f[1] for f in map(awk_fields, out["segments"]) if len(f) > 1}
        if (s / "wav.scp").is_file():
            out["wav.scp"] = filter_file(s / "wav.scp", reco)
    else:
        reco = {f[0] for f in map(awk_fields, out.get("wav.scp", [])) if f}
    for name in ("reco2file_and_channel", "reco2dur"):
        if (s / name).is_file():
            out[name] = filter_file(s / name, reco)
    if (s / "stm").is_file():
        stm = read_lines(s / "stm")
        out["stm"] = [x for x in stm if x.startswith(";;")] + filter_lines([x for x in stm if first_field(x)], reco)
    files: dict[str, Lines | bytes] = dict(out)
    if (s / "frame_shift").is_file():
        files["frame_shift"] = (s / "frame_shift").read_bytes()
    commit_tables(t, files)
    log(f"subset_data_dir.sh: reducing #utt from {len(src_u2s)} to {len(out['utt2spk'])}")
    return len(out["utt2spk"])
