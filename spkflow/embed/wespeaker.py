"""WeSpeaker's exported ONNX models in stage 5: :class:`WespeakerEmbedder` and its frontend.

The model is what ``wespeaker/bin/export_onnx.py`` writes (and WeSpeaker's runtime hub serves):
an ONNX graph with input ``feats`` [B, T, 80] and output ``embs`` [B, D].  Its frontend is WeSpeaker
runtime's contract (``wespeakerruntime.Speaker``): the waveform at 16 kHz scaled to the 16-bit
range, Kaldi fbank through ``torchaudio.compliance.kaldi.fbank`` (80 bins, 25 ms / 10 ms, hamming
window, no dither, no energy), mean-normalised per utterance (CMN without CVN).

What it guarantees
------------------
* **WeSpeaker's numbers.**  The features are computed by the very call WeSpeaker's runtime and
  its training data pipeline make (float32 torchaudio; spkflow's own float64 fbank differs by up
  to 1e-2 on quiet frames' lowest bins, enough to move an embedding by more than 1e-4), in
  DataLoader workers; the graph runs in onnxruntime.  Embeddings equal
  ``wespeakerruntime.Speaker.extract_embedding`` within 1e-4 after L2 normalisation
  (``test/embed/test_embed_wespeaker.py``, real speech).  Audio at other rates is resampled to
  the model's rate first (WeSpeaker's runtime resamples but then computes the fbank with the
  *original* rate's frame sizes; we do not copy that).
* **Settings checked.**  The frontend comes from the model dir's ``config.yaml`` when there is one
  (WeSpeaker's training config: ``dataset_args.resample_rate``, ``dataset_args.fbank_args`` and
  ``model_args.feat_dim``; only fbank features), else WeSpeaker's runtime defaults above; the
  graph must have WeSpeaker's ``feats`` input ([B, T, F], F equal to the mel bins when the graph
  fixes it) and ``embs`` output, or the error names both files.  The settings are part of the
  model stamp (``config.yaml`` is hashed with the graph).
* **Batches without padding.**  WeSpeaker's graphs take no lengths and pool over every frame
  (ResNet + TSTP), so padding would change the embeddings and an ONNX graph cannot be hooked:
  utterances of equal frame count run together, others one at a time (``onnxruntime`` with the
  job's thread count).  Only float32 (the graph's precision).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.embed.base import (
    FRAME_RATE,
    ModelError,
    WavePreparer,
    equal_length_groups,
    model_files,
    model_stamp,
    onnx_session,
    resolve_device,
)

__all__ = ["WespeakerEmbedder", "WespeakerFrontend", "INPUT", "OUTPUT"]

log = logging.getLogger("spkflow.embed.run")

#: the input and output names of WeSpeaker's exported graphs (wespeaker/bin/export_onnx.py)
INPUT, OUTPUT = "feats", "embs"


@dataclasses.dataclass(frozen=True)
class WespeakerFrontend:
    """WeSpeaker's inference frontend; picklable, run in the workers: a waveform in [-1, 1] at
    ``sample_rate`` -> fbank [T, num_mel_bins] float32, mean-normalised when ``cmn``."""

    sample_rate: int = 16000
    num_mel_bins: int = 80
    frame_length: float = 25.0
    frame_shift: float = 10.0
    cmn: bool = True

    @classmethod
    def from_config(cls, path: Path) -> WespeakerFrontend:
        """From WeSpeaker's training ``config.yaml`` (``dataset_args``); a ModelError names the
        file when the features are not fbank or the settings are inconsistent."""
        import yaml

        try:
            cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ModelError(path, None, f"not valid YAML: {exc}") from None
        if not isinstance(cfg, dict):
            raise ModelError(path, None, "not a WeSpeaker config (a mapping with dataset_args)")
        data = cfg.get("dataset_args") or {}
        feat_type = data.get("feat_type", "fbank")
        if feat_type != "fbank":
            raise ModelError(path, None, f"dataset_args.feat_type is {feat_type!r}: only fbank models are supported")
        fb = data.get("fbank_args") or {}
        try:
            out = cls(
                sample_rate=int(data.get("resample_rate", 16000)),
                num_mel_bins=int(fb.get("num_mel_bins", 80)),
                frame_length=float(fb.get("frame_length", 25)),
                frame_shift=float(fb.get("frame_shift", 10)),
            )
        except (TypeError, ValueError) as exc:
            raise ModelError(path, None, f"bad dataset_args: {exc}") from None
        feat_dim = (cfg.get("model_args") or {}).get("feat_dim")
        if feat_dim is not None and int(feat_dim) != out.num_mel_bins:
            raise ModelError(
                path, None, f"model_args.feat_dim {feat_dim} differs from fbank_args.num_mel_bins {out.num_mel_bins}"
            )
        return out

    def __call__(self, wave: np.ndarray) -> np.ndarray:
        import torch
        import torchaudio.compliance.kaldi as kaldi

        x = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))[None] * (1 << 15)
        if x.shape[1] < int(self.sample_rate * self.frame_length / 1000):
            raise ValueError(f"{x.shape[1]} samples is shorter than one {self.frame_length:g} ms frame")
        feats = kaldi.fbank(
            x,
            num_mel_bins=self.num_mel_bins,
            frame_length=self.frame_length,
            frame_shift=self.frame_shift,
            dither=0.0,
            sample_frequency=self.sample_rate,
            window_type="hamming",
            use_energy=False,
        ).numpy()
        if self.cmn:
            feats = feats - np.mean(feats, axis=0)
        return np.ascontiguousarray(feats, dtype=np.float32)


class WespeakerEmbedder:
    """A WeSpeaker ONNX model (see the module doc): ``model_dir`` holds the ``.onnx`` (or is it)
    and, optionally, WeSpeaker's ``config.yaml``."""

    name = "wespeaker"

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        device: str = "cpu",
        model_file: str | os.PathLike[str] | None = None,
        dtype: str = "float32",
        num_threads: int | None = None,
    ) -> None:
        if dtype != "float32":
            raise ValueError(f"--dtype {dtype}: a WeSpeaker ONNX graph runs in its own precision (float32 only)")
        files = model_files(self.name, model_dir, model_file)
        self.model_path = files[-1]
        self.config_path = files[0] if len(files) > 1 else None
        self.frontend = (
            WespeakerFrontend.from_config(self.config_path) if self.config_path is not None else WespeakerFrontend()
        )
        self.device = resolve_device(device)
        self.model = onnx_session(self.model_path, self.device, num_threads)
        self.config: dict[str, Any] = {"frontend": dataclasses.asdict(self.frontend)}
        self.sample_rate = self.frontend.sample_rate
        self.dim = self._check_graph()
        self.stamp = model_stamp(self.name, *files)
        self._per_frame = FRAME_RATE / (1000.0 / self.frontend.frame_shift)

    def _check_graph(self) -> int:
        """WeSpeaker's names and a feature size that fits the frontend; returns the embedding size."""
        ins = {i.name: i for i in self.model.get_inputs()}
        outs = {o.name: o for o in self.model.get_outputs()}
        shown = f"{self.model_path}" + (f" (frontend from {self.config_path})" if self.config_path else "")
        if set(ins) != {INPUT} or OUTPUT not in outs:
            hint = " (a spkflow export? use --toolkit spkflow)" if "lengths" in ins else ""
            raise ModelError(
                self.model_path,
                None,
                f"not a WeSpeaker graph: inputs {sorted(ins)}, outputs {sorted(outs)}; "
                f"expected input '{INPUT}' [B, T, F] and output '{OUTPUT}'{hint}",
            )
        shape = ins[INPUT].shape
        if len(shape) != 3:
            raise ModelError(self.model_path, None, f"input '{INPUT}' has shape {shape}, expected [B, T, F]")
        if isinstance(shape[2], int) and shape[2] != self.frontend.num_mel_bins:
            raise ModelError(
                self.model_path,
                None,
                f"input '{INPUT}' takes {shape[2]}-dim features but the frontend makes "
                f"{self.frontend.num_mel_bins} mel bins: {shown}",
            )
        dim = outs[OUTPUT].shape[-1]
        if isinstance(dim, int):
            return dim
        probe = self.frontend(np.zeros(self.sample_rate, dtype=np.float32))
        return int(self._run(probe[None]).shape[-1])

    def _run(self, feats: np.ndarray) -> np.ndarray:
        out = self.model.run([OUTPUT], {INPUT: feats})[0]
        return np.asarray(out, dtype=np.float32).reshape(feats.shape[0], -1)

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]:
        return WavePreparer(os.fspath(data_dir), self.sample_rate, self.frontend)

    def prepare_wave(self, wave: np.ndarray) -> np.ndarray:
        return self.frontend(wave)

    def frames(self, x: np.ndarray) -> int:
        return max(1, int(math.ceil(x.shape[0] * self._per_frame)))

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        out = np.zeros((len(xs), self.dim), dtype=np.float32)
        for group in equal_length_groups([x.shape[0] for x in xs]):
            out[group] = self._run(np.stack([xs[i] for i in group]))
        return out
