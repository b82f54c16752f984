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
                 (:mod:`spkflow.score.model_scoring`); ``Embedder.verify`` and ``spkflow.bin.verify``
                 score with it, a pack without it scores plain cosine
``meta.yaml``    format name and version, versions of spkflow and torch, and the sha256 and
                 size of every other member

What it guarantees
------------------
* **A pack is a model dir.**  ``unzip FILE -d DIR`` gives a directory that every spkflow tool
  takes as ``--model-dir``, and every tool takes the pack itself: :mod:`spkflow.embed.packed`
  verifies it and unpacks it once (the reading side lives there, beside the other model kinds).  Members are the
  model dir's own files, so nothing in the pack needs spkflow to be read (``unzip -p FILE
  README.md``).
* **Only sound models are packed.**  The weights are loaded into the model the config describes
  (strict key and shape check) before anything is written; a training checkpoint is reduced to
  its model weights; the scoring is loaded and must fit the embedding dimension, and its name
  (``WCCN, AS-norm (top 25)``) must be one RESULTS.md reports, so that the model card, the
  results and what the pack scores with agree.  The file appears atomically (:mod:`spkflow.core.atomic`).
* **Corruption is caught, by name**, on opening (:func:`spkflow.embed.packed.read_packed`: zip
  structure, format, each member's sha256 against ``meta.yaml``).

Why a zip and not one torch or npz file: the members stay ordinary files (readable, diffable,
the same names as in a model dir, so the shell scripts need no new loader), any language can
list and extract them, and the weights inside keep torch's own safe format.  ESPnet's
``pack`` (``espnet2/main_funcs/pack_funcs.py``) also writes a zip with a ``meta.yaml``, but
stores the training paths inside the configs (rewritten on unpack), records no checksums, and
does not check that the weights fit the config.
"""

from __future__ import annotations

import datetime
import io
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from spkflow.core.atomic import atomic_write
from spkflow.core.checks import ConfigError
from spkflow.core.errors import InputError
from spkflow.core.version import __version__
from spkflow.embed.packed import FORMAT, FORMAT_VERSION, META, sha256
from spkflow.features.fbank import FbankOptions
from spkflow.features.vad import VadOptions
from spkflow.score.model_scoring import SCORING_FILES, Scoring

__all__ = ["pack_model"]


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
        f"- **Weights**: `model.pth`, sha256 `{sha256(files['model.pth'])}`.",
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
        "files": {k: {"sha256": sha256(v), "size": len(v)} for k, v in files.items()},
    }
    with atomic_write(out, "wb", encoding=None) as f, zipfile.ZipFile(f, "w") as z:
        z.writestr(META, yaml.safe_dump(meta, sort_keys=False), compress_type=zipfile.ZIP_DEFLATED)
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
