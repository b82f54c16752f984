"""Opening a packed model (``python -m spkflow.bin.pack``): verified, and unpacked once into a cache.

A pack is one zip (:mod:`spkflow.deploy.pack` writes it) whose members are a model dir's files
plus ``meta.yaml`` (format, versions, the sha256 and size of every member).  This module is the
reading side, which every consumer goes through (:func:`spkflow.embed.open.inspect_model`):

* :func:`read_packed` checks the zip structure (a file cut short is named as such, not read as
  the torch file inside it), the format name and version, that members, listed or not, are plain
  file names (``../x`` or ``/etc/x`` is refused, though unpacking writes listed members only), and
  each member's sha256 against ``meta.yaml``; a failure is an
  :class:`~spkflow.core.errors.InputError` naming the file and the member.  No pickle code runs:
  ``model.pth`` is read later with ``weights_only=True``.
* :func:`unpacked` gives the model dir of a pack: unpacked once into the cache
  (``$SPKFLOW_CACHE``, default ``~/.cache/spkflow``; ``packs/<sha256 of meta.yaml>``, i.e. keyed
  by the content, which ``meta.yaml`` hashes member by member), by one process at a time under
  the cache's lock (:mod:`spkflow.core.lock`; the others wait, then reuse it), written under a
  temporary name and renamed when complete.  The parallel jobs of stage 5 and the recipe that
  started them all get the same directory; jobs on other hosts need the cache on a shared disk.
* :func:`unpack_model` writes a pack's members into a given dir (``spkflow.bin.pack --unpack``),
  keeping a dir unpacked from the same pack as it is.

ESPnet's ``unpack`` (``espnet2/main_funcs/pack_funcs.py``) extracts into a folder per call,
rewriting paths inside the configs, with no checksums; Hugging Face's hub cache is keyed by
revision, not by content, and takes a lock per file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import yaml

from spkflow.core.atomic import make_temp_dir
from spkflow.core.errors import InputError
from spkflow.core.lock import LockError, hold
from spkflow.score.model_scoring import SCORING_FILES, Scoring

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "META",
    "PackedModel",
    "cache_root",
    "check_model_path",
    "is_packed",
    "model_sample_rate",
    "read_packed",
    "sha256",
    "unpack_model",
    "unpacked",
]

FORMAT = "spkflow-packed-model"
FORMAT_VERSION = 1
META = "meta.yaml"
#: stamp written into an unpacked dir: the sha256 of the pack's meta.yaml (reuse when unchanged)
_STAMP = ".packed_meta.sha256"
#: member names: plain file names at the top level (unpacking never writes outside the target dir)
_MEMBER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclasses.dataclass(frozen=True)
class PackedModel:
    """A verified pack: its path, ``meta.yaml`` and the members' bytes."""

    path: Path
    meta: dict[str, Any]
    members: dict[str, bytes]

    @property
    def config(self) -> dict[str, Any]:
        return yaml.safe_load(self.members["config.yaml"].decode("utf-8"))

    @property
    def scoring(self) -> Scoring | None:
        """The packed scoring, or None for a pack without one (made before stage 6 wrote one)."""
        if not all(name in self.members for name in SCORING_FILES):
            return None
        return Scoring.from_bytes(self.members["scoring.yaml"], self.members["scoring.npz"], str(self.path))


def check_model_path(path: str | os.PathLike[str]) -> None:
    """:class:`InputError` naming ``path`` when it is not a model at all: missing, or a folder
    without ``config.yaml`` (with a hint when it holds a pack, e.g. ``exp/spk_x/packed/``: give
    the zip itself)."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, None, "model not found (a stage-4 model dir, a packed model file or an exported .onnx)")
    if p.is_dir() and not (p / "config.yaml").is_file():
        packs = sorted(q.name for q in p.glob("*.zip") if is_packed(q))
        hint = (
            f"; it holds the packed model {packs[0]}: give that file ({p / packs[0]})"
            if packs
            else " (a model dir holds config.yaml and model.pth)"
        )
        raise InputError(p, None, f"no config.yaml: not a model dir{hint}")


def model_sample_rate(path: str | os.PathLike[str]) -> int:
    """The sample rate a model dir's or pack's fbank expects (``frontend.fbank.sample_frequency``)."""
    p = Path(path)
    check_model_path(p)
    if p.is_dir():
        cfg = yaml.safe_load((p / "config.yaml").read_text(encoding="utf-8"))
    elif p.suffix == ".onnx":
        raise InputError(p, None, "give the model dir or pack, or --rate (an .onnx file is not read here)")
    else:
        cfg = read_packed(p).config
    try:
        return int(float(cfg["frontend"]["fbank"]["sample_frequency"]))
    except (KeyError, TypeError, ValueError):
        raise InputError(p, None, "config.yaml has no frontend.fbank.sample_frequency") from None


def is_packed(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a file (not a dir) that looks like a zip: the caller then treats
    it as a packed model (errors come from :func:`read_packed`)."""
    p = Path(path)
    return p.is_file() and zipfile.is_zipfile(p)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_packed(path: str | os.PathLike[str]) -> PackedModel:
    """Open and verify a packed model (see the module doc).  Raises :class:`InputError` naming
    ``path`` (and the member) for a missing, truncated, foreign or corrupted file."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, None, "packed model file not found")
    if p.is_dir():
        raise InputError(p, None, "is a directory, not a packed model file")
    cut = _cut_short(p)
    if cut:
        raise InputError(
            p,
            None,
            f"truncated or damaged zip file ({p.stat().st_size} bytes): {cut}; an interrupted copy or "
            "download? Copy it again",
        )
    try:
        with zipfile.ZipFile(p) as z:
            names = set(z.namelist())
            if META not in names:
                torch_file = any(n.endswith("/data.pkl") or n == "data.pkl" for n in names)
                hint = (
                    "it is a torch file (model.pth?): give the model directory that holds it and config.yaml"
                    if torch_file
                    else "made by python -m spkflow.bin.pack?"
                )
                raise InputError(p, None, f"not a packed spkflow model: no {META} ({hint})")
            meta_raw = z.read(META)
            meta = yaml.safe_load(meta_raw)
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise InputError(p, None, f"not a packed spkflow model: {META} has no 'format: {FORMAT}'")
            if meta.get("format_version") != FORMAT_VERSION:
                raise InputError(
                    p,
                    None,
                    f"pack format version {meta.get('format_version')!r}; this spkflow reads version {FORMAT_VERSION}",
                )
            for name in sorted(names):  # what unzip would write outside a folder (spkflow extracts none of it)
                if not _MEMBER_RE.fullmatch(name):
                    raise InputError(
                        p,
                        None,
                        f"member {name!r}: members are plain file names, not paths (absolute or with '..'): not "
                        "a pack spkflow.bin.pack made, and unsafe to unzip",
                    )
            listed = meta.get("files")
            if not isinstance(listed, dict) or not {"config.yaml", "model.pth"} <= set(listed):
                raise InputError(p, None, f"{META} does not list config.yaml and model.pth")
            members: dict[str, bytes] = {}
            for member, info in listed.items():
                if not isinstance(member, str) or not _MEMBER_RE.fullmatch(member) or member == META:
                    raise InputError(p, None, f"{META} lists {member!r}: members are plain file names")
                if member not in names:
                    raise InputError(p, None, f"member {member} listed in {META} is missing")
                data = z.read(member)
                if sha256(data) != (info or {}).get("sha256"):
                    raise InputError(p, None, f"member {member}: sha256 differs from {META} (corrupted file)")
                members[member] = data
    except zipfile.BadZipFile as exc:
        raise InputError(p, None, f"not a readable zip file (truncated or corrupted?): {exc}") from None
    except (zipfile.LargeZipFile, EOFError, OSError, yaml.YAMLError) as exc:
        raise InputError(p, None, f"cannot read the packed model: {type(exc).__name__}: {exc}") from None
    meta["sha256"] = sha256(meta_raw)
    return PackedModel(p, meta, members)


def _cut_short(path: Path) -> str | None:
    """Why ``path`` does not end as a whole zip file does, with its end-of-central-directory record
    (and its comment, if any) as the last bytes; None when it does.  Python's zipfile takes the
    last such record in the final 64 KiB wherever it is, so a pack cut short is read as the zip
    stored inside it (model.pth is one: a torch file)."""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - (22 + 0xFFFF)))
        tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0:
        return "no zip directory at its end"
    comment = int.from_bytes(tail[at + 20 : at + 22], "little")
    if at + 22 + comment != len(tail):
        return "it does not end with its zip directory (cut short)"
    return None


def unpack_model(path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Verify the pack ``path`` and write its members into ``out_dir`` (a model dir).

    Idempotent: an ``out_dir`` unpacked from the same pack is kept as it is (so an extraction
    that resumes sees the same files).  Otherwise the new dir replaces the old one only once it
    is complete.  Returns ``out_dir``."""
    packed = read_packed(path)
    out = Path(out_dir)
    if not _unpacked_from(out, packed):
        _write(packed, out)
    return out


def cache_root() -> Path:
    """Where unpacked packs are kept: ``$SPKFLOW_CACHE``, else ``$XDG_CACHE_HOME/spkflow``, else
    ``~/.cache/spkflow``."""
    env = os.environ.get("SPKFLOW_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spkflow"


def unpacked(path: str | os.PathLike[str], *, wait: float = 600.0) -> tuple[Path, PackedModel]:
    """The model dir of the pack ``path`` and the verified pack: unpacked into
    ``cache_root()/packs/<sha256 of meta.yaml>`` once, under the lock of ``cache_root()/packs``
    (a process that finds it held waits up to ``wait`` seconds, then uses what the holder wrote).
    Raises :class:`InputError` naming ``path`` for a bad pack."""
    packed = read_packed(path)
    root = cache_root() / "packs"
    out = root / packed.meta["sha256"]
    if _unpacked_from(out, packed):
        return out, packed
    deadline = time.monotonic() + wait
    while True:
        try:
            with hold(root, command=f"spkflow: unpacking {path}"):
                if not _unpacked_from(out, packed):
                    _write(packed, out)
                return out, packed
        except LockError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _unpacked_from(out: Path, packed: PackedModel) -> bool:
    stamp = out / _STAMP
    return (
        stamp.is_file()
        and stamp.read_text().strip() == packed.meta["sha256"]
        and all((out / m).is_file() for m in packed.members)
    )


def _write(packed: PackedModel, out: Path) -> None:
    """The members, ``meta.yaml`` and the stamp into ``out``, which appears (or replaces the old
    one) only when complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(f".{out.name}.", out.parent)
    try:
        for member, data in packed.members.items():
            (tmp / member).write_bytes(data)
        (tmp / META).write_text(yaml.safe_dump({k: v for k, v in packed.meta.items() if k != "sha256"}))
        (tmp / _STAMP).write_text(packed.meta["sha256"] + "\n")
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old.{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
        raise
