"""Random access to Kaldi ark matrices and vectors through their scp, reading only what is asked.

What it guarantees: every ark file is memory-mapped once per process and read at the offsets of
the scp (no system call per read); for float matrices only the requested rows are touched,
compressed matrices (Kaldi's CompressedMatrix formats) are decoded only for those rows; headers
are cached; a malformed scp line, a duplicate key or an unreadable ark names the scp and line.
The values equal kaldiio's reading of the same scp (``test/train/test_loader.py``).  The same
decoding reads records held in memory (:class:`MemoryArks`: a shard's members), so a record
copied byte for byte gives the same values wherever it lies.  Used by the training stores
(:mod:`spkflow.train.stores`), validation and the shard writer.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spkflow.core.errors import InputError

__all__ = ["ArkRecords", "KaldiArkReader", "MemoryArks", "parse_header", "select_rows"]


@dataclasses.dataclass(frozen=True)
class _Header:
    kind: str  # FM DM FV DV CM CM2 CM3
    rows: int
    cols: int  # 0 for vectors
    data: int  # absolute offset of the data (CM: of the per-column headers)
    gmin: float = 0.0
    grange: float = 0.0


_PLAIN = {"FM": np.dtype("<f4"), "FV": np.dtype("<f4"), "DM": np.dtype("<f8"), "DV": np.dtype("<f8")}


def _item_size(kind: str) -> int:
    """Bytes per element of a row-major record: float or double, or CM2's / CM3's 16 / 8-bit codes."""
    return _PLAIN[kind].itemsize if kind in _PLAIN else 2 if kind == "CM2" else 1


@functools.lru_cache(maxsize=64)
def _plain_head(kind: str, rows: int, cols: int) -> bytes:
    """The header bytes of an uncompressed ``kind`` entry of ``rows`` (x ``cols``): the same for
    every per-utterance VAD length or CMVN statistics, so made once (read on every crop)."""
    head = b"\0B" + kind.encode() + b" \x04" + struct.pack("<i", rows)
    return head + (b"\x04" + struct.pack("<i", cols) if cols else b"")


def parse_header(head: bytes, off: int) -> _Header | None:
    """Parse the binary header at ark offset ``off`` from its first (up to 32) bytes."""
    if head[:2] != b"\0B":
        return None
    sp = head.find(b" ", 2)
    if sp < 0:
        return None
    kind = head[2:sp].decode("ascii", "replace")
    p = sp + 1
    try:
        if kind in ("FM", "DM"):
            rows, cols = struct.unpack_from("<xixi", head, p)
            return _Header(kind, rows, cols, off + p + 10)
        if kind in ("FV", "DV"):
            (rows,) = struct.unpack_from("<xi", head, p)
            return _Header(kind, rows, 0, off + p + 5)
        if kind in ("CM", "CM2", "CM3"):
            gmin, grange, rows, cols = struct.unpack_from("<ffii", head, p)
            return _Header(kind, rows, cols, off + p + 16, gmin, grange)
    except struct.error:
        return None
    return None


class ArkRecords:
    """Kaldi binary records located by (buffer ``i``, offset): headers, whole arrays, rows and
    gathers of rows, decoded as :class:`KaldiArkReader` describes.  A subclass says where buffer
    ``i`` is: :class:`KaldiArkReader` (the ark files of an scp, mapped or read with pread) or
    :class:`MemoryArks` (buffers already in memory, e.g. a shard's members).  ``scp`` names the
    records in messages."""

    def __init__(self, name: str) -> None:
        self.scp = name
        self.access = "mmap"
        self._index: dict[str, tuple[int, int]] = {}
        self._other: dict[str, str] = {}  # entries kaldiio reads (pipes, slices, text arks)
        self._headers: dict[str, _Header] = {}
        self._sizes: dict[int, int] = {}
        self._scratch: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._index) + len(self._other)

    def __contains__(self, utt: object) -> bool:
        return utt in self._index or utt in self._other

    def keys(self) -> list[str]:
        return list(self._index) + list(self._other)

    def _map(self, i: int) -> np.ndarray:
        """Buffer ``i`` as uint8."""
        raise NotImplementedError

    def _open(self, i: int) -> int:
        """A file descriptor of buffer ``i`` (``access="pread"`` only)."""
        raise NotImplementedError

    def _where(self, i: int) -> str:
        """Buffer ``i``'s name, for messages."""
        raise NotImplementedError

    def _fallback(self, utt: str) -> np.ndarray:
        """An entry that is not a binary record at an offset."""
        raise InputError(self.scp, None, f"'{utt}' is not a Kaldi binary record")

    def _truncated(self, utt: str, i: int, start: int, n: int, size: int) -> OSError:
        return OSError(
            f"{self.scp}: entry '{utt}' is truncated (wanted {n} bytes at offset {start} "
            f"of {self._where(i)}, which has {size})"
        )

    def _bytes(self, utt: str, i: int, start: int, n: int) -> np.ndarray:
        """``n`` bytes at ``start`` of ark ``i``: a view of the map, or a fresh buffer (pread)."""
        if self.access == "pread":
            buf = os.pread(self._open(i), n, start)
            if len(buf) != n:
                raise self._truncated(utt, i, start, n, self._sizes[i])
            return np.frombuffer(buf, dtype=np.uint8)
        m = self._map(i)
        if start + n > len(m):
            raise self._truncated(utt, i, start, n, len(m))
        return m[start : start + n]

    def _head(self, i: int, off: int) -> bytes:
        if self.access == "pread":
            return os.pread(self._open(i), 32, off)
        return self._map(i)[off : off + 32].tobytes()

    def header(self, utt: str) -> _Header | None:
        """Header of a binary ark entry (cached); None for entries read through kaldiio."""
        h = self._headers.get(utt)
        if h is not None:
            return h
        if utt in self._other:
            return None
        i, off = self._locate(utt)
        h = parse_header(self._head(i, off), off)
        if h is not None:
            self._headers[utt] = h
        return h

    def _locate(self, utt: str) -> tuple[int, int]:
        try:
            return self._index[utt]
        except KeyError:
            raise KeyError(f"utterance '{utt}' is not in {self.scp}") from None

    def record_size(self, utt: str) -> int:
        """Bytes of the binary record of ``utt`` (header and data, no key)."""
        h = self.header(utt)
        if h is None:
            raise InputError(self.scp, None, f"'{utt}' is not a binary ark entry (a pipe, slice or text ark)")
        if h.kind == "CM":
            size = h.cols * 8 + h.rows * h.cols
        else:
            size = h.rows * max(h.cols, 1) * _item_size(h.kind)
        return h.data + size - self._locate(utt)[1]

    def record_bytes(self, utt: str) -> bytes:
        """The binary record of ``utt`` exactly as stored (header and data, no key): a compressed
        matrix stays compressed.  Entries read through kaldiio (pipes, slices) have none."""
        n = self.record_size(utt)
        i, off = self._locate(utt)
        return self._bytes(utt, i, off, n).tobytes()

    def num_rows(self, utt: str) -> int:
        h = self.header(utt)
        return h.rows if h is not None else len(self._fallback(utt))

    def read(self, utt: str, cache_header: bool = True) -> np.ndarray:
        """The whole matrix or vector as a new float32 array.  ``cache_header=False`` for
        small entries read once per use (VAD, CMVN stats): saves the memory of the cache."""
        h = self._headers.get(utt)
        if h is None and not cache_header and utt in self._index:
            i, off = self._index[utt]
            h = parse_header(self._head(i, off), off)
        if h is None:
            h = self.header(utt)
        if h is None:
            return self._fallback(utt)
        if h.cols == 0:
            dtype = _PLAIN[h.kind]
            raw = self._bytes(utt, self._index[utt][0], h.data, h.rows * dtype.itemsize)
            return raw.view(dtype).astype(np.float32)
        return self._rows(utt, h, 0, h.rows).astype(np.float32, copy=True)

    def plain_view(self, utt: str, kind: str, rows: int, cols: int = 0) -> np.ndarray | None:
        """A read-only view of an uncompressed entry known to be ``kind`` ("FV", "FM", "DM", ...)
        of shape ``(rows,)`` or ``(rows, cols)``, checked against its header bytes; None when
        the entry is anything else (then use :meth:`read`).  No header cache, no copy (it maps
        the ark whatever ``access`` is): for small per-utterance entries (VAD, CMVN stats) read
        on every crop."""
        loc = self._index.get(utt)
        if loc is None:
            return None
        i, off = loc
        head = _plain_head(kind, rows, cols)
        m = self._map(i)
        if m[off : off + len(head)].tobytes() != head:
            return None
        dtype = _PLAIN[kind]
        n = rows * max(cols, 1) * dtype.itemsize
        start = off + len(head)
        if start + n > len(m):
            return None
        a = m[start : start + n].view(dtype)
        return a.reshape(rows, cols) if cols else a

    def read_rows(self, utt: str, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of a matrix as a new float32 array ``[hi - lo, cols]``."""
        h = self.header(utt)
        if h is None:
            return self._fallback(utt)[lo:hi]
        return np.array(self._rows(utt, h, lo, hi), dtype=np.float32, copy=True)

    def rows_view(self, utt: str, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` as float32, a read-only view into the map when the entry is an
        uncompressed float matrix (copy it before keeping it)."""
        h = self.header(utt)
        if h is None:
            return self._fallback(utt)[lo:hi]
        return self._rows(utt, h, lo, hi)

    def gather(self, utt: str, frames: np.ndarray, out: np.ndarray, contiguous: bool = False) -> None:
        """``out[:] = matrix[frames]`` for a float32 C-contiguous ``out`` [len(frames), cols].

        ``contiguous``: ``frames`` is ``lo, lo+1, ..`` (one block copy).  Uncompressed float
        matrices are copied as bytes: ark data is not 4-byte aligned (it follows the key), and
        numpy's gather on unaligned floats is several times slower than on bytes."""
        h = self.header(utt)
        lo, hi = (int(frames[0]), int(frames[-1]) + 1) if contiguous else (int(frames.min()), int(frames.max()) + 1)
        if h is not None and h.kind in ("FM", "CM2", "CM3"):
            if h.cols != out.shape[1]:
                raise ValueError(f"'{utt}' has dimension {h.cols}, expected {out.shape[1]} ({self.scp})")
            if not 0 <= lo <= hi <= h.rows:
                raise IndexError(f"rows {lo}:{hi} of '{utt}' ({h.rows} rows)")
            size = _item_size(h.kind)
            row, i = size * h.cols, self._index[utt][0]
            if h.kind == "FM":
                dst = out.view(np.uint8).reshape(len(frames), row)
                if contiguous and self.access == "pread":  # straight from the file into the batch
                    self._preadv_into(utt, i, h.data + lo * row, dst)
                    return
                raw = self._span(utt, i, h.data + lo * row, hi - lo, row)
                if contiguous:
                    dst[:] = raw
                else:
                    np.take(raw, frames - lo, axis=0, out=dst, mode="clip")  # mode="raise" would buffer
                return
            # linear 16/8-bit codes: decode only the crop's rows, straight into ``out``
            q = self._span(utt, i, h.data + lo * row, hi - lo, row).view("<u2" if size == 2 else "u1")
            if not contiguous:
                q = np.take(q, frames - lo, axis=0)
            np.multiply(q, np.float32(h.grange / (65535.0 if size == 2 else 255.0)), out=out)
            out += np.float32(h.gmin)
            return
        block = self.rows_view(utt, lo, hi)
        if block.shape[1] != out.shape[1]:
            raise ValueError(f"'{utt}' has dimension {block.shape[1]}, expected {out.shape[1]} ({self.scp})")
        np.take(block, frames - lo, axis=0, out=out, mode="clip")

    def spans_into(self, utts: Sequence[str], starts: Sequence[int], out: np.ndarray) -> None:
        """``out[j] = matrix(utts[j])[starts[j] : starts[j] + T]`` for a float32 C-contiguous ``out``
        [len(utts), T, cols]: :meth:`gather` of consecutive rows for a whole batch of crops.  An
        uncompressed float matrix is one read straight into ``out`` (pread) or one byte copy from
        the map, with no other work per crop than its checks; other entries go through
        :meth:`gather`."""
        B, T, cols = out.shape
        n = T * cols * 4
        flat = memoryview(out.reshape(-1).view(np.uint8)) if self.access == "pread" else None
        dst = out.reshape(B, -1).view(np.uint8)
        heads, index = self._headers, self._index
        for j, utt in enumerate(utts):
            h, lo = heads.get(utt) or self.header(utt), starts[j]
            if h is None or h.kind != "FM":
                self.gather(utt, np.arange(lo, lo + T), out[j], contiguous=True)
                continue
            if h.cols != cols:
                raise ValueError(f"'{utt}' has dimension {h.cols}, expected {cols} ({self.scp})")
            if not 0 <= lo <= lo + T <= h.rows:
                raise IndexError(f"rows {lo}:{lo + T} of '{utt}' ({h.rows} rows)")
            i, start = index[utt][0], h.data + lo * cols * 4
            if flat is not None:
                if os.preadv(self._open(i), [flat[j * n : (j + 1) * n]], start) != n:
                    raise self._truncated(utt, i, start, n, self._sizes[i])
            else:
                dst[j] = self._bytes(utt, i, start, n)

    def plain_stack(self, utts: Sequence[str], kind: str, rows: int, cols: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`plain_view` for a batch: an array ``[len(utts), rows(, cols)]`` of ``kind`` and
        which of its rows were found so (a bool per utterance; the others are zero, read them with
        :meth:`read`).  One gather per buffer instead of a view per utterance."""
        head = _plain_head(kind, rows, cols)
        dtype = _PLAIN[kind]
        size, shape = len(head) + rows * max(cols, 1) * dtype.itemsize, (rows, cols) if cols else (rows,)
        raw = np.zeros((len(utts), size), dtype=np.uint8)
        where = np.array([self._index.get(u, (-1, 0)) for u in utts], dtype=np.int64).reshape(-1, 2)
        for i in np.unique(where[:, 0]).tolist():
            if i < 0:
                continue
            m = self._map(int(i))
            sel = np.flatnonzero((where[:, 0] == i) & (where[:, 1] + size <= len(m)))
            raw[sel] = np.lib.stride_tricks.sliding_window_view(m, size)[where[sel, 1]]  # a row copy each
        found = (raw[:, : len(head)] == np.frombuffer(head, dtype=np.uint8)).all(axis=1)
        return np.ascontiguousarray(raw[:, len(head) :]).view(dtype).reshape(len(utts), *shape), found

    def _preadv_into(self, utt: str, i: int, start: int, dst: np.ndarray) -> None:
        n = dst.nbytes
        got = os.preadv(self._open(i), [memoryview(dst).cast("B")], start)
        if got != n:
            raise self._truncated(utt, i, start, n, self._sizes[i])

    def _span(self, utt: str, i: int, start: int, rows: int, row: int) -> np.ndarray:
        """Bytes [rows, row] at ``start``: a view of the map, or (pread) read into a scratch
        buffer that is reused by the next call (copy out before calling again)."""
        if self.access == "mmap":
            return self._bytes(utt, i, start, rows * row).reshape(rows, row)
        n = rows * row
        if self._scratch is None or self._scratch.nbytes < n:
            self._scratch = np.empty(max(n, 1 << 16), dtype=np.uint8)
        dst = self._scratch[:n]
        self._preadv_into(utt, i, start, dst)
        return dst.reshape(rows, row)

    def _rows(self, utt: str, h: _Header, lo: int, hi: int) -> np.ndarray:
        if h.cols == 0:
            raise ValueError(f"{self.scp}: '{utt}' holds a {h.kind} vector, not a matrix")
        if not 0 <= lo <= hi <= h.rows:
            raise IndexError(f"rows {lo}:{hi} of '{utt}' ({h.rows} rows)")
        i, n = self._index[utt][0], hi - lo
        if h.kind in ("FM", "DM"):
            dtype = _PLAIN[h.kind]
            raw = self._bytes(utt, i, h.data + lo * h.cols * dtype.itemsize, n * h.cols * dtype.itemsize)
            a = raw.view(dtype).reshape(n, h.cols)
            return a if h.kind == "FM" else a.astype(np.float32)
        if h.kind in ("CM2", "CM3"):
            size, top = (2, 65535.0) if h.kind == "CM2" else (1, 255.0)
            raw = self._bytes(utt, i, h.data + lo * h.cols * size, n * h.cols * size)
            q = raw.view("<u2" if size == 2 else "u1").reshape(n, h.cols)
            return (np.float32(h.gmin) + q.astype(np.float32) * np.float32(h.grange / top)).astype(np.float32)
        if h.kind == "CM":
            # per-column headers (4 uint16 quantiles per column), then the bytes column by column
            raw = self._bytes(utt, i, h.data, h.cols * 8 + h.rows * h.cols)
            pc = raw[: h.cols * 8].view("<u2").reshape(h.cols, 4).astype(np.float32)
            pc = np.float32(h.gmin) + pc * np.float32(h.grange / 65535.0)
            q = raw[h.cols * 8 :].reshape(h.cols, h.rows)[:, lo:hi].T
            return _cm_decode(q, pc)
        raise ValueError(f"{self.scp}: '{utt}' has unsupported type {h.kind}")


class KaldiArkReader(ArkRecords):
    """Random access to a Kaldi scp of binary arks, each ark opened once per process.

    ``read(utt)`` returns the whole array (float32); ``read_rows(utt, lo, hi)`` rows
    ``lo:hi`` of a matrix, and ``gather(utt, frames, out)`` writes chosen rows into ``out``,
    touching only those rows for uncompressed and CM2/CM3 (linear 16/8-bit) matrices.
    ``access="mmap"`` maps each ark (no system call per read once the pages are cached; on this
    project's VM a system call costs up to ~30 us under load); ``access="pread"`` reads with
    ``pread``/``preadv`` and read-ahead off (exactly the bytes asked for, best when the arks
    do not fit in the page cache).  Entries that are not ``path:offset`` into a binary ark
    (pipes, slices, text arks) fall back to ``kaldiio.load_mat``.  Picklable (files and maps
    are reopened after unpickling) and fork-safe (a child opens its own descriptors).
    """

    def __init__(self, scp: str | os.PathLike[str], access: str = "mmap") -> None:
        super().__init__(os.fspath(scp))
        self._files: list[str] = []
        file_index: dict[str, int] = {}
        try:
            f = open(self.scp, encoding="utf-8")
        except OSError as e:
            raise InputError(self.scp, None, f"cannot open: {e.strerror}") from e
        with f:
            for lineno, line in enumerate(f, 1):
                parts = line.split(maxsplit=1)
                if not parts:
                    continue
                if len(parts) != 2:
                    raise InputError(self.scp, lineno, f"expected '<utt> <ark>:<offset>', got '{line.strip()}'")
                utt, spec = parts[0], parts[1].strip()
                if utt in self._index or utt in self._other:
                    raise InputError(self.scp, lineno, f"duplicate key '{utt}'")
                path, sep, off = spec.rpartition(":")
                if sep and off.isdigit() and not spec.endswith("|"):
                    i = file_index.setdefault(path, len(self._files))
                    if i == len(self._files):
                        self._files.append(path)
                    self._index[utt] = (i, int(off))
                else:
                    self._other[utt] = spec
        if access not in ("mmap", "pread"):
            raise ValueError(f"access must be 'mmap' or 'pread', got {access!r}")
        self.access = access
        self._maps: dict[int, np.ndarray] = {}
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def close(self) -> None:
        """Drop the memory maps (unmapped once no array refers to them) and close the files."""
        self._maps = {}
        if self._pid == os.getpid():
            for fd in self._fds.values():
                os.close(fd)
        self._fds = {}

    def __getstate__(self) -> dict[str, Any]:  # picklable for spawn-started workers
        state = self.__dict__.copy()
        state["_maps"], state["_fds"], state["_pid"], state["_scratch"] = {}, {}, -1, None
        return state

    def _open(self, i: int) -> int:
        if self._pid != os.getpid():  # a forked worker: descriptors of its own (maps stay valid)
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(i)
        if fd is None:
            try:
                fd = os.open(self._files[i], os.O_RDONLY)
            except OSError as e:
                raise OSError(f"{self.scp}: cannot open ark {self._files[i]}: {e.strerror}") from e
            if hasattr(os, "posix_fadvise"):  # crops are random reads: no kernel read-ahead
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            self._fds[i] = fd
            self._sizes[i] = os.fstat(fd).st_size
        return fd

    def _map(self, i: int) -> np.ndarray:
        m = self._maps.get(i)
        if m is None:
            path = self._files[i]
            try:
                with open(path, "rb") as f:
                    mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if os.fstat(f.fileno()).st_size else b""
            except OSError as e:
                raise OSError(f"{self.scp}: cannot open ark {path}: {e.strerror}") from e
            m = np.frombuffer(mm, dtype=np.uint8)
            self._maps[i] = m
        return m

    def _where(self, i: int) -> str:
        return self._files[i]

    def _fallback(self, utt: str) -> np.ndarray:
        import kaldiio

        spec = self._other.get(utt)
        if spec is None:
            i, off = self._index[utt]
            spec = f"{self._files[i]}:{off}"
        try:
            return np.asarray(kaldiio.load_mat(spec), dtype=np.float32)
        except (AssertionError, ValueError, OSError, EOFError, struct.error) as e:  # kaldiio's bare asserts
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise InputError(self.scp, None, f"entry '{utt}' ({spec}) cannot be read (cut short?): {why}") from None


class MemoryArks(ArkRecords):
    """Kaldi binary records in buffers the caller holds in memory (a shard's members, say):
    :meth:`add` indexes a buffer's records by key and offset, :meth:`drop` forgets them.  The
    records decode as :class:`KaldiArkReader` decodes the same bytes in an ark (the same code),
    read in place.  ``name`` names the records in messages; a key that is not a binary record
    is an :class:`InputError` naming its buffer."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._buffers: dict[int, np.ndarray] = {}
        self._names: dict[int, str] = {}
        self._keys: dict[int, list[str]] = {}

    def add(self, i: int, name: str, data: np.ndarray, offsets: Mapping[str, int]) -> None:
        """Buffer ``i`` (uint8, called ``name``) holds the record of each key at its offset."""
        self.drop(i)
        self._buffers[i], self._names[i], self._keys[i] = data, name, list(offsets)
        for utt, off in offsets.items():
            self._index[utt] = (i, off)

    def drop(self, i: int) -> None:
        """Forget buffer ``i`` and its records."""
        self._buffers.pop(i, None)
        self._names.pop(i, None)
        for utt in self._keys.pop(i, ()):
            self._index.pop(utt, None)
            self._headers.pop(utt, None)

    def __getstate__(self) -> dict[str, Any]:  # buffers stay with the process that holds them
        state = self.__dict__.copy()
        state.update(_buffers={}, _names={}, _keys={}, _index={}, _headers={}, _scratch=None)
        return state

    def _map(self, i: int) -> np.ndarray:
        m = self._buffers.get(i)
        if m is None:
            raise RuntimeError(f"{self.scp}: buffer {i} is not in memory")
        return m

    def _open(self, i: int) -> int:
        raise RuntimeError(f"{self.scp}: records in memory are not read with pread")

    def _where(self, i: int) -> str:
        return self._names.get(i, f"buffer {i}")

    def _fallback(self, utt: str) -> np.ndarray:
        i = self._index[utt][0] if utt in self._index else -1
        raise InputError(self._where(i), None, f"'{utt}': not a Kaldi binary record ({self.scp})")


def select_rows(record: bytes, rows: np.ndarray) -> bytes:
    """A Kaldi binary matrix record (``\\0B`` header and data, as :meth:`KaldiArkReader.record_bytes`
    gives it) holding only ``rows`` (increasing indices), in the same format: a compressed matrix
    keeps its global and per-column headers and the chosen rows' codes, so every value decodes
    exactly as in the whole matrix (no second quantisation; Kaldi's ``select-voiced-frames``
    decompresses and writes floats).  Used for shards of the voiced frames."""
    h = parse_header(record[:32], 0)
    if h is None or h.cols == 0:
        raise ValueError("not a Kaldi binary matrix record")
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows[0] < 0 or rows[-1] >= h.rows or (np.diff(rows) <= 0).any()):
        raise ValueError(f"rows must be increasing indices below {h.rows}")
    raw = np.frombuffer(record, dtype=np.uint8)
    if h.kind == "CM":  # the column headers, then each column's bytes (column-major)
        cols = raw[h.data + h.cols * 8 : h.data + h.cols * 8 + h.rows * h.cols].reshape(h.cols, h.rows)
        body = raw[h.data : h.data + h.cols * 8].tobytes() + np.ascontiguousarray(cols[:, rows]).tobytes()
    else:
        size = _item_size(h.kind)
        body = raw[h.data : h.data + h.rows * h.cols * size].reshape(h.rows, h.cols * size)[rows].tobytes()
    head = bytearray(record[: h.data])
    p = head.index(b" ", 2) + 1  # the row count: after a size byte (FM, DM) or after gmin, grange (CM*)
    struct.pack_into("<i", head, p + (1 if h.kind in _PLAIN else 8), len(rows))
    return bytes(head) + body


def _cm_decode(q: np.ndarray, pc: np.ndarray) -> np.ndarray:
    """Kaldi's CompressedMatrix (kOneByteWithColHeaders) byte -> float, for a [rows, cols] slice.

    Kaldi's piecewise-linear formula is evaluated once per column and code, each piece on its own
    codes only (a [cols, 256] table: the same float32 operations, so the same bits), and the bytes
    are looked up in it: one gather per value instead of three products and two selections."""
    p0, p25, p75, p100 = (pc[:, k : k + 1] for k in range(4))
    x = np.arange(256, dtype=np.float32)
    table = np.empty((len(pc), 256), dtype=np.float32)
    table[:, :65] = p0 + (p25 - p0) * x[:65] * (1 / 64.0)
    table[:, 65:193] = p25 + (p75 - p25) * (x[65:193] - 64.0) * (1 / 128.0)
    table[:, 193:] = p75 + (p100 - p75) * (x[193:] - 192.0) * (1 / 63.0)
    return table.ravel()[q + np.arange(0, table.size, 256, dtype=np.intp)]
