"""ESPnet speaker models in stage 5: :class:`EspnetEmbedder` and the encoders it batches (:data:`BLOCKS`).

What it guarantees
------------------
* **Batched = alone, for every encoder ESPnet ships for speakers but SKA-TDNN.**  ESPnet's speaker
  models do not honour lengths (below), so a zero-padded batch would change every embedding but
  the longest one's.  :class:`EspnetEmbedder` runs ESPnet's frontend one utterance at a time and
  the encoder on the padded batch under :class:`~spkflow.embed.masking.PaddingMask` (masked,
  not equal-length batching: utterances of a corpus almost never have equal lengths), with the
  rules of :data:`BLOCKS`: ECAPA-TDNN, x-vector, RawNet3 (its AFMS mean made a masked mean),
  ResNet (Conv2d with time last) and the MFA-Conformer with absolute or (``rel_pos_type:
  latest``) relative positions (a key mask given to every layer's attention).  Pooling runs on
  each utterance's valid frames.  Encoders the mask does not understand (SKA-TDNN; a conformer
  with ESPnet's legacy relative attention, whose ``rel_shift`` reads other positions when the time
  axis grows) run in groups of equal length, one at a time otherwise, and say so in the log.
  Every path reproduces ESPnet's single-utterance numbers (``model(speech, extract_embd=True)``)
  within 1e-4 after L2 normalisation (``test/embed/test_embed_espnet.py``, real speech included).
* **Weights that fit.**  Built with ``SpeakerTask.build_model`` from the config, weights loaded
  with ``weights_only=True`` (a truncated or code-holding file is refused naming it); every key
  other than the training loss's must match in name and shape.
* **Precision.**  ``dtype`` bfloat16 / float16 runs encoder, pooling and projector under
  ``torch.autocast`` (the frontend stays float32); vectors are returned float32.

What ESPnet does with lengths (espnet 202511, read for this module)
-------------------------------------------------------------------
``ESPnetSpeakerModel.forward(speech, speech_lengths)`` passes the lengths to the frontend and
from the frontend to the pooling, never to the encoder.  ``DefaultFrontend`` (STFT) masks
padded frames and returns true frame counts; ``MelSpectrogramTorch`` (the frontend of ESPnet's
ECAPA/x-vector speaker recipes) ignores the lengths, returns the *padded* length for every row
and its ``normalize: mn`` subtracts a mean taken over the padding too; ``AsteroidFrontend``
(RawNet3's) normalises the whole padded waveform (``InstanceNorm1d``).  The encoders
(``ecapa_tdnn``, ``xvector``, ``rawnet3``, ``resnet``, ``mfaconformer``) take no lengths: their
convolutions read padded frames and the SE / AFMS blocks average over them; the conformer's
layers are called with ``mask=None``.  So a zero-padded batch changes every embedding but the
longest one's (``test/embed/test_embed_espnet.py``: L2-normalised differences above 0.01 for a
tiny ECAPA).  The pooling gets the *frontend's* frame count even when the encoder shortens the
time axis (``xvector``: 6 frames fewer; ``rawnet3``: 15 times fewer; ``resnet``: 8 times), so
ESPnet's statistics divide by a count larger than the frames summed; :class:`EspnetEmbedder`
reproduces ESPnet's single-utterance numbers (equal in the tests), it does not correct them.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from spkflow.core.errors import InputError
from spkflow.data.jobs import show_keys
from spkflow.embed.base import (
    FRAME_RATE,
    WavePreparer,
    autocast,
    autocast_dtype,
    equal_length_groups,
    model_files,
    model_stamp,
    resolve_device,
)
from spkflow.embed.masking import Block, PaddingMask, Untracked
from spkflow.nnet.checkpoint import load_checkpoint

__all__ = ["EspnetEmbedder", "BLOCKS"]

log = logging.getLogger("spkflow.embed.run")


def _afms_install(mask: PaddingMask, afms: Any) -> None:
    """RawNet3's AFMS averages over time with ``F.adaptive_avg_pool1d`` (no layer to hook): its
    output is recomputed with the mean over valid frames (``AFMS.forward``'s three lines)."""

    def hook(mod: Any, args: tuple[Any, ...], out: Any) -> Any:
        if not mask.is_active:
            return None
        x = args[0]
        y = mask.masked_mean(x).view(x.size(0), -1)
        y = mod.sig(mod.fc(y)).view(x.size(0), x.size(1), -1)
        return (x + mod.alpha) * y

    afms.register_forward_hook(hook)


def _attention_mask_install(mask: PaddingMask, layer: Any) -> None:
    """A conformer layer is called with ``mask=None`` by ``MfaConformerEncoder``: give its
    self-attention the batch's key mask ([B, 1, T], True on valid frames, ESPnet's convention)."""
    import torch

    def pre(mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not mask.is_active:
            return None
        x = args[0][0] if isinstance(args[0], tuple) else args[0]
        t = x.shape[1]
        valid = mask.lengths(t).to(x.device)
        keys = (torch.arange(t, device=x.device)[None, :] < valid[:, None])[:, None, :]
        return (args[0], keys, *args[2:])

    layer.register_forward_pre_hook(pre)


_SPK = "espnet2.spk"
_NETS = "espnet.nets.pytorch_backend"
#: ESPnet's speaker encoders and blocks :class:`PaddingMask` understands (espnet 202511).
BLOCKS: dict[str, Block] = {
    # ECAPA-TDNN and x-vector: blocks combining convolutions frame by frame (SE: AdaptiveAvgPool1d)
    f"{_SPK}.encoder.ecapa_tdnn_encoder.EcapaTdnnEncoder": Block(),
    f"{_SPK}.layers.ecapa_block.EcapaBlock": Block(),
    f"{_SPK}.layers.ecapa_block.SEModule": Block(),
    f"{_SPK}.encoder.xvector_encoder.XvectorEncoder": Block(),
    # RawNet3 on raw waveforms: Res2Net blocks with MaxPool1d and AFMS (a mean over time)
    f"{_SPK}.encoder.rawnet3_encoder.RawNet3Encoder": Block(),
    f"{_SPK}.layers.rawnet_block.Bottle2neck": Block(),
    f"{_SPK}.layers.rawnet_block.AFMS": Block(frame_wise=True, install=_afms_install),
    # ResNet on [B, 1, F, T] (WeSpeaker's ResNet): Conv2d with time last
    f"{_SPK}.encoder.resnet_encoder.ResNetEncoder": Block(time_axis=-1),
    f"{_SPK}.layers.resnet_block.BasicBlock": Block(),
    f"{_SPK}.layers.resnet_block.Bottleneck": Block(),
    # MFA-Conformer: Conv2d subsampling on [B, 1, T, F], then layers on [B, T, C] with a key mask.
    # Attention with absolute or (latest) relative positions only: the legacy relative attention's
    # rel_shift reads other positions when the time axis grows, so padding changes it.
    f"{_SPK}.encoder.conformer_encoder.MfaConformerEncoder": Block(),
    **{
        f"{_NETS}.transformer.subsampling.{name}": Block(frame_wise=True, time_axis=-2)
        for name in (
            "Conv2dSubsampling",
            "Conv2dSubsampling1",
            "Conv2dSubsampling2",
            "Conv2dSubsampling6",
            "Conv2dSubsampling8",
        )
    },
    f"{_NETS}.conformer.encoder_layer.EncoderLayer": Block(install=_attention_mask_install),
    f"{_NETS}.transformer.repeat.MultiSequential": Block(),
    f"{_NETS}.transformer.attention.MultiHeadedAttention": Block(frame_wise=True),
    f"{_NETS}.transformer.attention.RelPositionMultiHeadedAttention": Block(frame_wise=True),
    f"{_NETS}.transformer.embedding.PositionalEncoding": Block(frame_wise=True),
    f"{_NETS}.transformer.embedding.ScaledPositionalEncoding": Block(frame_wise=True),
    f"{_NETS}.transformer.embedding.RelPositionalEncoding": Block(frame_wise=True),
    f"{_NETS}.transformer.positionwise_feed_forward.PositionwiseFeedForward": Block(frame_wise=True),
    f"{_NETS}.transformer.layer_norm.LayerNorm": Block(frame_wise=True),
    f"{_NETS}.conformer.convolution.ConvolutionModule": Block(),
    f"{_NETS}.conformer.swish.Swish": Block(),
}


class EspnetEmbedder:
    """An ESPnet speaker model (``config.yaml`` + ``*.pth`` of ``espnet2/bin/spk_train.py``).

    Built with ``espnet2.tasks.spk.SpeakerTask.build_model`` from the config (so every ESPnet
    frontend/encoder/pooling/projector works), weights loaded with ``weights_only=True``; keys
    other than the training loss's must all match.  Inputs are waveforms at the frontend's
    ``fs`` (16 kHz unless the config says otherwise).  A batch runs ESPnet's frontend and
    normalisation one utterance at a time (they are cheap, and ``MelSpectrogramTorch`` ignores
    lengths), pads the features, runs the encoder under :class:`PaddingMask` and pools each
    utterance's valid frames.  Encoders :class:`PaddingMask` does not support run in groups of
    equal length (one at a time otherwise).
    """

    name = "espnet"

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        device: str = "cpu",
        model_file: str | os.PathLike[str] | None = None,
        dtype: str = "float32",
    ) -> None:
        import torch
        import yaml

        self.config_path, self.model_path = model_files(self.name, model_dir, model_file)
        self.device = resolve_device(device)
        self.dtype = dtype
        self._autocast = autocast_dtype(dtype, self.device)
        with open(self.config_path, encoding="utf-8") as f:
            args = yaml.safe_load(f)
        if not isinstance(args, dict) or "encoder" not in args:
            raise InputError(self.config_path, None, "not an ESPnet speaker config (no 'encoder')")
        self.config: dict[str, Any] = args
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
        ok, why = PaddingMask.supports(model.encoder, BLOCKS)
        self.mask = PaddingMask(model.encoder, BLOCKS) if ok else None
        if not ok:
            log.warning(
                "ESPnet encoder %s: %s; utterances run in groups of equal length (one at a time otherwise) "
                "so that each gets its own embedding",
                type(model.encoder).__name__,
                why,
            )
        self.dim = int(model.projector.output_size()) if model.projector is not None else -1
        self.stamp = model_stamp(self.name, self.config_path, self.model_path, dtype=dtype)
        self._torch = torch
        with torch.inference_mode():  # the encoder's frames per 10 ms (RawNet3's frontend: 1 ms frames)
            probe = np.sin(np.arange(self.sample_rate, dtype=np.float32) * 0.1)
            self.frames_per_10ms = max(1.0, float(round(self._features(probe)[0].shape[0] / FRAME_RATE)))

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]:
        return WavePreparer(os.fspath(data_dir), self.sample_rate)

    def prepare_wave(self, wave: np.ndarray) -> np.ndarray:
        return np.asarray(wave, dtype=np.float32)

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

    def _masked(self, feats: Sequence[Any], flens: Sequence[Any]) -> Any:
        """Pooled vectors of a padded batch under the mask (raises Untracked when lost)."""
        torch = self._torch
        assert self.mask is not None
        lens = torch.tensor([f.shape[0] for f in feats], device=self.device)
        padded = torch.nn.utils.rnn.pad_sequence(list(feats), batch_first=True)
        with self.mask.active(lens, padded.shape[1]) as mask:
            frames = self.model.encode_frame(padded)
            valid = mask.lengths(frames.shape[-1])
        if all(int(v) == int(f.round()) for v, f in zip(valid.tolist(), flens, strict=True)):
            return self.model.pooling(frames, feat_lengths=torch.cat(flens))  # ECAPA: the time axis is kept
        return self._pool_each(frames, valid.tolist(), flens)

    def _equal_lengths(self, feats: Sequence[Any], flens: Sequence[Any]) -> Any:
        """Pooled vectors, utterances of equal length stacked (no padding), exactly as ESPnet's
        ``model.forward`` runs them."""
        torch = self._torch
        out: list[Any] = [None] * len(feats)
        for group in equal_length_groups([f.shape[0] for f in feats]):
            frames = self.model.encode_frame(torch.stack([feats[i] for i in group]))
            pooled = self.model.pooling(frames, feat_lengths=torch.cat([flens[i] for i in group]))
            for j, i in enumerate(group):
                out[i] = pooled[j : j + 1]
        return torch.cat(out, dim=0)

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            feats, flens = zip(*(self._features(x) for x in xs), strict=True)
            with autocast(self.device, self._autocast):
                pooled = None
                if self.mask is not None and len(xs) > 1:
                    try:
                        pooled = self._masked(feats, flens)
                    except Untracked as exc:
                        log.debug("batch of %d run in equal-length groups: %s", len(xs), exc)
                if pooled is None:
                    pooled = self._equal_lengths(feats, flens)
                out = self.model.project_spk_embd(pooled)
        return out.float().cpu().numpy()
