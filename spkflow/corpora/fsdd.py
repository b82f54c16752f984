"""Free Spoken Digit Dataset (github.com/Jakobovski/free-spoken-digit-dataset) -> a data dir.

Layout: ``recordings/<digit>_<speaker>_<index>.(wav|flac)``, 8 kHz (resampled on reading by
:class:`spkflow.data.audio.AudioReader`).  Utterance ids are ``<speaker>-<original stem>``
(``george-0_george_0``), speakers the names in the file names; ``text`` is the spoken digit.
"""

from __future__ import annotations

import re
from pathlib import Path

from spkflow.corpora.base import CorpusData, CorpusSpec, Utterance, match_names, pick_unique_audio, scan_files

URL = "https://github.com/Jakobovski/free-spoken-digit-dataset"
SPEC = CorpusSpec("fsdd", "FSDD", "recordings", "recordings/<digit>_<spk>_<index>.flac|wav (8 kHz)", URL)
_NAME = re.compile(r"(?P<digit>\d)_(?P<spk>[^_\s-]+)_(?P<index>\d+)")


def collect(corpus_dir: str | Path) -> CorpusData:
    root = Path(corpus_dir).resolve()
    if (root / "recordings").is_dir():
        root = root / "recordings"
    if not root.is_dir():
        raise FileNotFoundError(f"FSDD not found at {corpus_dir} (expected recordings/<digit>_<spk>_<i>.wav)")
    by_utt: dict[str, list[Path]] = {}
    meta: dict[str, tuple[str, str]] = {}
    for path, m in match_names(scan_files(root, 0), _NAME, "FSDD"):
        utt = f"{m.group('spk')}-{m.group(0)}"
        by_utt.setdefault(utt, []).append(path)
        meta[utt] = (m.group("spk"), m.group("digit"))
    utterances = [
        Utterance(utt, meta[utt][0], str(pick_unique_audio(paths, utt)), meta[utt][1]) for utt, paths in by_utt.items()
    ]
    return CorpusData("fsdd", utterances)
