"""Resemblyzer's pretrained GE2E d-vector in stage 5: :class:`ResemblyzerEmbedder` and its frontend.

The model is Resemblyzer's ``VoiceEncoder`` (the speaker encoder of Wan et al. 2018, "Generalized
end-to-end loss for speaker verification": 40 mel bands, three LSTM layers of 256, a linear layer
with ReLU, L2-normalised; trained on ~8,000 speakers of LibriSpeech and VoxCeleb 1 and 2), its
weights a ``.pt`` checkpoint: ``pretrained.pt`` of the PyPI wheel ``resemblyzer`` (the model dir
may be the installed package's folder, or any folder or file holding that checkpoint; a
Real-Time-Voice-Cloning ``encoder.pt`` has the same layout).  The embedding is what a Resemblyzer
user gets from ``VoiceEncoder().embed_utterance(preprocess_wav(wav))``: the waveform at 16 kHz,
volume raised to -30 dBFS (never lowered), long silences cut by webrtcvad (``trim_long_silences``),
the (linear, not log) mel spectrogram of the zero-padded waveform cut into partials of 160 frames
(1.6 s) every 77 frames (``rate=1.3``; the last kept when it covers 75 %), each partial through the
LSTM, the partials' embeddings averaged and L2-normalised.  Every step is Resemblyzer's own code,
called in the DataLoader workers (``normalize_volume``, ``trim_long_silences``,
``wav_to_mel_spectrogram``, ``VoiceEncoder.compute_partial_slices``) or in the job
(``VoiceEncoder.forward``).

What it guarantees
------------------
* **Resemblyzer's numbers, batched = alone.**  Every partial of every utterance has exactly 160
  frames, so a batch is the partials of its utterances stacked, with no padding at all; each
  utterance's mean is taken over its own partials.  Embeddings equal ``embed_utterance(
  preprocess_wav(wav))`` of each utterance alone within 1e-5 (the order of float sums in the
  LSTM's matrix products; ``test/embed/test_embed_resemblyzer.py``, real speech).  Audio at
  another rate is resampled by spkflow's reader (as for every toolkit; Resemblyzer's
  ``preprocess_wav`` would use librosa's resampler).
* **Silence trimming is a choice, in the stamp.**  ``trim_silences=True`` (default) is
  ``preprocess_wav``: what a Resemblyzer user gets for an utterance.  ``False`` keeps the volume
  normalisation and embeds the whole audio: for windows of speech already found (diarization),
  where Resemblyzer's own demo trims the recording, never its windows.  ``False`` is part of the
  model stamp (a job dir is never half trimmed).
* **Named failures where Resemblyzer gives no embedding.**  Digital silence (its volume
  normalisation divides by a zero level: ``embed_utterance`` returns NaN) and, with trimming, an
  utterance in which webrtcvad finds no speech (Resemblyzer would embed the zero padding) fail by
  name, or are listed in ``bad_utts`` with ``--skip-bad true``.
* **Weights checked.**  The checkpoint is read with ``weights_only=True``; its ``model_state``
  must fit the encoder key for key and shape for shape (``VoiceEncoder`` itself loads with
  ``strict=False``, so a wrong file would run with random weights); only the GE2E loss's
  ``similarity_weight`` / ``similarity_bias`` are left out.
* Resemblyzer is an optional extra (``pip install '.[resemblyzer]'`` in the checkout); without it
  a clear error names the extra.  ``dtype`` bfloat16 / float16: the LSTM under ``torch.autocast``.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.core.errors import InputError
from spkflow.core.extras import install_hint
from spkflow.data.jobs import show_keys
from spkflow.embed.base import (
    ModelError,
    WavePreparer,
    autocast,
    autocast_dtype,
    model_files,
    model_stamp,
    resolve_device,
)
from spkflow.nnet.checkpoint import CheckpointError, load_checkpoint

__all__ = ["ResemblyzerEmbedder", "ResemblyzerFrontend", "is_encoder_checkpoint", "stamp_options", "TESTED_VERSION"]

log = logging.getLogger("spkflow.embed.run")

#: Resemblyzer's version this module was written against (the ``resemblyzer`` extra pins it)
TESTED_VERSION = "0.1.4"
#: ``embed_utterance``'s defaults: partials per second, and the share of a partial the last one
#: must cover to be kept
RATE, MIN_COVERAGE = 1.3, 0.75
#: keys of a checkpoint's ``model_state`` that belong to the GE2E loss, not to the encoder
LOSS_KEYS = ("similarity_weight", "similarity_bias")
_HINT = "copy pretrained.pt from the resemblyzer package again"


_RZ: Any = None


def _import(path: str | os.PathLike[str]) -> Any:
    """The ``resemblyzer`` package (its import warns about a scipy namespace: silenced), or a
    :class:`ModelError` naming ``path`` and the extra."""
    global _RZ
    if _RZ is not None:
        return _RZ
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import resemblyzer
            import resemblyzer.audio
            import resemblyzer.hparams
            import resemblyzer.voice_encoder
    except ImportError as exc:
        raise ModelError(
            Path(path), None, f"--toolkit resemblyzer needs Resemblyzer: {install_hint('resemblyzer')} ({exc})"
        ) from None
    _RZ = resemblyzer
    return resemblyzer


def is_encoder_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a torch checkpoint holding a GE2E speaker encoder's ``model_state``
    (Resemblyzer's ``pretrained.pt``, Real-Time-Voice-Cloning's ``encoder.pt``); read with
    ``weights_only=True``, no model built."""
    try:
        state = load_checkpoint(path).get("model_state")
    except CheckpointError:
        return False
    return isinstance(state, dict) and "lstm.weight_ih_l0" in state and "linear.weight" in state


def stamp_options(trim_silences: bool) -> tuple[str, ...]:
    """What the stamp adds for the options: nothing for the default (trimming)."""
    return () if trim_silences else ("trim_silences=false",)


class ResemblyzerFrontend:
    """A waveform at 16 kHz -> its partials' mel spectrograms ``[P * 160, 40]`` float32, by
    Resemblyzer's own functions, as ``preprocess_wav`` + ``embed_utterance`` compute them.
    Picklable (Resemblyzer is imported in the worker); a ValueError names what cannot be
    embedded."""

    def __init__(self, trim_silences: bool = True) -> None:
        self.trim_silences = trim_silences

    def __call__(self, wave: np.ndarray) -> np.ndarray:
        rz = _import("resemblyzer")
        hp = rz.hparams
        wav = np.asarray(wave, dtype=np.float32)
        if not np.any(wav):
            raise ValueError(
                "digital silence (no sample differs from 0): Resemblyzer's volume normalisation is undefined (NaN)"
            )
        wav = rz.audio.normalize_volume(wav, hp.audio_norm_target_dBFS, increase_only=True)
        if self.trim_silences:
            wav = rz.audio.trim_long_silences(wav)
            if wav.shape[0] == 0:
                raise ValueError(
                    "webrtcvad found no speech in it (Resemblyzer would embed silence); "
                    "--trim-silences false embeds it whole"
                )
        wav_slices, mel_slices = rz.voice_encoder.VoiceEncoder.compute_partial_slices(wav.shape[0], RATE, MIN_COVERAGE)
        end = wav_slices[-1].stop
        if end >= wav.shape[0]:
            wav = np.pad(wav, (0, end - wav.shape[0]), "constant")
        mel = rz.audio.wav_to_mel_spectrogram(wav)
        return np.ascontiguousarray(np.concatenate([mel[s] for s in mel_slices]), dtype=np.float32)


class ResemblyzerEmbedder:
    """Resemblyzer's ``VoiceEncoder`` with the weights of ``model_dir`` (a ``.pt`` checkpoint, or
    the folder holding it), run batched (see the module doc)."""

    name = "resemblyzer"

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        device: str = "cpu",
        dtype: str = "float32",
        *,
        trim_silences: bool = True,
    ) -> None:
        import torch

        self.model_path = model_files(self.name, model_dir)[0]
        self.device = resolve_device(device)
        self.dtype = dtype
        self._autocast = autocast_dtype(dtype, self.device)
        rz = _import(self.model_path)
        version = getattr(rz, "__version__", None) or _dist_version()
        if version != TESTED_VERSION:
            log.warning("Resemblyzer %s: spkflow is tested with %s", version, TESTED_VERSION)
        hp = rz.hparams
        self.sample_rate = int(hp.sampling_rate)
        self.partial_frames = int(hp.partials_n_frames)
        self.n_mels = int(hp.mel_n_channels)
        state = self._checked_state(load_checkpoint(self.model_path, hint=_HINT), rz)
        with warnings.catch_warnings():  # it loads the same file again (torch's default: weights_only)
            warnings.simplefilter("ignore", FutureWarning)
            model = rz.voice_encoder.VoiceEncoder(self.device, verbose=False, weights_fpath=self.model_path)
        model.load_state_dict(state, strict=True)  # exactly the checked tensors
        self.model = model.eval()
        self.dim = int(model.linear.out_features)
        self.trim_silences = trim_silences
        self.frontend = ResemblyzerFrontend(trim_silences)
        self.config: dict[str, Any] = {"weights": os.fspath(self.model_path), "trim_silences": trim_silences}
        self.stamp = " ".join([model_stamp(self.name, self.model_path, dtype=dtype), *stamp_options(trim_silences)])
        self._torch = torch

    def _checked_state(self, ckpt: dict[str, Any], rz: Any) -> dict[str, Any]:
        """The encoder's tensors of ``ckpt['model_state']``, which must fit it key for key."""
        state = ckpt.get("model_state")
        if not isinstance(state, dict):
            raise InputError(self.model_path, None, "not a Resemblyzer encoder checkpoint: no 'model_state'")
        hp = rz.hparams
        own = {  # the encoder's shapes, from Resemblyzer's hyperparameters (nothing built yet)
            **{
                f"lstm.{kind}_l{i}": shape
                for i in range(hp.model_num_layers)
                for kind, shape in (
                    ("weight_ih", (4 * hp.model_hidden_size, hp.mel_n_channels if i == 0 else hp.model_hidden_size)),
                    ("weight_hh", (4 * hp.model_hidden_size, hp.model_hidden_size)),
                    ("bias_ih", (4 * hp.model_hidden_size,)),
                    ("bias_hh", (4 * hp.model_hidden_size,)),
                )
            },
            "linear.weight": (hp.model_embedding_size, hp.model_hidden_size),
            "linear.bias": (hp.model_embedding_size,),
        }
        bad = [f"missing {k}" for k in own if k not in state]
        bad += [f"unexpected {k}" for k in state if k not in own and k not in LOSS_KEYS]
        bad += [
            f"{k} {tuple(state[k].shape)} vs {shape}"
            for k, shape in own.items()
            if k in state and tuple(getattr(state[k], "shape", ())) != shape
        ]
        if bad:
            raise InputError(self.model_path, None, f"weights do not fit Resemblyzer's encoder: {show_keys(bad, 8)}")
        return {k: state[k] for k in own}

    # ------------------------------------------------------------------ the interface
    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]:
        return WavePreparer(os.fspath(data_dir), self.sample_rate, self.frontend)

    def prepare_wave(self, wave: np.ndarray) -> np.ndarray:
        return self.frontend(np.asarray(wave, dtype=np.float32))

    def frames(self, x: np.ndarray) -> int:
        """The 10 ms frames the LSTM runs: 160 per partial."""
        return max(1, int(x.shape[0]))

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        """Every partial of ``xs`` in one forward; each utterance's partial embeddings averaged and
        L2-normalised as ``embed_utterance`` does (numpy, float32) -> [N, dim]."""
        torch = self._torch
        parts = [x.reshape(-1, self.partial_frames, self.n_mels) for x in xs]
        with torch.inference_mode(), autocast(self.device, self._autocast):
            mels = torch.from_numpy(np.concatenate(parts)).to(self.device)
            partial = self.model(mels).float().cpu().numpy()
        out = np.zeros((len(xs), self.dim), dtype=np.float32)
        start = 0
        for i, p in enumerate(parts):
            raw = np.mean(partial[start : start + p.shape[0]], axis=0)
            out[i] = raw / np.linalg.norm(raw, 2)
            start += p.shape[0]
        return out


def _dist_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("resemblyzer")
    except PackageNotFoundError:
        return None
