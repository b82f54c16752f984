"""``combine_data`` and ``copy_data_dir``: new data dirs from existing ones, as Kaldi's scripts write them.

``combine_data`` concatenates data dirs (``utils/combine_data.sh``); ``copy_data_dir`` copies one
with utterance and speaker ids renamed by a prefix / suffix (``utils/copy_data_dir.sh``).  Both
write all or none and refuse a destination that is also a source.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from spkflow.core.atomic import make_temp_dir
from spkflow.core.errors import InputError
from spkflow.data.fix import fix_data_dir
from spkflow.data.steps import (
    Lines,
    Log,
    awk_fields,
    check_no_blank,
    check_unique,
    check_utt2spk_lines,
    commit_tables,
    quiet,
    sort_lines,
    unique_lines,
    utt2spk_to_spk2utt_lines,
    with_newline,
)
from spkflow.data.tables import VAD_LIKE_FILES, PathLike, read_lines, split_fields, write_lines

__all__ = ["combine_data", "copy_data_dir"]

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


# --------------------------------------------------------------------------- combine_data


def combine_data(
    dest: PathLike,
    srcs: Sequence[PathLike],
    *,
    extra_files: Sequence[str] = (),
    skip_fix: bool = False,
    log: Log = quiet,
) -> None:
    """Kaldi's ``utils/combine_data.sh``: concatenate and sort the tables of ``srcs``
    into a fresh ``dest`` (replacing it), then run :func:`~spkflow.data.fix.fix_data_dir` on it.

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
        check_no_blank(x / "utt2spk", lines)
        check_utt2spk_lines(x / "utt2spk", lines)
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

    def whole_utterances(x: Path) -> list[str]:  # segments of a dir without them
        if not (x / "utt2dur").is_file() or (x / "utt2dur").stat().st_size == 0:
            raise InputError(
                x / "utt2dur",
                None,
                "needed to make segments for combining; create it first (utt2dur: '<utt> <seconds>')",
            )
        log(f"combine_data.sh [info]: will generate missing segments for {x}")
        return [f"{f[0]} {f[0]} 0 {f[1] if len(f) > 1 else ''}\n" for f in map(awk_fields, read_lines(x / "utt2dur"))]

    def own_ids(x: Path) -> list[str]:  # utt2uniq of a dir without one
        return [f"{f[0]} {f[0]}\n" for f in map(awk_fields, read_lines(x / "utt2spk")) if f]

    for name, make in (("utt2uniq", own_ids), ("segments", whole_utterances)):
        if any((x / name).is_file() for x in dirs):
            lines = []
            for x in dirs:
                lines += [with_newline(v) for v in read_lines(x / name)] if (x / name).is_file() else make(x)
            out[name] = sort_lines(lines)
            log(f"combine_data.sh: combined {name}")
    extra = " ".join(extra_files).replace("utt2uniq", "").split()
    for name in (*_COMBINE_FILES, *extra):
        present = [(x / name).is_file() for x in dirs]
        if all(present):
            out[name] = sort_lines(with_newline(v) for x in dirs for v in read_lines(x / name))
            log(f"combine_data.sh: combined {name}")
        elif any(present):
            log(f"combine_data.sh [info]: **not combining {name} as it does not exist everywhere**")
    out["spk2utt"] = utt2spk_to_spk2utt_lines(out["utt2spk"])

    parent = t.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(f".{t.name}.", parent)
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
    log: Log = quiet,
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
    check_no_blank(s / "utt2spk", u2s)
    check_utt2spk_lines(s / "utt2spk", u2s)
    check_unique(s / "utt2spk", u2s)
    s2u = read_lines(s / "spk2utt")
    check_no_blank(s / "spk2utt", s2u)
    check_unique(s / "spk2utt", s2u)
    utt_map = {f[0]: f"{utt_prefix}{f[0]}{utt_suffix}" for f in map(awk_fields, u2s)}
    spk_map = {f[0]: f"{spk_prefix}{f[0]}{spk_suffix}" for f in map(awk_fields, s2u)}
    out: dict[str, Lines] = {}
    raw: dict[str, bytes] = {}
    if (s / "utt2uniq").is_file():
        out["utt2uniq"] = [
            f"{utt_prefix}{f[0] if f else ''}{utt_suffix} {f[1] if len(f) > 1 else ''}\n"
            for f in map(awk_fields, read_lines(s / "utt2uniq"))
        ]
    elif utt_prefix or utt_suffix:
        out["utt2uniq"] = [f"{utt_prefix}{f[0]}{utt_suffix} {f[0]}\n" for f in map(awk_fields, u2s)]
    out["utt2spk"] = _apply_map(s / "utt2spk", _apply_map(s / "utt2spk", u2s, utt_map, 1), spk_map, 2)
    out["spk2utt"] = utt2spk_to_spk2utt_lines(out["utt2spk"])
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
            out[name] = _apply_map(s / name, unique_lines(s / name), utt_map, 1)
    for name in _COPY_SPK_FILES:
        if (s / name).is_file():
            out[name] = _apply_map(s / name, unique_lines(s / name), spk_map, 1)
    for name in _COPY_RAW_FILES:
        if (s / name).is_file():
            raw[name] = (s / name).read_bytes()
    for name in ("wav.scp", "reco2dur", "reco2file_and_channel"):  # copied as bytes, keyed by recording
        if name in raw:
            unique_lines(s / name)
    commit_tables(t, {**out, **raw})
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
