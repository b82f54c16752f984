"""speechocean762 (github.com/jimbozhang/speechocean762, also openslr.org/101) -> Kaldi data dirs.

The corpus ships Kaldi lists per official split (``train/``, ``test/``: wav.scp, utt2spk,
spk2utt, text, spk2age, spk2gender) with paths relative to the corpus root and utterance
ids that are *not* speaker-prefixed strings (``000010011`` belongs to speaker ``0001``).

Output ids: speaker ids are kept (``0001``); utterance ids become ``<spk>-<original id>``
(``0001-000010011``), so the original id stays recoverable and sorting by utterance groups
speakers.  Paths become absolute; a path listed as ``.WAV`` that exists only as ``.flac``
(or the reverse) is accepted.  ``text`` and ``spk2gender`` are kept (they cost nothing and
allow text-dependent or gender-balanced experiments); ``spk2age`` is not a Kaldi file and
would go stale under ``subset_data_dir.sh``, so it is left out.

Every utterance must appear in both wav.scp and utt2spk (an error names the file and line
otherwise); nothing is dropped silently.
"""

from __future__ import annotations

from pathlib import Path

from spkflow.core.errors import InputError
from spkflow.corpora.base import CorpusData, CorpusOption, CorpusSpec, Utterance, resolve_audio
from spkflow.data.tables import read_kv, read_kv_lines

SPLITS = ("train", "test")
URL = "https://github.com/jimbozhang/speechocean762"
SPEC = CorpusSpec(
    "speechocean762",
    "SPEECHOCEAN762",
    "{split}/wav.scp",
    "{train,test}/{wav.scp,utt2spk,text,spk2gender} + WAVE/SPEAKERnnnn/*.WAV",
    URL,
    (CorpusOption("split", "official split", "train", choices=SPLITS),),
)


def collect(corpus_dir: str | Path, split: str = "train") -> CorpusData:
    """The utterances of one official split (``train``: 125 speakers, ``test``: 125 others)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = Path(corpus_dir).resolve()
    lists = root / split
    wav_scp, utt2spk_path = lists / "wav.scp", lists / "utt2spk"
    for p in (wav_scp, utt2spk_path):
        if not p.is_file():
            raise InputError(p, None, f"not found: is {root} a speechocean762 copy (with {split}/wav.scp)?")
    utt2spk = read_kv(utt2spk_path, num_fields=2)
    text_path = lists / "text"
    text = read_kv(text_path, value_required=False) if text_path.is_file() else {}
    gender_path = lists / "spk2gender"
    spk2gender = read_kv(gender_path, num_fields=2) if gender_path.is_file() else {}

    utterances: list[Utterance] = []
    seen: set[str] = set()
    for line, (utt, rel) in enumerate(read_kv_lines(wav_scp), 1):
        if utt in seen:
            raise InputError(wav_scp, line, f"duplicate utterance {utt!r}")
        seen.add(utt)
        if utt not in utt2spk:
            raise InputError(wav_scp, line, f"utterance {utt!r} has no speaker in {utt2spk_path}")
        spk = utt2spk[utt]
        path = resolve_audio(root, rel, wav_scp, line)
        utterances.append(Utterance(f"{spk}-{utt}", spk, str(path), text.get(utt) if text else None))
    missing = [u for u in utt2spk if u not in seen]
    if missing:
        line = list(utt2spk).index(missing[0]) + 1
        raise InputError(
            utt2spk_path, line, f"utterance {missing[0]!r} has no audio in {wav_scp} ({len(missing)} such utterances)"
        )
    genders = {spk: g.lower() for spk, g in spk2gender.items()}
    return CorpusData(f"speechocean762/{split}", utterances, genders)
