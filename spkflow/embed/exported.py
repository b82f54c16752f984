"""Run an exported model (``python -m spkflow.bin.export``) with onnxruntime, without torch.

:class:`OnnxBackend` is what :func:`spkflow.embed.open.open_embedder` gives for an ``.onnx`` file of ours: the
frontend (fbank, VAD, mean normalisation) is rebuilt from the file's ``spkflow.frontend``
metadata and computed with numpy (:mod:`spkflow.features.fbank`), and the graph runs in onnxruntime.
Nothing here imports torch, so ``Embedder.from_pretrained("model.onnx")`` serves a process that
has only numpy, soundfile, scipy and onnxruntime.  The vectors equal the PyTorch model's within
the export's tolerance (1e-5 of the embedding's norm, checked when the file was written;
``test/deploy/test_export.py``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from spkflow.core.errors import InputError
from spkflow.embed.base import onnx_session
from spkflow.features.fbank import FbankOptions, VadOptions

__all__ = ["OnnxBackend"]

_FRAME_RATE = 100  # 10 ms frames: the unit of max_frames, as in stage 5


class OnnxBackend:
    """The backend interface of :class:`spkflow.api.Embedder` (``config``, ``model``, ``device``,
    ``dim``, ``fbank``, ``vad``, ``use_vad``, ``mean_norm``, ``frames``, ``embed``) on an ONNX file.
    ``model`` is the onnxruntime session.  Not a stage-5 model: it has no per-utterance input
    maker for the DataLoader workers (:func:`~spkflow.embed.open.inspect_model` refuses it for jobs)."""

    name = "spkflow"

    def __init__(self, path: str | os.PathLike[str], device: str = "cpu") -> None:

        p = Path(path)
        self.model = onnx_session(p, device)
        meta = self.model.get_modelmeta().custom_metadata_map
        if "spkflow.frontend" not in meta:
            raise InputError(
                p,
                None,
                "no spkflow.frontend metadata: not written by python -m spkflow.bin.export "
                "(a WeSpeaker export? use toolkit='wespeaker')",
            )
        try:
            fe = json.loads(meta["spkflow.frontend"])
            self.config = {"frontend": fe, "model": json.loads(meta.get("spkflow.model", "{}"))}
            self.fbank = FbankOptions.from_dict(dict(fe.get("fbank") or {}))
            vad_conf = fe.get("vad_conf")
            self.vad = VadOptions(**dict(vad_conf)) if isinstance(vad_conf, dict) else VadOptions()
            self.dim = int(meta["spkflow.embed_dim"])
        except (ValueError, TypeError, KeyError) as exc:
            raise InputError(p, None, f"bad spkflow metadata: {type(exc).__name__}: {exc}") from None
        self.sample_rate = int(self.fbank.sample_frequency)
        self.use_vad = bool(fe.get("vad", False))
        self.mean_norm = bool(fe.get("mean_norm", False))
        self.device = device
        self._per_frame = _FRAME_RATE / (1000.0 / float(self.fbank.frame_shift))

    def frames(self, x: np.ndarray) -> int:
        return max(1, int(math.ceil(x.shape[0] * self._per_frame)))

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        lengths = np.array([x.shape[0] for x in xs], dtype=np.int64)
        feats = np.zeros((len(xs), int(lengths.max()), xs[0].shape[1]), dtype=np.float32)
        for i, x in enumerate(xs):
            feats[i, : x.shape[0]] = x
        out = self.model.run(["embedding"], {"feats": feats, "lengths": lengths})[0]
        return np.asarray(out, dtype=np.float32)
