"""ESPnet speaker models in stage 5: :class:`EspnetEmbedder` and :class:`PaddingMask`.

What it guarantees
------------------
* **Batched = alone.**  ESPnet's speaker models do not honour lengths (below), so a zero-padded
  batch would change every embedding but the longest one's.  :class:`EspnetEmbedder` runs
  ESPnet's frontend one utterance at a time and the encoder under :class:`PaddingMask` (which
  makes convolutions, max pooling and the SE squeeze blind to padding), or one utterance at a
  time when the encoder has a layer whose padding behaviour we cannot control; it reproduces
  ESPnet's single-utterance numbers (identical in ``test/embed/test_embed_espnet.py``).
* **Weights that fit.**  Built with ``SpeakerTask.build_model`` from the config, weights loaded
  with ``weights_only=True`` (a truncated or code-holding file is refused naming it); every key
  other than the training loss's must match in name and shape.

What ESPnet does with lengths (espnet 202511, read for this module)
-------------------------------------------------------------------
``ESPnetSpeakerModel.forward(speech, speech_lengths)`` passes the lengths to the frontend and
from the frontend to the pooling, never to the encoder.  ``DefaultFrontend`` (STFT) masks
padded frames and returns true frame counts; ``MelSpectrogramTorch`` (the frontend of ESPnet's
ECAPA/x-vector speaker recipes) ignores the lengths, returns the *padded* length for every row
and its ``normalize: mn`` subtracts a mean taken over the padding too.  The encoders
(``ecapa_tdnn``, ``xvector``, ``rawnet3``, ...) take no lengths: their convolutions read padded
frames and the SE / AFMS blocks average over them.  So a zero-padded batch changes every
embedding but the longest one's (``test/embed/test_embed_espnet.py``: L2-normalised differences above
0.01 for a tiny ECAPA).  The pooling gets the *frontend's* frame count even when the encoder
shortens the time axis (``xvector``: 6 frames fewer), so ESPnet's statistics divide by a count
a little larger than the frames summed; :class:`EspnetEmbedder` reproduces ESPnet's
single-utterance numbers (identical in the tests), it does not correct them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.core.errors import InputError
from spkflow.data.audio import AudioReader
from spkflow.data.jobs import show_keys
from spkflow.embed.base import FRAME_RATE, check_model_dir, model_stamp, resolve_device
from spkflow.nnet.checkpoint import load_checkpoint

__all__ = ["EspnetEmbedder", "PaddingMask"]

log = logging.getLogger("spkflow.embed.run")


class _WavePreparer:
    """Audio at the model's rate, in a worker (ESPnet models take waveforms)."""

    def __init__(self, data_dir: str, sample_rate: int) -> None:
        self.data_dir, self.sample_rate = data_dir, sample_rate
        self._reader: Any = None

    def __call__(self, utt: str) -> np.ndarray:
        if self._reader is None:
            self._reader = AudioReader(self.data_dir, sample_rate=self.sample_rate)
        return self._reader.read(utt)


class _Untracked(RuntimeError):
    """A layer saw a time axis whose valid lengths are unknown (or ambiguous)."""


class PaddingMask:
    """Forward hooks that make a convolutional ESPnet encoder blind to padding.

    While :meth:`active` is in force with the valid lengths of a zero-padded batch, every
    ``Conv1d`` sees its padded frames set to zero (what its own zero padding gives an utterance
    alone), every ``MaxPool1d`` sees ``-inf`` there, and every ``AdaptiveAvgPool1d(1)`` (the SE
    squeeze) averages valid frames only.  Valid lengths are followed through the layers by
    the size of the time axis (a strided or unpadded convolution shortens it), so after the
    encoder :meth:`lengths` gives the valid frames of its output for the pooling.

    Only encoders made of layers listed in :data:`SAFE_LAYERS` and of ESPnet blocks whose
    ``forward`` combines sub-layer outputs frame by frame (:data:`SAFE_BLOCKS`: ECAPA-TDNN and
    x-vector) are accepted (:meth:`supports`); others (RawNet3 calls ``F.adaptive_avg_pool1d``
    directly, conformers and ResNets mix time otherwise) are run one utterance at a time by
    :class:`EspnetEmbedder`.  Outside :meth:`active` the hooks do nothing.
    """

    SAFE_BLOCKS = frozenset(
        {
            "espnet2.spk.encoder.ecapa_tdnn_encoder.EcapaTdnnEncoder",
            "espnet2.spk.layers.ecapa_block.EcapaBlock",
            "espnet2.spk.layers.ecapa_block.SEModule",
            "espnet2.spk.encoder.xvector_encoder.XvectorEncoder",
        }
    )

    def __init__(self, encoder: Any) -> None:
        import torch

        self._torch = torch
        self._lengths: dict[int, Any] | None = None
        ok, why = self.supports(encoder)
        if not ok:
            raise ValueError(why)
        nn = torch.nn
        for mod in encoder.modules():
            if isinstance(mod, (nn.Conv1d, nn.MaxPool1d)):
                mod.register_forward_pre_hook(self._mask_before)
                mod.register_forward_hook(self._track_after)
            elif isinstance(mod, nn.AdaptiveAvgPool1d):
                mod.register_forward_hook(self._masked_mean)

    @classmethod
    def safe_layers(cls) -> tuple[type, ...]:
        import torch.nn as nn

        return (
            nn.Conv1d,
            nn.BatchNorm1d,
            nn.ReLU,
            nn.LeakyReLU,
            nn.PReLU,
            nn.SiLU,
            nn.GELU,
            nn.ELU,
            nn.Sigmoid,
            nn.Tanh,
            nn.Identity,
            nn.Dropout,
            nn.Sequential,
            nn.ModuleList,
            nn.AdaptiveAvgPool1d,
            nn.MaxPool1d,
        )

    @classmethod
    def supports(cls, encoder: Any) -> tuple[bool, str]:
        """(True, "") when every sub-module is understood; else (False, the first that is not)."""
        import torch.nn as nn

        safe = cls.safe_layers()
        for name, mod in encoder.named_modules():
            qual = f"{type(mod).__module__}.{type(mod).__qualname__}"
            if qual in cls.SAFE_BLOCKS:
                continue
            if type(mod) not in safe:
                return False, f"layer '{name or '<encoder>'}' ({qual}) may mix padded frames into valid ones"
            if isinstance(mod, nn.Conv1d) and mod.padding_mode != "zeros":
                return False, f"layer '{name}' pads with {mod.padding_mode!r}, not zeros"
            if isinstance(mod, nn.AdaptiveAvgPool1d) and mod.output_size not in (1, (1,)):
                return False, f"layer '{name}' pools to {mod.output_size} frames (only 1 is handled)"
        return True, ""

    @contextlib.contextmanager
    def active(self, lengths: Any, max_len: int) -> Iterator[PaddingMask]:
        """Hooks on for one forward of a batch padded to ``max_len`` with valid ``lengths``."""
        self._lengths = {int(max_len): lengths}
        try:
            yield self
        finally:
            self._lengths = None

    def lengths(self, time_size: int) -> Any:
        """Valid lengths of a tensor whose time axis has ``time_size`` frames."""
        assert self._lengths is not None
        if time_size not in self._lengths:
            raise _Untracked(f"no lengths known for a time axis of {time_size} frames")
        return self._lengths[time_size]

    def _put(self, time_size: int, lengths: Any) -> None:
        assert self._lengths is not None
        prev = self._lengths.get(time_size)
        if prev is not None and not bool(self._torch.equal(prev, lengths)):
            raise _Untracked(f"two different length sets for a time axis of {time_size} frames")
        self._lengths[time_size] = lengths

    def _mask_before(self, mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if self._lengths is None:
            return None
        x = args[0]
        t = x.shape[-1]
        lens = self.lengths(t)
        if bool((lens >= t).all()):
            return None
        valid = self._torch.arange(t, device=x.device)[None, None, :] < lens.to(x.device)[:, None, None]
        fill = 0.0 if isinstance(mod, self._torch.nn.Conv1d) else float("-inf")
        return (x.masked_fill(~valid, fill), *args[1:])

    def _track_after(self, mod: Any, args: tuple[Any, ...], out: Any) -> None:
        if self._lengths is None:
            return
        lens = self.lengths(args[0].shape[-1])
        nn = self._torch.nn

        def one(v: Any) -> int:
            return int(v[0]) if isinstance(v, (tuple, list)) else int(v)

        k, s, d = one(mod.kernel_size), one(mod.stride), one(mod.dilation)
        if isinstance(mod, nn.Conv1d) and isinstance(mod.padding, str):
            p = (d * (k - 1)) // 2 if mod.padding == "same" else 0
            new = lens.clone() if mod.padding == "same" else (lens - d * (k - 1) - 1) // s + 1
        else:
            p = one(mod.padding)
            span = lens + 2 * p - d * (k - 1) - 1
            if isinstance(mod, nn.MaxPool1d) and mod.ceil_mode:
                new = -((-span) // s) + 1
            else:
                new = span // s + 1
        self._put(out.shape[-1], new.clamp(min=0, max=out.shape[-1]))

    def _masked_mean(self, mod: Any, args: tuple[Any, ...], out: Any) -> Any:
        if self._lengths is None:
            return None
        x = args[0]
        t = x.shape[-1]
        lens = self.lengths(t).to(x.device)
        self._put(1, self._torch.ones_like(lens))
        if bool((lens >= t).all()):
            return None
        valid = (self._torch.arange(t, device=x.device)[None, None, :] < lens[:, None, None]).to(x.dtype)
        return (x * valid).sum(dim=-1, keepdim=True) / lens.clamp(min=1).to(x.dtype)[:, None, None]


class EspnetEmbedder:
    """An ESPnet speaker model (``config.yaml`` + ``*.pth`` of ``espnet2/bin/spk_train.py``).

    Built with ``espnet2.tasks.spk.SpeakerTask.build_model`` from the config (so every ESPnet
    frontend/encoder/pooling/projector works), weights loaded with ``weights_only=True``; keys
    other than the training loss's must all match.  Inputs are waveforms at the frontend's
    ``fs`` (16 kHz unless the config says otherwise).  A batch runs ESPnet's frontend and
    normalisation one utterance at a time (they are cheap, and ``MelSpectrogramTorch`` ignores
    lengths), pads the features, runs the encoder under :class:`PaddingMask` and pools with the
    valid lengths.  Encoders :class:`PaddingMask` does not support run one utterance at a time.
    """

    name = "espnet"

    def __init__(
        self, model_dir: str | os.PathLike[str], device: str = "cpu", model_file: str | os.PathLike[str] | None = None
    ) -> None:
        import torch
        import yaml

        d = check_model_dir(model_dir)
        self.config_path = d / "config.yaml"
        self.model_path = self._model_file(d, model_file)
        self.device = resolve_device(device)
        with open(self.config_path, encoding="utf-8") as f:
            args = yaml.safe_load(f)
        if not isinstance(args, dict) or "encoder" not in args:
            raise InputError(self.config_path, None, "not an ESPnet speaker config (no 'encoder')")
        from espnet2.tasks.spk import SpeakerTask

        model = SpeakerTask.build_model(argparse.Namespace(**args))
        state = load_checkpoint(self.model_path, hint="copy the model file again")  # names a bad file
        if isinstance(state, dict) and isinstance(state.get("model"), dict):
            state = state["model"]
        if not isinstance(state, Mapping):
            raise InputError(self.model_path, None, f"not a state dict (got {type(state).__name__})")
        own = model.state_dict()
        shapes = [
            f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
            for k, v in state.items()
            if k in own and not k.startswith("loss.") and hasattr(v, "shape") and v.shape != own[k].shape
        ]
        if shapes:
            raise InputError(
                self.model_path, None, f"weights do not fit {self.config_path}: size mismatch {show_keys(shapes, 3)}"
            )
        state = {k: v for k, v in state.items() if not (k in own and hasattr(v, "shape") and v.shape != own[k].shape)}
        missing, unexpected = model.load_state_dict(state, strict=False)
        bad = [f"missing {k}" for k in missing if not k.startswith("loss.")]
        bad += [f"unexpected {k}" for k in unexpected if not k.startswith("loss.")]
        if bad:
            raise InputError(self.model_path, None, f"weights do not fit {self.config_path}: {show_keys(bad, 8)}")
        if model.frontend is None:
            raise InputError(
                self.config_path,
                None,
                "frontend: null (a model on precomputed features); only waveform-input ESPnet models are supported",
            )
        self.model = model.to(self.device).eval()
        fs = (args.get("frontend_conf") or {}).get("fs", 16000)
        if isinstance(fs, str):
            import humanfriendly

            fs = humanfriendly.parse_size(fs)
        self.sample_rate = int(fs)
        ok, why = PaddingMask.supports(model.encoder)
        self.mask = PaddingMask(model.encoder) if ok else None
        if not ok:
            log.warning(
                "ESPnet encoder %s: %s; utterances run one at a time so that each gets its own embedding",
                type(model.encoder).__name__,
                why,
            )
        self.dim = int(model.projector.output_size()) if model.projector is not None else -1
        self.stamp = model_stamp(self.name, self.config_path, self.model_path)
        self._torch = torch

    @staticmethod
    def _model_file(d: Path, model_file: str | os.PathLike[str] | None) -> Path:
        if model_file is not None:
            p = Path(model_file)
            if not p.is_file():
                raise InputError(p, None, "model file not found")
            return p
        if (d / "model.pth").is_file():
            return d / "model.pth"
        cands = sorted(p for p in d.glob("*.pth") if p.name != "checkpoint.pth")
        if len(cands) == 1:
            return cands[0]
        what = "no *.pth file" if not cands else f"several: {' '.join(p.name for p in cands)}"
        raise InputError(d, None, f"cannot tell which weights to use ({what}); give --model-file")

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]:
        return _WavePreparer(os.fspath(data_dir), self.sample_rate)

    def frames(self, x: np.ndarray) -> int:
        return max(1, int(math.ceil(x.shape[0] * FRAME_RATE / self.sample_rate)))

    def _features(self, x: np.ndarray) -> tuple[Any, Any]:
        """ESPnet's frontend (+ normalize) on one unpadded utterance -> ([T, F], the frame count
        the frontend reports, which is what ESPnet hands to its pooling)."""
        torch = self._torch
        m = self.model
        wav = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None].to(self.device)
        feats, flens = m.frontend(wav, torch.tensor([wav.shape[1]], device=self.device))
        if m.normalize is not None:
            feats, _ = m.normalize(feats, torch.tensor([feats.shape[1]], device=self.device))
        return feats[0], torch.as_tensor(flens).reshape(-1)[:1].to(self.device)

    def _pool_each(self, frames: Any, valid: Sequence[int], flens: Sequence[Any]) -> Any:
        """ESPnet's pooling one utterance at a time, on its valid frames, with the lengths ESPnet
        itself passes (the frontend's count: for an encoder that shortens the time axis, e.g.
        ``xvector``, ESPnet divides by that count; we reproduce it, not correct it)."""
        pooled = [
            self.model.pooling(frames[i : i + 1, :, : int(valid[i])], feat_lengths=flens[i])
            for i in range(frames.shape[0])
        ]
        return self._torch.cat(pooled, dim=0)

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            feats, flens = zip(*(self._features(x) for x in xs), strict=True)
            pooled = None
            if self.mask is not None:
                lens = torch.tensor([f.shape[0] for f in feats], device=self.device)
                padded = torch.nn.utils.rnn.pad_sequence(list(feats), batch_first=True)
                try:
                    with self.mask.active(lens, padded.shape[1]) as mask:
                        frames = self.model.encode_frame(padded)
                        valid = mask.lengths(frames.shape[-1])
                    same = all(int(v) == int(f.round()) for v, f in zip(valid.tolist(), flens, strict=True))
                    if same:  # the usual case (ECAPA keeps the time axis): pool the batch at once
                        pooled = self.model.pooling(frames, feat_lengths=torch.cat(flens))
                    else:
                        pooled = self._pool_each(frames, valid.tolist(), flens)
                except _Untracked as exc:
                    log.debug("batch of %d run one by one: %s", len(xs), exc)
                    pooled = None
            if pooled is None:  # one at a time, exactly as ESPnet's model.forward does it
                pooled = torch.cat(
                    [
                        self.model.pooling(self.model.encode_frame(f[None]), feat_lengths=n)
                        for f, n in zip(feats, flens, strict=True)
                    ],
                    dim=0,
                )
            out = self.model.project_spk_embd(pooled)
        return out.float().cpu().numpy()
