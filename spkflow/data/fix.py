"""``fix_data_dir``: make a data dir consistent, as Kaldi's ``utils/fix_data_dir.sh`` does, byte for byte.

The tables are sorted, filtered to the utterances (and speakers, recordings) that every table
has, and rewritten; the originals of what changed go to ``.backup/``.  The steps are
:mod:`spkflow.data.steps`; what these data-dir operations do better than Kaldi's scripts and where
they deliberately differ is in :mod:`spkflow.data.steps`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spkflow.core.errors import InputError
from spkflow.data.steps import (
    Lines,
    Log,
    TableSet,
    awk_fields,
    check_no_blank,
    check_utt2spk_lines,
    commit_tables,
    filter_lines,
    first_field,
    id_set,
    is_sorted_k2,
    line_keys,
    ok_lines,
    quiet,
    sort_k1_unique,
    sort_lines,
    spk2utt_to_utt2spk_lines,
    utt2spk_to_spk2utt_lines,
)
from spkflow.data.tables import VAD_LIKE_FILES, PathLike, Table, c_key, write_lines

__all__ = ["FixReport", "fix_data_dir"]

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


# --------------------------------------------------------------------------- fix_data_dir


@dataclass
class FixReport:
    """What :func:`fix_data_dir` did."""

    kept: int  # utterances kept
    total: int  # utterances in utt2spk before (after removing duplicate keys)
    changed: list[str] = field(default_factory=list)  # files rewritten (originals in .backup/)


def fix_data_dir(
    data: PathLike, *, utt_extra_files: Sequence[str] = (), spk_extra_files: Sequence[str] = (), log: Log = quiet
) -> FixReport:
    """Make a data dir consistent, exactly like Kaldi's ``utils/fix_data_dir.sh``.

    Sorts every table by key (dropping later duplicates of a key), keeps only the
    speakers present in spk2gender / cmvn.scp (when they exist), keeps only the
    utterances present in utt2spk, feats.scp, text, segments, utt2lang, wav.scp
    (when indexed by utterance), and utt2dur / utt2num_frames (lines with a
    positive value), filters every utterance-, speaker- and recording-indexed file
    to match, and regenerates spk2utt.  Like Kaldi, vad.scp and utt2uniq are
    filtered but do not remove utterances; so are cmvn_utt.scp and
    cmvn_utt_voiced.scp (:data:`~spkflow.data.tables.VAD_LIKE_FILES`).

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
    F = TableSet(d)
    names = list(dict.fromkeys([*_FIX_FILES, *utt_extra_files, *spk_extra_files]))
    for name in names:
        if F.load(name):
            if name != "spk2utt":  # spk2utt is regenerated from utt2spk, as in Kaldi
                check_no_blank(d / name, F[name])
            s = sort_k1_unique(F[name])
            if s != F[name]:
                log(f"fix_data_dir.sh: file {d / name} is not in sorted order or not unique, sorting it")
            F[name] = s
    # utt2spk_to_spk2utt.pl dies on a line without 2 fields: locate it in the original file.
    u2s_t = Table(d / "utt2spk", F["utt2spk"])
    if not u2s_t.is_two_column() and any(len(f) != 2 for f in u2s_t.fields):
        check_utt2spk_lines(d / "utt2spk", F.orig["utt2spk"])

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
        recos = sorted({f[1] if len(f) > 1 else "" for f in map(awk_fields, F["segments"])}, key=c_key)
        if not recos:
            raise InputError(d / "segments", None, "empty list of recordings")
        recos = filter_lines([r + "\n" for r in recos], id_set(F["wav.scp"]))
        reco_set = {r[:-1] for r in recos}

        def swap(lines: Lines) -> Lines:
            out = []
            for line in lines:
                f = awk_fields(line) + ["", "", "", ""]
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
        spk2utt = utt2spk_to_spk2utt_lines(F["utt2spk"])
        speakers = [first_field(x) + "\n" for x in spk2utt]  # type: ignore[operator]
        for name in ("cmvn.scp", "spk2gender"):
            if name in F:
                speakers = filter_lines(speakers, id_set(F[name]))
        spk_set = {s[:-1] for s in speakers}
        F["spk2utt"] = filter_lines(spk2utt, spk_set)
        F["utt2spk"] = spk2utt_to_utt2spk_lines(F["spk2utt"])
        for name in ("cmvn.scp", "spk2gender", *spk_extra_files):
            if name in F:
                filter_file(spk_set, name)

    def filter_utts() -> tuple[int, int]:
        u2s = F["utt2spk"]
        if sort_lines(u2s) != u2s or is_sorted_k2(u2s) is not None:
            # Kaldi: "utt2spk is not in sorted order ... (fix this yourself)".  Point at the
            # user's line: the first (sorted) utt2spk line whose speaker breaks the order.
            sorted_u2s = sort_k1_unique(F.orig["utt2spk"])
            i = is_sorted_k2(sorted_u2s)
            line = sorted_u2s[i if i is not None else 0]
            n = F.orig["utt2spk"].index(line) + 1 if line in F.orig["utt2spk"] else None
            raise InputError(
                d / "utt2spk",
                n,
                f"utterance {first_field(line)!r} does not sort with its speaker "
                "(utt2spk sorted by utterance must also be sorted by speaker): "
                "make speaker ids prefixes of utterance ids",
            )
        if sort_lines(F["spk2utt"]) != F["spk2utt"]:
            raise InputError(
                d / "spk2utt",
                None,
                "speakers do not sort like their utterances (make speaker ids prefixes of utterance ids)",
            )
        if "utt2uniq" in F and sort_lines(F["utt2uniq"]) != F["utt2uniq"]:
            raise InputError(d / "utt2uniq", None, "not in sorted order (fix this yourself)")
        utts = [k + "\n" for k in line_keys(u2s)]  # u2s is "<utt> <spk>\n" lines here
        sources: list[tuple[str, Lines]] = []
        for name in ("feats.scp", "text", "segments", "utt2lang"):
            if name in F:
                sources.append((name, F[name]))
        if "segments" not in F and "wav.scp" in F:
            sources.append(("wav.scp", F["wav.scp"]))
        for name in ("utt2dur", "utt2num_frames"):
            if name in F:
                sources.append((name, ok_lines(F[name])))
        for _, lines in sources:
            utts = filter_lines(utts, id_set(lines))
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
    F["spk2utt"] = utt2spk_to_spk2utt_lines(F["utt2spk"])

    changed = F.changed()
    backup = d / ".backup"
    backup.mkdir(exist_ok=True)
    for name in changed:
        if name in F.orig:
            write_lines(backup / name, F.orig[name])
    commit_tables(d, {name: F[name] for name in changed})
    log(f"fix_data_dir.sh: old files are kept in {backup}")
    return FixReport(kept=kept, total=total, changed=changed)
