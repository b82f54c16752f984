"""Noise and reverberation sources for waveform augmentation: MUSAN and RIRS_NOISES -> data dirs.

Layouts, as released:

* MUSAN (openslr.org/17, ``MUSAN``): ``{noise,music,speech}/<source>/<part>-<source>-NNNN.wav``
  (``noise/free-sound/noise-free-sound-0000.wav``); one data dir per part (``musan_noise``,
  ``musan_music``, ``musan_speech``, the last one for babble).
* RIRS_NOISES (openslr.org/28, ``RIRS_NOISES``): ``simulated_rirs/{small,medium,large}room/
  RoomNNN/RoomNNN-NNNNN.wav``; one data dir ``rirs`` of the simulated room impulse responses.

Guarantees: each file is one utterance; the "speaker" is its source folder (``noise-free-sound``,
``smallroom-Room001``), so ids stay speaker-prefixed and files of one source or room group
together; a missing part folder is an error naming it; a part without audio is an error.
These data dirs are read only through ``wav.scp`` (and ``utt2dur``) by the augmentation.
"""

from __future__ import annotations

from pathlib import Path

from spkflow.core.errors import InputError
from spkflow.corpora.base import CorpusData, CorpusOption, CorpusSpec, Utterance, scan_files, speaker_prefixed

MUSAN_PARTS = ("noise", "music", "speech")
ROOM_SIZES = ("small", "medium", "large")

SPECS = {
    "musan": CorpusSpec(
        "musan",
        "MUSAN",
        "{part}",
        "{noise,music,speech}/<source>/*.wav; https://www.openslr.org/17",
        None,
        (CorpusOption("part", "noise | music | speech", "noise", choices=MUSAN_PARTS),),
    ),
    "rirs_noises": CorpusSpec(
        "rirs_noises",
        "RIRS_NOISES",
        "simulated_rirs",
        "simulated_rirs/{small,medium,large}room/RoomNNN/*.wav; https://www.openslr.org/28",
        None,
        (CorpusOption("rooms", "room sizes to include", " ".join(ROOM_SIZES), kind="list"),),
    ),
}


def collect_musan(corpus_dir: str | Path, part: str = "noise") -> CorpusData:
    if part not in MUSAN_PARTS:
        raise ValueError(f"part must be one of {MUSAN_PARTS}, got {part!r}")
    root = Path(corpus_dir).resolve() / part
    if not root.is_dir():
        raise InputError(root, None, f"MUSAN folder '{part}/' not found (MUSAN={corpus_dir})")
    utterances = []
    for path, source in scan_files(root, 1):
        spk = f"{part}-{source}"
        utterances.append(Utterance(speaker_prefixed(spk, path.stem), spk, str(path)))
    if not utterances:
        raise InputError(root, None, "no <source>/*.wav audio in this MUSAN folder")
    return CorpusData(f"musan/{part}", utterances)


def collect_rirs_noises(corpus_dir: str | Path, rooms: list[str] | tuple[str, ...] = ROOM_SIZES) -> CorpusData:
    base = Path(corpus_dir).resolve() / "simulated_rirs"
    utterances = []
    for size in rooms:
        if size not in ROOM_SIZES:
            raise ValueError(f"rooms must be among {ROOM_SIZES}, got {size!r}")
        root = base / f"{size}room"
        if not root.is_dir():
            raise InputError(root, None, f"RIRS_NOISES folder 'simulated_rirs/{size}room/' not found")
        for path, room in scan_files(root, 1):
            spk = f"{size}room-{room}"
            utterances.append(Utterance(speaker_prefixed(f"{size}room", path.stem), spk, str(path)))
    if not utterances:
        raise InputError(base, None, "no RoomNNN/*.wav impulse responses")
    for u in utterances:  # Room001-00001 -> smallroom-Room001-00001 is prefixed by smallroom-Room001
        if not u.utt.startswith(u.spk + "-"):
            raise InputError(u.wav, None, f"not named like RIRS_NOISES (<room>-NNNNN.wav in folder {u.spk})")
    return CorpusData("rirs_noises", utterances)
