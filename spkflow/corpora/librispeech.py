"""LibriSpeech layout (openslr.org/12) -> a Kaldi data dir.

Layout: ``<subset>/<spk>/<chapter>/<spk>-<chapter>-<utt>.(flac|wav)``.  ``corpus_dir`` is either
the folder holding the subsets (``LibriSpeech/``, or ``../shared/corpora/librispeech_mini``) or
one subset folder itself.  ``subsets`` picks subsets by name (default: every subfolder laid out
like a subset).  File stems are speaker-prefixed and become the utterance ids unchanged.

Optional extras, used when present: ``<spk>-<chapter>.trans.txt`` -> ``text`` (only when every
utterance has one), ``SPEAKERS.TXT`` (``ID | SEX | SUBSET | MINUTES | NAME``) -> ``spk2gender``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from spkflow.corpora.base import (
    CorpusData,
    CorpusOption,
    CorpusSpec,
    Utterance,
    match_names,
    pick_unique_audio,
    scan_files,
)

# No automatic download: the release is a set of large tarballs (openslr.org/12).
SPEC = CorpusSpec(
    "librispeech",
    "LIBRISPEECH",
    ".",
    "<subset>/<spk>/<chapter>/<spk>-<chapter>-<utt>.flac|wav (+ *.trans.txt, SPEAKERS.TXT); https://www.openslr.org/12",
    None,
    (CorpusOption("subsets", "subsets to include, e.g. 'train-clean-100' (default: all found)", None, kind="list"),),
)

_NAME = re.compile(r"(?P<spk>\d+)-(?P<chapter>\d+)-(?P<utt>\d+)")


def _looks_like_subset(d: Path) -> bool:
    """A subset folder holds ``<spk>/<chapter>/<spk>-<chapter>-*.flac``: check the first one."""
    for spk in sorted(p for p in d.iterdir() if p.is_dir() and p.name.isdigit()):
        for chapter in sorted(p for p in spk.iterdir() if p.is_dir() and p.name.isdigit()):
            return any(_NAME.fullmatch(f.name.rsplit(".", 1)[0]) for f in chapter.iterdir())
    return False


def subset_dirs(corpus_dir: str | Path, subsets: Iterable[str] | None = None) -> list[Path]:
    root = Path(corpus_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"LibriSpeech not found at {corpus_dir}")
    if subsets:
        dirs = [root / s for s in subsets]
        for d in dirs:
            if not d.is_dir():
                raise FileNotFoundError(f"LibriSpeech subset {d.name!r} not found under {root}")
        return dirs
    if _looks_like_subset(root):
        return [root]
    dirs = [d for d in sorted(root.iterdir()) if d.is_dir() and _looks_like_subset(d)]
    if not dirs:
        raise FileNotFoundError(
            f"no LibriSpeech subset (<subset>/<spk>/<chapter>/<spk>-<chapter>-<n>.flac) under {root}"
        )
    return dirs


def _read_speakers_txt(root: Path) -> dict[str, str]:
    for p in (root / "SPEAKERS.TXT", root.parent / "SPEAKERS.TXT"):
        if p.is_file():
            out = {}
            for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith(";") or "|" not in line:
                    continue
                fields = [f.strip() for f in line.split("|")]
                if len(fields) >= 2 and fields[1].lower() in ("m", "f"):
                    out[fields[0]] = fields[1].lower()
            return out
    return {}


def collect(corpus_dir: str | Path, subsets: Iterable[str] | None = None) -> CorpusData:
    dirs = subset_dirs(corpus_dir, subsets)
    by_utt: dict[str, list[Path]] = {}
    spk_of: dict[str, str] = {}
    text: dict[str, str] = {}
    read_trans: set[Path] = set()
    for d in dirs:
        for path, m in match_names(scan_files(d, 2), _NAME, f"LibriSpeech {d.name}"):
            spk = m.group("spk")
            if path.parent.parent.name != spk or path.parent.name != m.group("chapter"):
                raise ValueError(f"{path}: file name does not match its <spk>/<chapter> folders")
            utt = m.group(0)
            by_utt.setdefault(utt, []).append(path)
            spk_of[utt] = spk
            trans = path.parent / f"{spk}-{m.group('chapter')}.trans.txt"
            if trans not in read_trans and trans.is_file():
                read_trans.add(trans)
                for line in trans.read_text(encoding="utf-8").splitlines():
                    key, _, words = line.strip().partition(" ")
                    if key and words:
                        text[key] = words.strip()
    utterances = [
        Utterance(utt, spk_of[utt], str(pick_unique_audio(paths, utt)), text.get(utt)) for utt, paths in by_utt.items()
    ]
    root = Path(corpus_dir).resolve()
    return CorpusData("librispeech", utterances, _read_speakers_txt(root))
