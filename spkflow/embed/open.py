"""The one way to open a speaker model: :func:`inspect_model` says what a path is, :func:`open_embedder` runs it.

Every consumer goes through here: the Python API (:meth:`spkflow.Embedder.from_pretrained`),
stage 5's jobs (``spkflow.bin.extract_embeddings``), verification / identification
(``spkflow.bin.verify`` / ``identify``) and the recipes' shell scripts, which ask
``python -m spkflow.bin.model_info PATH`` and pass the path and ``--toolkit`` on unchanged.

What a path may be, and what it becomes:

==================================  ==========  ==============================================
path                                toolkit     run by
==================================  ==========  ==============================================
stage-4 model dir (config + weights) ``spkflow``  :class:`~spkflow.embed.native.SpkflowEmbedder`
packed model ``.zip``               ``spkflow``  the same, on the pack unpacked once into the cache
                                                (:func:`spkflow.embed.packed.unpacked`)
ONNX export of ours (``.onnx``)     ``spkflow``  :class:`~spkflow.embed.exported.OnnxBackend`
                                                (the API only: stage 5's jobs refuse it)
ESPnet speaker model dir            ``espnet``   :class:`~spkflow.embed.espnet.EspnetEmbedder`
SpeechBrain pretrained folder       ``speechbrain``  :class:`~spkflow.embed.speechbrain.SpeechbrainEmbedder`
WeSpeaker ONNX export (dir or file) ``wespeaker``  :class:`~spkflow.embed.wespeaker.WespeakerEmbedder`
Resemblyzer ``.pt`` (dir or file)   ``resemblyzer``  :class:`~spkflow.embed.resemblyzer.ResemblyzerEmbedder`
==================================  ==========  ==============================================

What it guarantees: the toolkit is told from the files when not given (:func:`detect_toolkit`,
no model built); every refusal (a missing path, a ``packed/`` folder instead of its zip, an
ESPnet config given as ours, an option another toolkit cannot take, our ONNX export given to
stage 5's jobs, a corrupted pack) is an :class:`~spkflow.core.errors.InputError` or ``ValueError``
naming the path, raised before any model is built; a pack is verified member by member and
unpacked once, under a lock, keyed by its content.  ESPnet's ``Speech2Embedding.from_pretrained``
and SpeechBrain's ``from_hparams`` each open their own toolkit's files only; WeSpeaker's
``load_model`` its own; Resemblyzer's ``VoiceEncoder`` takes any ``.pt`` and loads it with
``strict=False``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from spkflow.core.errors import InputError
from spkflow.embed.base import TOOLKITS, Embedder, onnx_session
from spkflow.embed.espnet import EspnetEmbedder
from spkflow.embed.exported import OnnxBackend
from spkflow.embed.native import SpkflowEmbedder
from spkflow.embed.packed import check_model_path, unpacked
from spkflow.embed.resemblyzer import ResemblyzerEmbedder, is_encoder_checkpoint
from spkflow.embed.speechbrain import SpeechbrainEmbedder
from spkflow.embed.wespeaker import INPUT, WespeakerEmbedder
from spkflow.score.model_scoring import SCORING_FILES, Scoring, has_scoring

__all__ = ["ModelInfo", "check_options", "detect_toolkit", "inspect_model", "open_embedder"]

_KINDS = "a stage-4 model dir, a packed model file or an exported .onnx; another toolkit's dir or .onnx"


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a model path is (:func:`inspect_model`); nothing is built."""

    path: Path  # as given
    toolkit: str  # one of TOOLKITS
    kind: str  # dir | pack | onnx (ours), or dir | file (another toolkit's)
    model_dir: Path  # where its files are: the dir, a pack's unpacked copy, or the file itself
    meta: dict[str, Any] | None = None  # a pack's meta.yaml (with its own sha256)

    @property
    def ours(self) -> bool:
        return self.toolkit == "spkflow"

    @property
    def name(self) -> str:
        """The file or folder name without ``.zip`` / ``.onnx`` (a default tag for recipes)."""
        name = self.path.resolve().name if self.path.name in ("", ".", "..") else self.path.name
        for suffix in (".zip", ".onnx"):
            name = name.removesuffix(suffix)
        return name

    @property
    def scoring_dir(self) -> Path | None:
        """The dir holding the model's own scoring (``scoring.yaml`` + ``.npz``: stage 6's), or None."""
        if self.ours and self.kind != "onnx" and has_scoring(self.model_dir):
            return self.model_dir
        return None

    def scoring(self) -> Scoring | None:
        """The model's own scoring, named by the path given (a pack's by the pack), or None."""
        d = self.scoring_dir
        if d is None:
            return None
        if self.kind == "pack":
            yml, npz = ((d / f).read_bytes() for f in SCORING_FILES)
            return Scoring.from_bytes(yml, npz, str(self.path))
        return Scoring.load(d)


def detect_toolkit(path: str | os.PathLike[str]) -> str:
    """The toolkit whose model ``path`` is, from its files (no model is built):

    * a ``.onnx`` file: ``wespeaker`` when its only input is ``feats``, else ``spkflow`` (an export
      of ``python -m spkflow.bin.export``, inputs ``feats`` and ``lengths``);
    * a ``.pt`` file holding a GE2E encoder's ``model_state``: ``resemblyzer``;
    * a dir with ``hyperparams.yaml``: ``speechbrain``;
    * a dir with ``config.yaml``: ``wespeaker`` when it has ``dataset_args`` beside an ``.onnx``,
      ``espnet`` when it has an ``encoder``, ``spkflow`` when it has a ``model`` section;
    * a dir with one ``.onnx`` and no config: ``wespeaker``;
    * a dir with one ``.pt`` and no config, that checkpoint a GE2E encoder's: ``resemblyzer`` (the
      installed ``resemblyzer`` package's folder is one);
    * any other file: ``spkflow`` (a packed model, ``python -m spkflow.bin.pack``).

    Raises :class:`InputError` naming the path when none fits."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, None, "model not found")
    if p.is_file():
        if p.suffix == ".onnx":
            names = [i.name for i in onnx_session(p).get_inputs()]
            return "wespeaker" if names == [INPUT] else "spkflow"
        if p.suffix == ".pt":
            if is_encoder_checkpoint(p):
                return "resemblyzer"
            raise InputError(p, None, "not a Resemblyzer (GE2E encoder) checkpoint: no 'model_state' with an LSTM")
        return "spkflow"
    if (p / "hyperparams.yaml").is_file():
        return "speechbrain"
    onnx = sorted(p.glob("*.onnx"))
    if (p / "config.yaml").is_file():
        cfg = _read_yaml(p / "config.yaml", p / "config.yaml")
        if isinstance(cfg, dict):
            if "dataset_args" in cfg and onnx:  # WeSpeaker's training config has a 'model' too
                return "wespeaker"
            if "encoder" in cfg:
                return "espnet"
            if "model" in cfg:
                return "spkflow"
    elif len(onnx) == 1:
        return "wespeaker"
    else:
        pts = sorted(p.glob("*.pt"))
        if len(pts) == 1 and is_encoder_checkpoint(pts[0]):
            return "resemblyzer"
    raise InputError(
        p,
        None,
        "cannot tell the toolkit of this model (spkflow: config.yaml with 'model' + model.pth; espnet: config.yaml "
        "with 'encoder' + *.pth; speechbrain: hyperparams.yaml + *.ckpt; wespeaker: *.onnx [+ config.yaml]; "
        "resemblyzer: one *.pt); give the toolkit",
    )


def inspect_model(path: str | os.PathLike[str], toolkit: str | None = None, *, jobs: bool = False) -> ModelInfo:
    """What ``path`` is (see the module doc), its toolkit told from the files unless ``toolkit``
    names it; a pack is verified and unpacked into the cache.  ``jobs``: for stage 5's extraction
    jobs, which refuse our ONNX export (it runs through the API and ``spkflow.bin.verify``)."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, None, f"model not found ({_KINDS})")
    if toolkit is not None and toolkit not in TOOLKITS:
        raise ValueError(f"toolkit must be one of {', '.join(TOOLKITS)}, got {toolkit!r}")
    try:
        kind = toolkit or detect_toolkit(p)
    except InputError:
        check_model_path(p)  # a packed/ folder instead of its zip: named, with a hint
        raise
    if kind != "spkflow":
        return ModelInfo(p, kind, "dir" if p.is_dir() else "file", p)
    check_model_path(p)
    if p.is_dir():
        _check_config(p / "config.yaml", p)
        return ModelInfo(p, kind, "dir", p)
    if p.suffix == ".onnx":
        if jobs:
            raise InputError(
                p,
                None,
                "an ONNX export of ours runs through the Python API and spkflow.bin.verify; stage 5's jobs need "
                "the model dir or its pack (.zip) (a WeSpeaker .onnx: --toolkit wespeaker)",
            )
        return ModelInfo(p, kind, "onnx", p)
    model_dir, packed = unpacked(p)
    _check_config(model_dir / "config.yaml", p)
    return ModelInfo(p, kind, "pack", model_dir, packed.meta)


def check_options(
    toolkit: str,
    *,
    model_file: str | os.PathLike[str] | None = None,
    feats_dir: str | os.PathLike[str] | None = None,
    fbank_on: str = "workers",
    dtype: str = "float32",
    trim_silences: bool | None = None,
) -> None:
    """``ValueError`` for an option ``toolkit``'s models cannot take (before anything is built)."""
    if trim_silences is not None and toolkit != "resemblyzer":
        raise ValueError(f"--trim-silences is for --toolkit resemblyzer (Resemblyzer's preprocess_wav), not {toolkit}")
    if feats_dir is not None and toolkit != "spkflow":
        raise ValueError(f"--feats-dir is for --toolkit spkflow; {toolkit} models read audio")
    if model_file is not None and toolkit in ("spkflow", "speechbrain", "resemblyzer"):
        raise ValueError(f"--model-file is for --toolkit espnet or wespeaker; a {toolkit} model dir names its files")
    if fbank_on == "device" and toolkit != "spkflow":
        raise ValueError(f"--fbank-on device is for --toolkit spkflow (a {toolkit} model computes its own frontend)")
    if toolkit == "wespeaker" and dtype != "float32":
        raise ValueError(f"--dtype {dtype}: a WeSpeaker ONNX graph runs in its own precision (float32 only)")


def open_embedder(
    path: str | os.PathLike[str] | ModelInfo,
    toolkit: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    *,
    jobs: bool = False,
    model_file: str | os.PathLike[str] | None = None,
    feats_dir: str | os.PathLike[str] | None = None,
    num_threads: int | None = None,
    fbank_on: str = "workers",
    trim_silences: bool | None = None,
) -> Embedder:
    """The model at ``path`` (or what :func:`inspect_model` said of it) on ``device`` in ``dtype``,
    behind stage 5's interface (:class:`~spkflow.embed.base.Embedder`; our ONNX export: the API's).

    ``model_file``: ESPnet / WeSpeaker weights when the dir has several; ``feats_dir``: stage-2
    features instead of audio (ours); ``num_threads``: onnxruntime's threads (WeSpeaker; torch's
    are the caller's); ``fbank_on``: where our models' frontend runs (:mod:`spkflow.embed.native`);
    ``trim_silences``: Resemblyzer's webrtcvad trimming (None: its default, on);
    ``jobs``: refuse what stage 5's jobs cannot run."""
    info = path if isinstance(path, ModelInfo) else inspect_model(path, toolkit, jobs=jobs)
    check_options(
        info.toolkit,
        model_file=model_file,
        feats_dir=feats_dir,
        fbank_on=fbank_on,
        dtype=dtype,
        trim_silences=trim_silences,
    )
    d = info.model_dir
    if info.kind == "onnx":
        return OnnxBackend(d, device)
    if info.toolkit == "espnet":
        return EspnetEmbedder(d, device, model_file=model_file, dtype=dtype)
    if info.toolkit == "speechbrain":
        return SpeechbrainEmbedder(d, device, dtype=dtype)
    if info.toolkit == "wespeaker":
        return WespeakerEmbedder(d, device, model_file=model_file, dtype=dtype, num_threads=num_threads)
    if info.toolkit == "resemblyzer":
        return ResemblyzerEmbedder(d, device, dtype=dtype, trim_silences=trim_silences is not False)
    try:
        return SpkflowEmbedder(d, device, feats_dir=feats_dir, dtype=dtype, fbank_on=fbank_on)
    except Exception as exc:  # a pack's: named by the pack, not by its unpacked copy
        if info.kind != "pack" or (isinstance(exc, RuntimeError) and "CUDA" in str(exc)):
            raise
        raise InputError(info.path, None, f"cannot load the packed model: {exc}") from None


def _read_yaml(path: Path, shown: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError(shown, None, f"not valid YAML: {exc}") from None


def _check_config(path: Path, shown: Path) -> None:
    """A spkflow config (a ``model`` section) at ``path``; errors name ``shown`` (a pack, not its copy)."""
    if not path.is_file():
        return  # check_model_path named a dir without one; a pack lists it in META
    cfg = _read_yaml(path, shown if shown.is_file() else path)
    if not isinstance(cfg, dict) or "model" not in cfg:
        hint = (
            " (an ESPnet speaker model? use extract_embeddings.sh --toolkit espnet)"
            if isinstance(cfg, dict) and "encoder" in cfg
            else ""
        )
        raise InputError(shown, None, f"not a spkflow model config: no 'model' section{hint}")
