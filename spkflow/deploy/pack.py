"""Packed models: one zip file holding everything a trained spkflow embedder needs elsewhere.

:func:`pack_model` turns a stage-4 model dir into ``NAME.zip`` with, at the top level:

``config.yaml``  the complete training config (its ``frontend`` section drives feature extraction)
``model.pth``    the weights, a plain state dict (``torch.load(..., weights_only=True)``)
``fbank.conf``   the fbank options as a Kaldi option file (stage 2 of another recipe can use it)
``vad.conf``     the energy-VAD options, likewise
``README.md``    a model card (architecture, frontend, training data, scoring, results, checksums, usage)
``RESULTS.md``   the recipe's results table, when the model dir has one
``scoring.yaml``, ``scoring.npz``  the recipe's scoring, when stage 6 wrote one: the fitted backend
                 (WCCN / LDA), the centring, the AS-norm cohort (the training speakers' mean
                 embeddings) with its size, and the score calibration with its decision threshold
                 (:mod:`spkflow.score.verification`); ``Embedder.verify`` and ``spkflow.bin.verify``
                 score with it, a pack without it scores plain cosine
``meta.yaml``    format name and version, versions of spkflow and torch, and the sha256 and
                 size of every other member

What it guarantees
------------------
* **A pack is a model dir.**  ``unzip FILE -d DIR`` gives a directory that every spkflow tool
  takes as ``--model-dir``; :func:`unpack_model` does the same with checks.  Members are the
  model dir's own files, so nothing in the pack needs spkflow to be read (``unzip -p FILE
  README.md``).
* **Only sound models are packed.**  The weights are loaded into the model the config describes
  (strict key and shape check) before anything is written; a training checkpoint is reduced to
  its model weights; the scoring is loaded and must fit the embedding dimension, and its name
  (``WCCN, AS-norm (top 25)``) must be one RESULTS.md reports, so that the model card, the
  results and what the pack scores with agree.  The file appears atomically (:mod:`spkflow.core.atomic`).
* **Corruption is caught, by name.**  Opening checks the zip structure, the format name and
  version, and each member's sha256 against ``meta.yaml``; a failure is an
  :class:`~spkflow.core.errors.InputError` naming the file and the member.  No pickle code runs on
  load: ``model.pth`` is read with ``weights_only=True``.

Why a zip and not one torch or npz file: the members stay ordinary files (readable, diffable,
the same names as in a model dir, so the shell scripts need no new loader), any language can
list and extract them, and the weights inside keep torch's own safe format.  ESPnet's
``pack`` (``espnet2/main_funcs/pack_funcs.py``) also writes a zip with a ``meta.yaml``, but
stores the training paths inside the configs (rewritten on unpack), records no checksums, and
does not check that the weights fit the config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import io
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from spkflow.core.atomic import atomic_write
from spkflow.core.checks import ConfigError
from spkflow.core.errors import InputError
from spkflow.core.version import __version__
from spkflow.features.fbank import FbankOptions
from spkflow.features.vad import VadOptions
from spkflow.score.verification import SCORING_FILES, Scoring

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "PackedModel",
    "check_model_path",
    "is_packed",
    "model_sample_rate",
    "pack_model",
    "read_packed",
    "unpack_model",
]

#: ``meta.yaml``'s ``format`` value, and the version this module reads and writes
FORMAT = "spkflow-packed-model"
FORMAT_VERSION = 1
_META = "meta.yaml"
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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _state_dict_bytes(model_dir: Path) -> tuple[bytes, Any]:
    """The weights of ``model_dir`` as ``torch.save`` bytes of a plain state dict, after checking
    that they fit ``config.yaml``.  Returns (bytes, the loaded model)."""
    import torch

    from spkflow.nnet.models import load_model_dir

    try:
        model, _ = load_model_dir(model_dir, "cpu")
    except (ConfigError, FileNotFoundError) as exc:
        raise InputError(model_dir, None, f"cannot pack: {exc}") from None
    except Exception as exc:  # unreadable or truncated model.pth
        raise InputError(
            model_dir / "model.pth", None, f"cannot load the weights: {type(exc).__name__}: {exc}"
        ) from None
    raw = (model_dir / "model.pth").read_bytes()
    state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    if isinstance(state, Mapping) and isinstance(state.get("model"), Mapping):  # a training checkpoint
        buf = io.BytesIO()
        torch.save(dict(state["model"]), buf)
        raw = buf.getvalue()
    return raw, model


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def _scoring_line(scoring: Scoring | None) -> str:
    if scoring is None:
        return (
            "- **Scoring**: plain cosine of the embeddings (not normalised); no calibration in this pack, "
            "so `verify` gives scores and no same-speaker decisions."
        )
    text = scoring.describe()
    return (
        f"- **Scoring** (`scoring.yaml`, `scoring.npz`; what `Embedder.verify`, `python -m spkflow.bin.verify` "
        f"and `identify` apply, and the `{scoring.label}` rows of `RESULTS.md`): {text[0].upper()}{text[1:]}"
    )


def _model_card(
    config: Mapping[str, Any], model: Any, files: Mapping[str, bytes], name: str, scoring: Scoring | None = None
) -> str:

    mcfg = dict(config.get("model") or {})
    fe = dict(config.get("frontend") or {})
    fb = dict(fe.get("fbank") or {})
    data = dict(config.get("data") or {})
    loss = dict(config.get("loss") or {})
    nparams = sum(int(p.numel()) for p in model.parameters())
    arch = ", ".join(f"{k}={v}" for k, v in mcfg.items() if k not in ("name", "specaug"))
    lines = [
        f"# Speaker embedder `{name}` (spkflow {__version__})",
        "",
        f"- **Model**: `{mcfg.get('name')}` ({arch}); {nparams:,} parameters; "
        f"{int(model.embed_dim)}-dim embeddings (not L2-normalised).",
        f"- **Input**: {fb.get('num_mel_bins')}-bin Kaldi log-mel fbank at {_num(fb.get('sample_frequency'))} Hz "
        f"({_num(fb.get('frame_length'))} ms windows every {_num(fb.get('frame_shift'))} ms; `fbank.conf`), "
        f"energy VAD {'on' if fe.get('vad') else 'off'} (`vad.conf`), per-utterance mean normalisation "
        f"{'on' if fe.get('mean_norm') else 'off'}.  Audio at other rates is resampled (polyphase) first.",
        f"- **Training**: loss `{loss.get('name', '?')}`"
        + (f", {data.get('num_train_speakers')} speakers of `{data.get('train_data')}`" if data else "")
        + (
            f", {data.get('num_epochs')} epochs of {data.get('num_spk')} x {data.get('num_utt')} batches"
            if data
            else ""
        )
        + "; the full recipe config is `config.yaml`.",
        _scoring_line(scoring),
        "- **Results**: "
        + ("see `RESULTS.md` (included)." if "RESULTS.md" in files else "none recorded with the model."),
        f"- **Weights**: `model.pth`, sha256 `{_sha256(files['model.pth'])}`.",
        "",
        "## Use",
        "",
        "```python",
        "from spkflow import Embedder",
        f'emb = Embedder.from_pretrained("{name}.zip")  # device="cuda" for a GPU',
        'vec = emb.embed_file("utt.wav")               # numpy [dim]',
        'v = emb.verify("a.wav", "b.wav")              # v.score (cosine), v.llr, v.same_speaker',
        "```",
        "",
        "```sh",
        f"python -m spkflow.bin.verify --model {name}.zip a.wav b.wav            # one JSON line per pair",
        "python -m spkflow.bin.make_data_dir my_recordings/ data/mine          # a folder -> a Kaldi data dir",
        f"python -m spkflow.bin.identify --model {name}.zip --enrol data/mine new.wav",
        f"scripts/spk/extract_embeddings.sh --model-dir {name}.zip data/test exp/embed/test",
        f"python -m spkflow.bin.export --model-dir {name}.zip --out {name}.onnx",
        "```",
        "",
        "Intended use: speaker verification and identification, and speaker conditioning (e.g. TTS "
        "`spembs`), on speech like the training data's.  The calibration holds for data like its "
        "trials; for other languages, channels or ages, fit one on your own labelled trials "
        "(`python -m spkflow.bin.calibrate`) and read its Cllr and actual DCF before trusting the LLRs.",
        "",
    ]
    return "\n".join(lines)


def pack_model(
    model_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    results: str | os.PathLike[str] | None = None,
    name: str | None = None,
) -> Path:
    """Pack ``model_dir`` (``config.yaml`` + ``model.pth``; ``RESULTS.md`` when present, or
    ``results``) into the zip ``out``.  Returns ``out``.  Raises :class:`InputError` naming the
    file when the model dir is incomplete or its weights do not fit its config."""
    import torch

    d = Path(model_dir)
    if not d.is_dir():
        raise InputError(d, None, "model directory not found")
    for f in ("config.yaml", "model.pth"):
        if not (d / f).is_file():
            raise InputError(d / f, None, "not found: a model directory holds config.yaml and model.pth (stage 4)")
    weights, model = _state_dict_bytes(d)
    cfg_bytes = (d / "config.yaml").read_bytes()
    config = yaml.safe_load(cfg_bytes)
    fe = dict(config.get("frontend") or {})
    try:
        fbank = FbankOptions.from_dict(dict(fe.get("fbank") or {}))
        vad = VadOptions(**dict(fe.get("vad_conf") or {}))
    except (TypeError, ValueError) as exc:
        raise InputError(d / "config.yaml", None, f"bad frontend section: {exc}") from None
    files: dict[str, bytes] = {
        "config.yaml": cfg_bytes,
        "model.pth": weights,
        "fbank.conf": fbank.to_kaldi_conf().encode(),
        "vad.conf": vad.to_kaldi_conf().encode(),
    }
    res = Path(results) if results is not None else d / "RESULTS.md"
    if results is not None and not res.is_file():
        raise InputError(res, None, "results file not found")
    if res.is_file():
        files["RESULTS.md"] = res.read_bytes()
    scoring = _scoring_of(d, int(model.embed_dim), files.get("RESULTS.md"), res)
    if scoring is not None:
        for f in SCORING_FILES:
            files[f] = (d / f).read_bytes()
    name = name or Path(out).name.removesuffix(".zip")
    files["README.md"] = _model_card(config, model, files, name, scoring).encode()
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "spkflow_version": __version__,
        "torch_version": torch.__version__.split("+")[0],
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": {"name": (config.get("model") or {}).get("name"), "embed_dim": int(model.embed_dim)},
        "frontend": {"vad": bool(fe.get("vad", False)), "mean_norm": bool(fe.get("mean_norm", False))},
        "files": {k: {"sha256": _sha256(v), "size": len(v)} for k, v in files.items()},
    }
    with atomic_write(out, "wb", encoding=None) as f, zipfile.ZipFile(f, "w") as z:
        z.writestr(_META, yaml.safe_dump(meta, sort_keys=False), compress_type=zipfile.ZIP_DEFLATED)
        for k, v in files.items():
            # weights barely compress (float mantissas); text does
            z.writestr(k, v, compress_type=zipfile.ZIP_STORED if k == "model.pth" else zipfile.ZIP_DEFLATED)
    return Path(out)


def _scoring_of(d: Path, dim: int, results: bytes | None, results_path: Path) -> Scoring | None:
    """The model dir's scoring (None when stage 6 wrote none), checked against the model and RESULTS.md."""
    present = [f for f in SCORING_FILES if (d / f).is_file()]
    if not present:
        return None
    scoring = Scoring.load(d)  # InputError naming the missing or bad file
    if scoring.dim is not None and scoring.dim != dim:
        raise InputError(
            d / "scoring.npz", None, f"scores {scoring.dim}-dim embeddings; the model makes {dim}-dim ones"
        )
    if results is not None and f"| {scoring.label} |" not in results.decode("utf-8", "replace"):
        raise InputError(
            results_path,
            None,
            f"reports no '{scoring.label}' row, the scoring of scoring.yaml: stage 6 scored with other options "
            "than those it calibrated (re-run stage 6 with one set of options)",
        )
    return scoring


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
            if _META not in names:
                torch_file = any(n.endswith("/data.pkl") or n == "data.pkl" for n in names)
                hint = (
                    "it is a torch file (model.pth?): give the model directory that holds it and config.yaml"
                    if torch_file
                    else "made by python -m spkflow.bin.pack?"
                )
                raise InputError(p, None, f"not a packed spkflow model: no {_META} ({hint})")
            meta_raw = z.read(_META)
            meta = yaml.safe_load(meta_raw)
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise InputError(p, None, f"not a packed spkflow model: {_META} has no 'format: {FORMAT}'")
            if meta.get("format_version") != FORMAT_VERSION:
                raise InputError(
                    p,
                    None,
                    f"pack format version {meta.get('format_version')!r}; this spkflow reads version {FORMAT_VERSION}",
                )
            listed = meta.get("files")
            if not isinstance(listed, dict) or not {"config.yaml", "model.pth"} <= set(listed):
                raise InputError(p, None, f"{_META} does not list config.yaml and model.pth")
            members: dict[str, bytes] = {}
            for member, info in listed.items():
                if not isinstance(member, str) or not _MEMBER_RE.fullmatch(member) or member == _META:
                    raise InputError(p, None, f"{_META} lists {member!r}: members are plain file names")
                if member not in names:
                    raise InputError(p, None, f"member {member} listed in {_META} is missing")
                data = z.read(member)
                if _sha256(data) != (info or {}).get("sha256"):
                    raise InputError(p, None, f"member {member}: sha256 differs from {_META} (corrupted file)")
                members[member] = data
    except zipfile.BadZipFile as exc:
        raise InputError(p, None, f"not a readable zip file (truncated or corrupted?): {exc}") from None
    except (zipfile.LargeZipFile, EOFError, OSError, yaml.YAMLError) as exc:
        raise InputError(p, None, f"cannot read the packed model: {type(exc).__name__}: {exc}") from None
    meta["sha256"] = _sha256(meta_raw)
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
    stamp = out / _STAMP
    if stamp.is_file() and stamp.read_text().strip() == packed.meta["sha256"]:
        if all((out / m).is_file() for m in packed.members):
            return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for member, data in packed.members.items():
            (tmp / member).write_bytes(data)
        (tmp / _META).write_text(yaml.safe_dump({k: v for k, v in packed.meta.items() if k != "sha256"}))
        (tmp / _STAMP).write_text(packed.meta["sha256"] + "\n")
        os.chmod(tmp, 0o777 & ~_umask())
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
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
