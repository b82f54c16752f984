"""VoxCeleb1 and VoxCeleb2, as downloaded and unzipped, -> Kaldi data dirs and Vox1-O/E/H trials.

Layouts (the official archives unzipped in place):

* VoxCeleb1 (``VOXCELEB1``): ``wav/idXXXXX/<youtube id>/NNNNN.wav`` (dev and test archives unzip
  into the same ``wav/``; FLAC copies are accepted), and the cleaned verification lists
  ``veri_test2.txt`` (Vox1-O), ``list_test_all2.txt`` (Vox1-E), ``list_test_hard2.txt`` (Vox1-H):
  ``<1|0> idXXXXX/<youtube id>/NNNNN.wav idXXXXX/<youtube id>/NNNNN.wav`` per line.
* VoxCeleb2 (``VOXCELEB2``): ``dev/aac/idXXXXX/<youtube id>/NNNNN.m4a`` (``test/aac/...`` for
  the test part).

Guarantees:

* utterance ids are ``<speaker>-<youtube id>-<NNNNN>`` (``id10270-x6uYqmx31kE-00001``): the
  conventional ``id/video/clip`` with ``/`` made ``-``, speaker-prefixed and white-space free;
* an m4a becomes a ``wav.scp`` pipe through the ffmpeg binary of the pinned PyPI package
  ``imageio-ffmpeg`` (16 kHz mono 16-bit WAV on stdout); its duration comes from the MP4
  header (``mvhd``) without decoding, so stage 1 stays a directory walk plus one small read per
  file, and a file that is not an MP4 is an error naming it before anything is written;
* a trial list is converted line by line, in its order, to ``enroll test target|nontarget``
  over the utterance ids; the data dir written with it holds exactly the utterances the list
  names.  A malformed line is an error naming list and line; a line naming a file that is not
  in the corpus is an error naming list, line and file, or with ``missing=skip`` the trial is
  left out and the number of skipped trials is logged.

Anchor: Kaldi's ``egs/voxceleb/v2/local/make_voxceleb{1_v2,2}.pl`` (which write ids
``id/video-clip`` and convert m4a with ``ffmpeg`` in a pipe too) and WeSpeaker's
``prepare_data.sh``.  Unlike those, lists naming absent files are not silently kept for a
later stage to trip on, and ffmpeg comes with the Python environment instead of the system.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from pathlib import Path

import soundfile as sf

from spkflow.core.errors import InputError
from spkflow.corpora.base import CorpusData, CorpusOption, CorpusSpec, Utterance
from spkflow.data.ffmpeg import FFMPEG_ARGS, default_ffmpeg, ffmpeg_pipe  # noqa: F401  (FFMPEG_ARGS: re-exported)

log = logging.getLogger(__name__)

#: the 40 speakers of the VoxCeleb1 verification test part (the rest is VoxCeleb1 dev)
VOX1_TEST_SPEAKERS = frozenset(f"id{n}" for n in range(10270, 10310))
#: set name -> official cleaned trial list file (in the VoxCeleb1 folder)
TRIAL_LISTS = {"vox1_o": "veri_test2.txt", "vox1_e": "list_test_all2.txt", "vox1_h": "list_test_hard2.txt"}

_SPK = re.compile(r"id\d+")
_REL = re.compile(r"(?P<spk>id\d+)/(?P<video>[^/\s]+)/(?P<clip>[^/\s]+)\.(?:wav|flac|m4a)")

SPECS = {
    "voxceleb1": CorpusSpec(
        "voxceleb1",
        "VOXCELEB1",
        "wav",
        "wav/idXXXXX/<youtube id>/NNNNN.wav + veri_test2.txt, list_test_all2.txt, list_test_hard2.txt",
        None,
        (
            CorpusOption(
                "part",
                "all | dev (speakers outside the test part) | test (id10270-id10309)",
                "all",
                choices=("all", "dev", "test"),
            ),
            CorpusOption(
                "trial_list",
                "an official trial list (file name in VOXCELEB1, or an absolute path): the data dir then "
                "holds the utterances it names, and its trials",
                None,
            ),
            CorpusOption(
                "missing",
                "a trial naming a file not in the corpus: error | skip (counted)",
                "error",
                choices=("error", "skip"),
            ),
        ),
    ),
    "voxceleb2": CorpusSpec(
        "voxceleb2",
        "VOXCELEB2",
        "{part}/aac",
        "dev/aac/idXXXXX/<youtube id>/NNNNN.m4a (test/aac for the test part)",
        None,
        (
            CorpusOption("part", "dev | test", "dev", choices=("dev", "test")),
            CorpusOption("ffmpeg", "ffmpeg binary of the wav.scp pipes (default: imageio_ffmpeg's)", None),
        ),
    ),
}


def utt_id(rel: str) -> tuple[str, str] | None:
    """``idXXXXX/<video>/<clip>.wav`` -> (``idXXXXX-<video>-<clip>``, ``idXXXXX``); None if not so."""
    m = _REL.fullmatch(rel)
    if m is None:
        return None
    return f"{m['spk']}-{m['video']}-{m['clip']}", m["spk"]


def _scan(root: Path, exts: tuple[str, ...]) -> dict[str, tuple[str, Path]]:
    """``root/idXXXXX/<video>/<clip>.<ext>`` -> {utt: (speaker, path)}, in sorted order."""
    out: dict[str, tuple[str, Path]] = {}
    for spk in sorted(os.listdir(root)):
        spk_dir = root / spk
        if not _SPK.fullmatch(spk) or not spk_dir.is_dir():
            continue
        for video in sorted(os.listdir(spk_dir)):
            vdir = spk_dir / video
            if not vdir.is_dir():
                continue
            for name in sorted(os.listdir(vdir)):
                if not name.lower().endswith(exts):
                    continue
                ids = utt_id(f"{spk}/{video}/{name}")
                if ids is None:
                    raise InputError(vdir / name, None, "not named like VoxCeleb (idXXXXX/<video>/<clip>.ext)")
                if ids[0] in out:
                    raise InputError(vdir / name, None, f"utterance {ids[0]!r} also stored as {out[ids[0]][1]}")
                out[ids[0]] = (ids[1], vdir / name)
    return out


def m4a_duration(path: str | os.PathLike[str]) -> float:
    """Seconds of an MP4/M4A file from its movie header (``moov/mvhd``), without decoding.
    Raises :class:`InputError` naming the file when it is not an MP4 with a movie header."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            moov = _find_box(f, 0, end, b"moov", path)
            mvhd = _find_box(f, moov[0], moov[1], b"mvhd", path)
            f.seek(mvhd[0])
            head = f.read(32)
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc}") from None
    version = head[0] if head else -1
    if version == 0 and len(head) >= 20:
        scale, dur = struct.unpack(">II", head[12:20])
    elif version == 1 and len(head) >= 32:
        scale, dur = struct.unpack(">IQ", head[20:32])
    else:
        raise InputError(path, None, "corrupt m4a: unreadable movie header (mvhd)")
    if scale == 0:
        raise InputError(path, None, "corrupt m4a: movie header has time scale 0")
    return dur / scale


def _find_box(f, start: int, end: int, kind: bytes, path: str) -> tuple[int, int]:  # noqa: ANN001
    """(payload start, box end) of the first box ``kind`` among the boxes in [start, end)."""
    pos = start
    while pos + 8 <= end:
        f.seek(pos)
        size, typ = struct.unpack(">I4s", f.read(8))
        head = 8
        if size == 1:
            (size,) = struct.unpack(">Q", f.read(8))
            head = 16
        elif size == 0:
            size = end - pos
        if size < head or pos + size > end:
            break
        if typ == kind:
            return pos + head, pos + size
        pos += size
    raise InputError(path, None, f"corrupt m4a: no '{kind.decode()}' box (not an MP4 file, or truncated)")


def collect_voxceleb2(corpus_dir: str | Path, part: str = "dev", ffmpeg: str | None = None) -> CorpusData:
    """VoxCeleb2 ``part`` (``dev``: 5,994 speakers at full size); m4a read through an ffmpeg pipe."""
    root = Path(corpus_dir).resolve() / part / "aac"
    if not root.is_dir():
        raise FileNotFoundError(f"VoxCeleb2 {part} not found: {root} (expected VOXCELEB2/{part}/aac/idXXXXX/...)")
    exe = ffmpeg or default_ffmpeg()
    utterances: list[Utterance] = []
    durations: dict[str, float] = {}
    for utt, (spk, path) in _scan(root, (".m4a", ".wav", ".flac")).items():
        if path.suffix.lower() == ".m4a":
            durations[utt] = m4a_duration(path)
            wav = ffmpeg_pipe(exe, str(path))
        else:  # a copy already converted
            durations[utt] = sf.info(str(path)).duration
            wav = str(path)
        utterances.append(Utterance(utt, spk, wav))
    if not utterances:
        raise FileNotFoundError(f"VoxCeleb2 {part}: no idXXXXX/<video>/<clip>.m4a under {root}")
    return CorpusData(f"voxceleb2/{part}", utterances, durations=durations)


def collect_voxceleb1(
    corpus_dir: str | Path, part: str = "all", trial_list: str | None = None, missing: str = "error"
) -> CorpusData:
    """VoxCeleb1 (``part`` all | dev | test), or with ``trial_list`` the utterances a trial list
    names plus its trials (see the module docstring)."""
    if missing not in ("error", "skip"):
        raise ValueError(f"missing must be error or skip, got {missing!r}")
    top = Path(corpus_dir).resolve()
    root = top / "wav"
    if not root.is_dir():
        raise FileNotFoundError(f"VoxCeleb1 not found: {root} (expected VOXCELEB1/wav/idXXXXX/...)")
    found = _scan(root, (".wav", ".flac"))
    if part != "all":
        found = {u: v for u, v in found.items() if (v[0] in VOX1_TEST_SPEAKERS) == (part == "test")}
    if trial_list is None:
        utterances = [Utterance(u, spk, str(p)) for u, (spk, p) in found.items()]
        if not utterances:
            raise FileNotFoundError(f"VoxCeleb1 ({part}): no idXXXXX/<video>/<clip>.wav under {root}")
        return CorpusData(f"voxceleb1/{part}", utterances)
    lst = Path(trial_list)
    if not lst.is_absolute():  # a list name: the official lists sit in the VoxCeleb1 folder
        lst = top / lst
    if not lst.is_file():
        raise FileNotFoundError(f"trial list not found: {lst}")
    trials, skipped = read_official_list(lst, found, missing)
    used = {u for a, b, _ in trials for u in (a, b)}
    if not trials:
        raise InputError(lst, None, f"no trial left ({skipped} named missing files)")
    if skipped:
        log.warning("%s: skipped %d of %d trials naming files not in %s", lst, skipped, skipped + len(trials), root)
    utterances = [Utterance(u, found[u][0], str(found[u][1])) for u in sorted(used)]
    return CorpusData(f"voxceleb1/{lst.name}", utterances, trials=trials)


def read_official_list(
    path: Path, found: dict[str, tuple[str, Path]], missing: str = "error"
) -> tuple[list[tuple[str, str, bool]], int]:
    """Convert ``<1|0> enroll.wav test.wav`` lines to (enroll utt, test utt, is_target) in list
    order; returns the trials and the number skipped for naming files not in ``found``."""
    trials: list[tuple[str, str, bool]] = []
    skipped = 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            ids = [utt_id(x) for x in fields[1:]] if len(fields) == 3 else []
            if len(fields) != 3 or fields[0] not in ("0", "1") or None in ids:
                raise InputError(
                    path,
                    n,
                    f"expected '<1|0> idXXXXX/<video>/<clip>.wav idXXXXX/<video>/<clip>.wav', got {line.rstrip()!r}",
                )
            (a, _), (b, _) = ids  # type: ignore[misc]
            absent = [rel for rel, u in zip(fields[1:], (a, b), strict=True) if u not in found]
            if absent:
                if missing == "error":
                    raise InputError(
                        path,
                        n,
                        f"names {absent[0]}, which is not in the corpus (use --missing skip to leave such trials out)",
                    )
                skipped += 1
                continue
            trials.append((a, b, fields[0] == "1"))
    return trials, skipped
