"""DSPSpeech-20 (github.com/zhongyuchen/DSPSpeech-20) -> a Kaldi data dir.

Layout: ``speech_data/<spk>/<spk>-<word>-<round>.(wav|flac)`` (20 words, rounds ``01``...``20``
in the original, ``01``-``02`` in the copy under ../shared/corpora).  File stems are already
speaker-prefixed and become the utterance ids unchanged (``15307110189-00-01``); the speaker is
the folder name and must match the stem's prefix.

Speaker ``15307130191`` of the original release is left out by default: 340 of its 400 files are
byte-identical copies, which would put identical audio on both sides of "different" trials.
``rounds`` keeps only the given rounds (the demo uses ``01 02``, so the public release and the
shared copy give the same data dir).
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

URL = "https://github.com/zhongyuchen/DSPSpeech-20"
DEFAULT_EXCLUDE = ("15307130191",)
SPEC = CorpusSpec(
    "dspspeech20",
    "DSPSPEECH20",
    "speech_data",
    "speech_data/<spk>/<spk>-<word>-<round>.flac|wav",
    URL,
    (
        CorpusOption("rounds", "rounds to keep, e.g. '01 02' (default: all)", None, kind="list"),
        CorpusOption("exclude_speakers", "speakers to leave out", " ".join(DEFAULT_EXCLUDE), kind="list"),
    ),
)
_NAME = re.compile(r"(?P<spk>[^-\s]+)-(?P<word>\d+)-(?P<round>\d+)")


def audio_root(corpus_dir: str | Path) -> Path:
    """``corpus_dir/speech_data`` when present, else ``corpus_dir`` itself."""
    root = Path(corpus_dir).resolve()
    return root / "speech_data" if (root / "speech_data").is_dir() else root


def collect(
    corpus_dir: str | Path, rounds: Iterable[str] | None = None, exclude_speakers: Iterable[str] = DEFAULT_EXCLUDE
) -> CorpusData:
    root = audio_root(corpus_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"DSPSpeech-20 not found at {corpus_dir} (expected speech_data/<spk>/...)")
    keep_rounds = {int(r) for r in rounds} if rounds else None
    excluded = set(exclude_speakers)
    by_utt: dict[str, list[Path]] = {}
    spk_of: dict[str, str] = {}
    for path, m in match_names(scan_files(root, 1), _NAME, "DSPSpeech-20"):
        spk = path.parent.name
        if m.group("spk") != spk:
            raise ValueError(f"{path}: file of speaker {m.group('spk')!r} in the folder of {spk!r}")
        if spk in excluded or (keep_rounds is not None and int(m.group("round")) not in keep_rounds):
            continue
        utt = m.group(0)
        by_utt.setdefault(utt, []).append(path)
        spk_of[utt] = spk
    utterances = [Utterance(utt, spk_of[utt], str(pick_unique_audio(paths, utt))) for utt, paths in by_utt.items()]
    return CorpusData("dspspeech20", utterances)
