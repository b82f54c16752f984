"""Training shards: a data set packed into a few large files that are read front to back.

A shard is a tar file (POSIX pax) holding, for each of its utterances in a fixed order, the
members ``<utt>.spk`` (the speaker id), ``<utt>.feats`` (the feature matrix's Kaldi binary
record, copied byte for byte from stage 2's ark: a compressed matrix stays compressed) and,
where stage 2 wrote them, ``<utt>.vad``, ``<utt>.cmvn`` and ``<utt>.cmvn_voiced`` (the same
records of ``vad.scp``, ``cmvn_utt.scp`` and ``cmvn_utt_voiced.scp``); or, in place of
``feats``, ``vad`` and ``cmvn``, ``<utt>.feats_voiced``: the same record holding only the rows
the VAD keeps, each row's bytes as stored (:func:`spkflow.data.ark.select_rows`; all rows when
the VAD keeps none or all, as the loader then crops them all), for training with the VAD (the
default: the frames no crop can take are never read; Kaldi's ``prepare_feats_for_egs.sh``
likewise drops them before its egs); or, for training on
audio, ``<utt>.<type>`` (``flac``, ``wav``, ...: the file as stored, never re-encoded; a
``wav.scp`` pipe's output as ``wav``).  The last member, ``checksums.crc32``
(:data:`CHECKSUMS`), lists every other member in order: its crc32 (8 hex digits), size and name.
A shard set is a folder of ``shard.<K>.tar`` files with ``shards.list`` (``NAME NUM_UTTS BYTES``
per line), ``utt2shard`` and ``plan`` (the utterances of every shard).
:mod:`spkflow.data.shard_jobs` writes them, :mod:`spkflow.train.stores` reads them.

Why tar and not kaldiio arks in a known order: one file per shard holds every field of an
utterance (features, VAD, statistics, speaker) grouped under its key, so one open and one
sequential read bring a shard into memory; ``tar tf`` lists it, and WebDataset-style readers
(WeSpeaker's shard lists, SpeechBrain's WebDataset recipes) iterate the same files.  A feature
member is the same bytes an ark holds at the scp's offset, so the reader decodes it in place
with :class:`spkflow.data.ark.KaldiArkReader`'s code and the crops equal those read from the
arks bit for bit.  The price: a 512-byte header per member and padding to 512 bytes (about 3%
of a float-feature shard, measured in the recipes' README).  Ids containing a dot still work
here (the field is the part after the last dot); WebDataset itself would split at the first.

What this guarantees that WeSpeaker's ``make_shard_list.py`` and lhotse Shar do not: a shard
is written atomically (:func:`spkflow.core.atomic.atomic_write`), is byte-identical when
written again from the same inputs (fixed member order, mtime 0, no user names), and a
truncated, missing or foreign shard is one line naming it (:class:`ShardSet`,
:func:`load_shard`); every member is checked against its crc32 as the shard is read (zlib,
over bytes already in memory), so a damaged byte is an error naming the shard and the member,
not a wrong feature (WeSpeaker's reader skips a member it cannot decode and reads damaged
feature bytes as they are).
"""

from __future__ import annotations

import dataclasses
import io
import os
import stat
import tarfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError

__all__ = ["AUDIO_EXTS", "CHECKSUMS", "FIELDS", "Shard", "ShardSet", "load_shard", "write_shard", "shard_name"]

#: members a feature shard may hold per utterance besides ``spk`` (the ark record fields)
FIELDS = ("feats", "feats_voiced", "vad", "cmvn", "cmvn_voiced")
#: the member of an audio shard holding an utterance's file as stored (named by its type)
AUDIO_EXTS = ("flac", "wav", "ogg", "opus", "mp3", "m4a", "aac", "sph")
#: the last member of every shard: ``<crc32, 8 hex digits> <size> <member name>`` per member before it
CHECKSUMS = "checksums.crc32"
_READ_CHUNK = 8 << 20  # bytes per read() call: large requests, one after the other


def shard_name(index: int) -> str:
    """File name of shard ``index`` (0-based)."""
    return f"shard.{index + 1:06d}.tar"


def write_shard(path: str | os.PathLike[str], members: Iterable[tuple[str, str, bytes]]) -> int:
    """Write ``(utt, field, payload)`` members, in the given order, then :data:`CHECKSUMS`, as one
    tar file, atomically.  Returns the file's size in bytes."""
    sums = []
    with atomic_write(path, "wb") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for utt, field, payload in members:
                name = f"{utt}.{field}"
                _add(tar, name, payload)
                sums.append(f"{zlib.crc32(payload):08x} {len(payload)} {name}\n")
            _add(tar, CHECKSUMS, "".join(sums).encode("utf-8", "surrogateescape"))
    return os.path.getsize(path)


def _add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(payload), 0, 0o644
    tar.addfile(info, io.BytesIO(payload))


@dataclasses.dataclass
class Shard:
    """One shard in memory: ``data`` holds the whole file; ``offsets[field][utt]`` is where a
    member's payload starts in it and ``sizes[field][utt]`` its length; ``utts`` in file order."""

    name: str
    data: np.ndarray
    utts: list[str]
    offsets: dict[str, dict[str, int]]
    sizes: dict[str, dict[str, int]]

    def payload(self, utt: str, field: str) -> bytes:
        off = self.offsets[field][utt]
        return self.data[off : off + self.sizes[field][utt]].tobytes()

    def speaker(self, utt: str) -> str:
        return self.payload(utt, "spk").decode("utf-8", "surrogateescape")

    def audio_field(self, utt: str) -> str | None:
        """The member holding ``utt``'s audio file (its type), or None in a feature shard."""
        return next((f for f in AUDIO_EXTS if utt in self.offsets.get(f, ())), None)


def load_shard(path: str | os.PathLike[str], expected_bytes: int | None = None) -> Shard:
    """Read a whole shard front to back (large sequential reads, kernel read-ahead asked for),
    index its members and check each against its crc32 in :data:`CHECKSUMS`.  A missing or
    unreadable file, a directory, a size other than ``expected_bytes`` (the shard list's), a torn
    tar or a member that fails its checksum is an :class:`InputError` naming the shard (and the
    member)."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise InputError(path, None, f"shard cannot be opened: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InputError(path, None, f"is {what}, not a shard (shard.<K>.tar, listed in shards.list)")
        size = st.st_size
        if expected_bytes is not None and size != expected_bytes:
            raise InputError(
                path, None, f"shard has {size} bytes but the shard list says {expected_bytes} (truncated?)"
            )
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        data = np.empty(size, dtype=np.uint8)  # every byte is read below: no zero fill (3 ms of a 26 MB shard)
        buf, got = memoryview(data), 0
        while got < size:
            try:
                n = os.readv(fd, [buf[got : got + _READ_CHUNK]])
            except OSError as e:
                raise InputError(path, None, f"shard cannot be read at byte {got}: {e.strerror}") from None
            if n == 0:
                raise InputError(path, None, f"shard ended after {got} of {size} bytes")
            got += n
    finally:
        os.close(fd)
    members = _members(path, buf)
    _verify(path, buf, members)
    utts: list[str] = []
    offsets: dict[str, dict[str, int]] = {}
    sizes: dict[str, dict[str, int]] = {}
    for name, off, n in members[:-1]:
        utt, dot, field = name.rpartition(".")
        if not dot:
            raise InputError(path, None, f"member '{name}' is not '<utt>.<field>'")
        if field == "spk":
            utts.append(utt)
        offsets.setdefault(field, {})[utt] = off
        sizes.setdefault(field, {})[utt] = n
    return Shard(os.path.basename(path), data, utts, offsets, sizes)


def _verify(path: str, buf: memoryview, members: list[tuple[str, int, int]]) -> None:
    """Every member against its line of the last member, :data:`CHECKSUMS` (name, size, crc32)."""
    if not members or members[-1][0] != CHECKSUMS:
        raise InputError(
            path,
            None,
            f"has no '{CHECKSUMS}' member at its end (cut short, or written by an older spkflow): "
            "write the shards again (scripts/feats/make_shards.sh rewrites it)",
        )
    _, off, n = members[-1]
    lines = bytes(buf[off : off + n]).decode("utf-8", "surrogateescape").splitlines()
    if len(lines) != len(members) - 1:
        raise InputError(path, None, f"holds {len(members) - 1} members but '{CHECKSUMS}' lists {len(lines)}")
    view = memoryview(buf)
    for line, (name, off, n) in zip(lines, members, strict=False):
        crc, size, listed = (line.split(" ", 2) + ["", ""])[:3]
        if listed != name or size != str(n):
            raise InputError(
                path, None, f"member '{name}' ({n} bytes) is listed as '{listed}' ({size} bytes) in '{CHECKSUMS}'"
            )
        got = zlib.crc32(view[off : off + n])
        if f"{got:08x}" != crc:
            raise InputError(
                path,
                None,
                f"member '{name}' fails its checksum (crc32 {got:08x}, written as {crc}): the shard is damaged; "
                "write it again (scripts/feats/make_shards.sh rewrites a damaged shard)",
            )


def _members(path: str, buf: memoryview) -> list[tuple[str, int, int]]:
    """``(name, data offset, size)`` of the regular members of a tar in memory: ustar headers,
    with pax ("x") and GNU ("L") long names.  Python's ``tarfile`` builds an object per member and
    takes about 0.3 ms each; this reads the three fields it needs."""
    out: list[tuple[str, int, int]] = []
    pos, end, long_name = 0, len(buf), None
    while pos + 512 <= end:
        head = bytes(buf[pos : pos + 512])
        if head == _ZERO_BLOCK:
            return out
        if head[257:262] != b"ustar":  # cheaper than the checksum, and as sure a sign of a torn file
            raise InputError(path, None, f"bad tar header at byte {pos} (truncated or overwritten?)")
        size, kind = _octal(path, head[124:136], pos), head[156:157]
        data = pos + 512
        if data + size > end:
            raise InputError(path, None, f"member at byte {pos} runs past the end of the shard (truncated?)")
        if kind in (b"x", b"L"):
            text = bytes(buf[data : data + size])
            if kind == b"L":
                long_name = text.rstrip(b"\0").decode("utf-8", "surrogateescape")
            for rec in text.split(b"\n") if kind == b"x" else ():
                key, _, value = rec.partition(b" ")[2].partition(b"=")
                if key == b"path":
                    long_name = value.decode("utf-8", "surrogateescape")
        elif kind in (b"0", b"\0"):
            name = long_name
            if name is None:
                name = head[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                prefix = head[345:500].split(b"\0", 1)[0]
                if prefix:
                    name = prefix.decode("utf-8", "surrogateescape") + "/" + name
            out.append((name, data, size))
            long_name = None
        elif kind != b"g":
            raise InputError(path, None, f"member at byte {pos} is not a regular file (type {kind!r})")
        pos = data + -(-size // 512) * 512
    raise InputError(path, None, f"the shard ends without the tar end marker after {len(out)} members (truncated?)")


_ZERO_BLOCK = bytes(512)


def _octal(path: str, field: bytes, pos: int) -> int:
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise InputError(path, None, f"bad tar header at byte {pos} (truncated or overwritten?)") from None


class ShardSet:
    """A shard folder's ``shards.list`` and ``utt2shard``, checked: every listed file exists with
    its listed size, every utterance is in exactly one listed shard.  Errors name the list, its
    line and the shard."""

    def __init__(self, shard_list: str | os.PathLike[str]) -> None:
        self.list_path = os.fspath(shard_list)
        self.dir = Path(self.list_path).parent
        self.names: list[str] = []
        self.num_utts: list[int] = []
        self.bytes: list[int] = []
        if not os.path.isfile(self.list_path):
            raise InputError(
                self.list_path,
                None,
                "shard list not found (write the shards first: spk.sh --train_shards true, stage 2)",
            )
        with open(self.list_path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                parts = line.split()
                if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                    raise InputError(self.list_path, lineno, f"expected 'NAME NUM_UTTS BYTES', got '{line.strip()}'")
                path = self.dir / parts[0]
                if not path.is_file():
                    raise InputError(self.list_path, lineno, f"shard {path} is missing")
                have = path.stat().st_size
                if have != int(parts[2]):
                    raise InputError(
                        self.list_path, lineno, f"shard {path} has {have} bytes, the list says {parts[2]} (truncated?)"
                    )
                self.names.append(parts[0])
                self.num_utts.append(int(parts[1]))
                self.bytes.append(int(parts[2]))
        index = {n: i for i, n in enumerate(self.names)}
        self.utt2shard: dict[str, int] = {}
        u2s = self.dir / "utt2shard"
        if not u2s.is_file():
            raise InputError(u2s, None, "not found beside the shard list")
        with open(u2s, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                parts = line.split()
                if len(parts) != 2 or parts[1] not in index:
                    raise InputError(u2s, lineno, f"expected '<utt> <shard of {self.list_path}>', got '{line.strip()}'")
                if parts[0] in self.utt2shard:
                    raise InputError(u2s, lineno, f"utterance '{parts[0]}' is in two shards")
                self.utt2shard[parts[0]] = index[parts[1]]
        self.utts_of: list[list[str]] = [[] for _ in self.names]  # each shard's utterances, sorted
        for u, i in self.utt2shard.items():
            self.utts_of[i].append(u)
        for utts in self.utts_of:
            utts.sort()

    def __len__(self) -> int:
        return len(self.names)

    def path(self, i: int) -> str:
        return str(self.dir / self.names[i])

    def load(self, i: int, known_utts: Mapping[str, str] | None = None) -> Shard:
        """Shard ``i`` in memory, checked against the list: its utterances must be those
        ``utt2shard`` puts there, each with a ``feats``, ``feats_voiced`` or audio member, and
        (``known_utts``: the data dir's utt2spk) utterances of that data dir under the same
        speaker."""
        shard = load_shard(self.path(i), self.bytes[i])
        path = self.path(i)
        want = self.utts_of[i]
        if sorted(shard.utts) != want:
            extra = sorted(set(shard.utts) - set(want))[:3]
            lost = sorted(set(want) - set(shard.utts))[:3]
            raise InputError(
                path, None, f"holds other utterances than utt2shard says (extra: {extra}, missing: {lost})"
            )
        feats = shard.offsets.get("feats", {}).keys() | shard.offsets.get("feats_voiced", {}).keys()
        for u in shard.utts:
            if u not in feats and shard.audio_field(u) is None:
                raise InputError(path, None, f"utterance '{u}' has neither a feats nor an audio member")
            if known_utts is not None:
                if u not in known_utts:
                    raise InputError(
                        path, None, f"utterance '{u}' is not in the training data dir: shards of another data set?"
                    )
                if known_utts[u] != shard.speaker(u):
                    raise InputError(
                        path,
                        None,
                        f"utterance '{u}' is speaker '{shard.speaker(u)}' here but '{known_utts[u]}' in the data dir",
                    )
        return shard
