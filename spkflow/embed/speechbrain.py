"""SpeechBrain pretrained speaker encoders in stage 5: :class:`SpeechbrainEmbedder`.

The model is a SpeechBrain pretrained folder as ``EncoderClassifier.from_hparams(source=DIR)``
reads it (what ESPnet's TTS recipes use with ``--spk_embed_tool speechbrain``, e.g. a local copy
of ``speechbrain/spkrec-ecapa-voxceleb``): ``hyperparams.yaml`` and the files its ``Pretrainer``
names (``embedding_model.ckpt``, ``mean_var_norm_emb.ckpt``, ``classifier.ckpt``,
``label_encoder.txt``).  It is loaded by SpeechBrain's own code with no network: the folder's
``pretrained_path`` (the hub name in the published files) is pointed at DIR, nothing is fetched
(``FetchConfig(allow_network=False)``) and nothing is written (no ``savedir``, no symlinks).
The embedding is ``encode_batch(wav)`` of the utterance alone (``normalize=False``, ESPnet's
call): ``compute_features`` -> ``mean_var_norm`` -> ``embedding_model``.

What it guarantees
------------------
* **Batched = alone, closer than SpeechBrain's own batch.**  SpeechBrain's ``encode_batch(wavs,
  wav_lens)`` changes the embeddings of a padded batch's shorter utterances: its sentence mean
  normalisation counts ``round(rel_len * T_max)`` frames (one more or less than the utterance
  has alone), and its ``Conv1d`` layers pad with ``reflect`` at the *batch's* end, so an
  utterance's last frames see the batch's zeros instead of its own reflection (measured on
  LibriSpeech: 3e-4 after L2 normalisation for a pair, ``test/embed/test_embed_speechbrain.py``).
  Here the features and their normalisation run on each utterance alone (they are cheap), and the
  encoder runs on the padded features under :class:`~spkflow.embed.masking.PaddingMask` with
  :data:`BLOCKS`: before each ``Conv1d`` the frames after an utterance's end are rewritten with
  *its own* reflection (or zeros for zero padding), and the SE / attentive-pooling / statistics
  layers get relative lengths ``(L - 1/4) / T`` that select exactly ``L`` frames under both of
  SpeechBrain's conventions (``arange < rel * T`` and ``round(rel * T)``).  Embeddings equal
  ``encode_batch`` of each utterance alone within 1e-5 after L2 normalisation (the order of float
  sums), for ECAPA-TDNN and x-vector models; other SpeechBrain encoders run in groups of equal
  length, one at a time otherwise (said in the log).
* **Weights checked.**  Every ``*.ckpt`` is read with ``weights_only=True`` before SpeechBrain
  loads it (a truncated or code-holding file is refused naming it), and ``embedding_model.ckpt``
  must fit the model key for key (SpeechBrain's own transfer only logs missing keys).
* SpeechBrain is an optional extra (``pip install '.[speechbrain]'`` in the checkout); without it a clear
  error names the extra.  ``dtype`` bfloat16 / float16: the encoder under ``torch.autocast``.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.core.errors import InputError
from spkflow.core.extras import install_hint
from spkflow.data.jobs import show_keys
from spkflow.embed.base import (
    FRAME_RATE,
    ModelError,
    WavePreparer,
    autocast,
    autocast_dtype,
    equal_length_groups,
    model_files,
    model_stamp,
    resolve_device,
)
from spkflow.embed.masking import Block, PaddingMask, Untracked, qualname
from spkflow.nnet.checkpoint import load_checkpoint

__all__ = ["SpeechbrainEmbedder", "BLOCKS", "MinLength"]

log = logging.getLogger("spkflow.embed.run")

#: SpeechBrain's version this module was written against (the ``speechbrain`` extra pins it)
TESTED_VERSION = "1.1.2"


def _conv_check(conv: Any) -> str | None:
    if conv.padding == "same":
        if conv.stride != 1:
            return f"a 'same' convolution with stride {conv.stride}"
        if conv.padding_mode not in ("reflect", "zeros", "constant"):
            return f"a convolution padded with {conv.padding_mode!r}"
        return None
    return None if conv.padding == "valid" else f"a {conv.padding!r} convolution"


def _pad_of(conv: Any) -> int:
    """Frames SpeechBrain's ``Conv1d`` pads on each side (``get_padding_elem`` for stride 1)."""
    return conv.dilation * (conv.kernel_size - 1) // 2 if conv.padding == "same" else 0


def _conv_install(mask: PaddingMask, conv: Any) -> None:
    """SpeechBrain's ``Conv1d`` pads itself (``F.pad``) and then runs ``conv.conv`` unpadded: before
    that inner convolution, rewrite each utterance's right padding as it would be alone (its own
    reflection, or zeros)."""
    import torch

    p, reflect = _pad_of(conv), conv.padding_mode == "reflect"

    def pre(mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not mask.is_active or p == 0:
            return None
        x = args[0]  # [B, C, p + T + p]
        t = x.shape[-1] - 2 * p
        lens = mask.lengths(t).to(x.device)
        if bool((lens >= t).all()):
            return None
        j = torch.arange(t + 2 * p, device=x.device)[None, :]
        end = p + lens[:, None]  # first padded position of each utterance
        if reflect:  # position end + k holds frame L - 2 - k, i.e. padded position 2 * end - 2 - j
            idx = torch.where(j < end, j, torch.where(j < end + p, 2 * end - 2 - j, j))
            return (x.gather(-1, idx[:, None, :].expand(-1, x.shape[1], -1)), *args[1:])
        return (x.masked_fill((j >= end)[:, None, :], 0.0), *args[1:])

    conv.conv.register_forward_pre_hook(pre)


_LOBES = "speechbrain.lobes.models"
_CONV = Block(frame_wise=True, install=_conv_install, generic_hooks=False, check=_conv_check)
#: SpeechBrain's speaker encoders and layers :class:`PaddingMask` understands (speechbrain 1.1.2).
BLOCKS: dict[str, Block] = {
    f"{_LOBES}.ECAPA_TDNN.ECAPA_TDNN": Block(),
    f"{_LOBES}.ECAPA_TDNN.TDNNBlock": Block(),
    f"{_LOBES}.ECAPA_TDNN.Res2NetBlock": Block(),
    f"{_LOBES}.ECAPA_TDNN.SERes2NetBlock": Block(),
    # these take the relative lengths themselves
    f"{_LOBES}.ECAPA_TDNN.SEBlock": Block(frame_wise=True),
    f"{_LOBES}.ECAPA_TDNN.AttentiveStatisticsPooling": Block(frame_wise=True),
    "speechbrain.nnet.pooling.StatisticsPooling": Block(frame_wise=True),
    f"{_LOBES}.Xvector.Xvector": Block(),
    # per frame (BatchNorm in eval), or after the pooling (Linear on [B, 1, C])
    f"{_LOBES}.ECAPA_TDNN.BatchNorm1d": Block(frame_wise=True),
    "speechbrain.nnet.normalization.BatchNorm1d": Block(frame_wise=True),
    "speechbrain.nnet.linear.Linear": Block(frame_wise=True),
    f"{_LOBES}.ECAPA_TDNN.Conv1d": _CONV,
    "speechbrain.nnet.CNN.Conv1d": _CONV,
}


class MinLength:
    """Picklable check in the workers: an utterance shorter than the model's shortest input
    fails by name (SpeechBrain's reflect padding needs more frames than it pads)."""

    def __init__(self, min_samples: int) -> None:
        self.min_samples = min_samples

    def __call__(self, wave: np.ndarray) -> np.ndarray:
        if wave.shape[0] < self.min_samples:
            raise ValueError(
                f"{wave.shape[0]} samples is shorter than the model's shortest input ({self.min_samples} samples)"
            )
        return wave


class SpeechbrainEmbedder:
    """A SpeechBrain pretrained folder (``hyperparams.yaml`` + ``*.ckpt``), loaded by
    ``EncoderClassifier.from_hparams`` with no network and run batched (see the module doc)."""

    name = "speechbrain"

    def __init__(self, model_dir: str | os.PathLike[str], device: str = "cpu", dtype: str = "float32") -> None:
        import torch

        files = model_files(self.name, model_dir)
        self.config_path = files[0]
        self.model_dir = d = self.config_path.parent
        self.device = resolve_device(device)
        self.dtype = dtype
        self._autocast = autocast_dtype(dtype, self.device)
        try:
            import speechbrain
            from speechbrain.inference.classifiers import EncoderClassifier
            from speechbrain.utils.fetching import FetchConfig
        except ImportError as exc:
            raise ModelError(
                d, None, f"--toolkit speechbrain needs SpeechBrain: {install_hint('speechbrain')} ({exc})"
            ) from None
        if speechbrain.__version__ != TESTED_VERSION:
            log.warning("SpeechBrain %s: spkflow is tested with %s", speechbrain.__version__, TESTED_VERSION)
        ckpts = {p: load_checkpoint(p, hint="copy the pretrained folder again") for p in files[1:]}  # names a bad file
        text = self.config_path.read_text(encoding="utf-8")
        overrides = {"pretrained_path": os.fspath(d)} if re.search(r"^pretrained_path\s*:", text, re.M) else {}
        try:
            clf = EncoderClassifier.from_hparams(
                source=os.fspath(d),
                overrides=overrides,
                savedir=None,
                fetch_config=FetchConfig(allow_network=False),
                run_opts={"device": self.device},
            )
        except Exception as exc:  # SpeechBrain and hyperpyyaml raise many kinds
            why = " ".join(str(exc).split())  # torch's multi-line size mismatches on one line
            why = why if len(why) <= 600 else why[:600] + " ..."
            raise ModelError(
                self.config_path, None, f"SpeechBrain cannot load it: {type(exc).__name__}: {why}"
            ) from None
        self.classifier = clf
        self.model = clf.mods.embedding_model
        self._check_weights(clf, ckpts)
        self.config: dict[str, Any] = {"hyperparams": os.fspath(self.config_path)}
        self.sample_rate = int(getattr(clf.audio_normalizer, "sample_rate", 16000))
        ok, why = PaddingMask.supports(self.model, BLOCKS)
        self.mask = PaddingMask(self.model, BLOCKS) if ok else None
        if not ok:
            log.warning(
                "SpeechBrain encoder %s: %s; utterances run in groups of equal length (one at a time otherwise)",
                type(self.model).__name__,
                why,
            )
        self._min_samples = self._shortest_input() if ok else 0
        self._torch = torch
        with torch.inference_mode():
            self.dim = int(self._encode([self._features(np.zeros(self.sample_rate, dtype=np.float32))]).shape[-1])
        self.stamp = model_stamp(self.name, *files, dtype=dtype)

    def _check_weights(self, clf: Any, ckpts: dict[Path, Any]) -> None:
        """``embedding_model``'s file must fit the model key for key and shape for shape."""
        path = Path(clf.hparams.pretrainer.paths.get("embedding_model", self.model_dir / "embedding_model.ckpt"))
        state = ckpts.get(path.resolve()) or ckpts.get(path)
        if state is None:
            state = load_checkpoint(path, hint="copy the pretrained folder again")
        own = self.model.state_dict()
        bad = [f"missing {k}" for k in own if k not in state]
        bad += [f"unexpected {k}" for k in state if k not in own]
        bad += [
            f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
            for k, v in state.items()
            if k in own and hasattr(v, "shape") and v.shape != own[k].shape
        ]
        if bad:
            raise InputError(path, None, f"weights do not fit {self.config_path}: {show_keys(bad, 8)}")

    def _shortest_input(self) -> int:
        """Samples an utterance needs so that every reflect-padded convolution has more frames
        than it pads (SpeechBrain's own limit; checked in the workers to name the utterance)."""
        pads = [_pad_of(m) for m in self.model.modules() if BLOCKS.get(qualname(m)) is _CONV]
        stft = getattr(self.classifier.mods.compute_features, "compute_STFT", None)
        hop = int(getattr(stft, "hop_length", 160)) if stft is not None else 160
        return max(pads, default=0) * hop  # frames = 1 + samples // hop must exceed the pad

    # ------------------------------------------------------------------ the interface
    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]:
        return WavePreparer(os.fspath(data_dir), self.sample_rate, MinLength(self._min_samples))

    def prepare_wave(self, wave: np.ndarray) -> np.ndarray:
        return MinLength(self._min_samples)(np.asarray(wave, dtype=np.float32))

    def frames(self, x: np.ndarray) -> int:
        return max(1, int(math.ceil(x.shape[0] * FRAME_RATE / self.sample_rate)))

    def _features(self, x: np.ndarray) -> Any:
        """``compute_features`` and ``mean_var_norm`` of one utterance alone, as ``encode_batch``
        computes them: [T, F]."""
        torch = self._torch
        wav = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None].to(self.device)
        mods = self.classifier.mods
        feats = mods.compute_features(wav)
        return mods.mean_var_norm(feats, torch.ones(1, device=self.device))[0]

    def _encode(self, feats: Sequence[Any]) -> Any:
        """``embedding_model`` on utterances' features: padded under the mask, else in equal-length
        groups (no padding) -> [N, dim]."""
        torch = self._torch
        if self.mask is not None and len(feats) > 1:
            lens = torch.tensor([f.shape[0] for f in feats], device=self.device)
            padded = torch.nn.utils.rnn.pad_sequence(list(feats), batch_first=True)
            t = padded.shape[1]
            try:
                with self.mask.active(lens, t):
                    return self.model(padded, (lens.float() - 0.25) / t).reshape(len(feats), -1)
            except Untracked as exc:
                log.debug("batch of %d run in equal-length groups: %s", len(feats), exc)
        out: list[Any] = [None] * len(feats)
        for group in equal_length_groups([f.shape[0] for f in feats]):
            emb = self.model(torch.stack([feats[i] for i in group]), torch.ones(len(group), device=self.device))
            for j, i in enumerate(group):
                out[i] = emb[j].reshape(1, -1)
        return torch.cat(out, dim=0)

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            feats = [self._features(x) for x in xs]
            with autocast(self.device, self._autocast):
                out = self._encode(feats)
        return out.float().cpu().numpy()
