"""Stage 5: speaker embeddings of a data dir from any supported model, in parallel batched jobs.

``base`` holds the interface every model runs through (:class:`~spkflow.embed.base.Embedder`),
the model files and stamp, and the length-bounded batch planning; ``masking`` makes encoders that
take no lengths blind to a batch's padding; one module per toolkit runs its models: ``native``
spkflow's own, ``espnet`` ESPnet's speaker models, ``speechbrain`` SpeechBrain's pretrained
folders, ``wespeaker`` WeSpeaker's ONNX exports; ``run`` is one job of stage 5 (resumable,
sorted, aligned outputs) and the merge.  :func:`load_embedder` picks the model's adapter by
toolkit, :func:`detect_toolkit` tells the toolkit from the files.

May import: ``core``, ``data``, ``features``, ``nnet``.
"""

from __future__ import annotations

import os
from pathlib import Path

from spkflow.core.errors import InputError
from spkflow.embed.base import TOOLKITS, Embedder
from spkflow.embed.espnet import EspnetEmbedder
from spkflow.embed.native import SpkflowEmbedder
from spkflow.embed.speechbrain import SpeechbrainEmbedder
from spkflow.embed.wespeaker import INPUT, WespeakerEmbedder

__all__ = ["load_embedder", "detect_toolkit", "TOOLKITS"]


def load_embedder(
    toolkit: str,
    model_dir: str | os.PathLike[str],
    device: str = "cpu",
    model_file: str | os.PathLike[str] | None = None,
    feats_dir: str | os.PathLike[str] | None = None,
    dtype: str = "float32",
    num_threads: int | None = None,
    fbank_on: str = "workers",
) -> Embedder:
    """The model of ``model_dir`` run by ``toolkit``'s adapter (:data:`TOOLKITS`):

    ``spkflow`` a stage-4 model dir; ``espnet`` an ESPnet speaker model dir (``model_file``: its
    weights when there are several); ``speechbrain`` a SpeechBrain pretrained folder; ``wespeaker``
    a WeSpeaker ONNX model (a dir with the ``.onnx`` and optionally its ``config.yaml``, or the
    ``.onnx`` itself).  ``feats_dir`` (stage-2 features) is for spkflow models only;
    ``num_threads``: onnxruntime's threads (WeSpeaker; torch's are set by the caller); ``fbank_on``:
    where a spkflow model's frontend runs (:mod:`spkflow.embed.native`; the others compute their own)."""
    if feats_dir is not None and toolkit != "spkflow":
        raise ValueError(f"--feats-dir is for --toolkit spkflow; {toolkit} models read audio")
    if model_file is not None and toolkit in ("spkflow", "speechbrain"):
        raise ValueError(f"--model-file is for --toolkit espnet or wespeaker; a {toolkit} model dir names its files")
    if fbank_on == "device" and toolkit != "spkflow":
        raise ValueError(f"--fbank-on device is for --toolkit spkflow (a {toolkit} model computes its own frontend)")
    if toolkit == "spkflow":
        return SpkflowEmbedder(model_dir, device, feats_dir=feats_dir, dtype=dtype, fbank_on=fbank_on)
    if toolkit == "espnet":
        return EspnetEmbedder(model_dir, device, model_file=model_file, dtype=dtype)
    if toolkit == "speechbrain":
        return SpeechbrainEmbedder(model_dir, device, dtype=dtype)
    if toolkit == "wespeaker":
        return WespeakerEmbedder(model_dir, device, model_file=model_file, dtype=dtype, num_threads=num_threads)
    raise ValueError(f"--toolkit must be one of {', '.join(TOOLKITS)}, got {toolkit!r}")


def detect_toolkit(path: str | os.PathLike[str]) -> str:
    """The toolkit whose model ``path`` is, from its files (no model is built):

    * a ``.onnx`` file: ``wespeaker`` when its only input is ``feats``, else ``spkflow`` (an export
      of ``python -m spkflow.bin.export``, inputs ``feats`` and ``lengths``);
    * a dir with ``hyperparams.yaml``: ``speechbrain``;
    * a dir with ``config.yaml``: ``wespeaker`` when it has ``dataset_args`` beside an ``.onnx``,
      ``espnet`` when it has an ``encoder``, ``spkflow`` when it has a ``model`` section;
    * a dir with one ``.onnx`` and no config: ``wespeaker``;
    * any other file: ``spkflow`` (a packed model, ``python -m spkflow.bin.pack``).

    Raises :class:`InputError` naming the path when none fits."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise InputError(p, None, "model not found")
    if p.is_file():
        if p.suffix == ".onnx":
            from spkflow.embed.base import onnx_session

            names = [i.name for i in onnx_session(p).get_inputs()]
            return "wespeaker" if names == [INPUT] else "spkflow"
        return "spkflow"
    if (p / "hyperparams.yaml").is_file():
        return "speechbrain"
    onnx = sorted(p.glob("*.onnx"))
    if (p / "config.yaml").is_file():
        try:
            cfg = yaml.safe_load((p / "config.yaml").read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise InputError(p / "config.yaml", None, f"not valid YAML: {exc}") from None
        if isinstance(cfg, dict):
            if "dataset_args" in cfg and onnx:  # WeSpeaker's training config has a 'model' too
                return "wespeaker"
            if "encoder" in cfg:
                return "espnet"
            if "model" in cfg:
                return "spkflow"
    elif len(onnx) == 1:
        return "wespeaker"
    raise InputError(
        p,
        None,
        "cannot tell the toolkit of this model (spkflow: config.yaml with 'model' + model.pth; espnet: config.yaml "
        "with 'encoder' + *.pth; speechbrain: hyperparams.yaml + *.ckpt; wespeaker: *.onnx [+ config.yaml]); "
        "give the toolkit",
    )
