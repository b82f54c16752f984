"""Speaker embedders: ``feats [B, T, F]`` + ``lengths [B]`` -> one embedding per utterance.

What it guarantees
------------------
* Every model is a :class:`SpeakerEmbedder` built from a config section by
  :func:`build_model`; an unknown ``name`` or key, or a value the model cannot take, is a
  :class:`~spkflow.core.checks.ConfigError` that names the config file and the key and lists the
  accepted ones (never silently ignored).
* **A long recording at inference** (ECAPA-TDNN, more than :data:`POOL_BLOCK` frames, grad off):
  the attentive pooling's attention runs :data:`POOL_BLOCK` frames at a time and the encoder drops
  what it no longer needs, so a 10-minute clip takes 0.4-0.5 GB above the process's floor instead
  of 1.0-1.1 GB (``test/bench/bench_long_clip.py``).  The same operations: bit for bit the one-piece
  embedding on one torch thread (as stage 5's jobs run); with more threads the blocks' matrix
  products round differently, measured <= 4.1e-7 after L2 normalisation (thread counts already
  move embeddings by that much).
* **Padding invariance**: an utterance padded at the end inside a batch gets the embedding it
  gets alone (``test/nnet/test_models.py`` checks max |diff| <= 1e-4 between L2-normalised
  vectors, in eval mode).  Training batches are N x M crops of one length, so no padding
  reaches BatchNorm statistics in training.
* :func:`load_model_dir` rebuilds a trained model from ``config.yaml`` + ``model.pth`` (a plain
  state dict, loaded with ``torch.load(..., weights_only=True)``); the config's ``frontend``
  section says what input the model expects.

Models: ``ecapa_tdnn`` (:class:`EcapaTdnn`, espnet2.spk's ECAPA-TDNN modules run with a frame
mask, which is what makes them padding invariant), ``resnet`` (:class:`ResNet`, espnet2.spk's
ResNet encoder blocks run with a frame mask that is downsampled with the time axis) and
``dvector_lstm`` (:class:`DVectorLSTM`, the GE2E paper's d-vector LSTM, sliding-window
inference).  All take ``input_norm: global`` and ``specaug``.  How the masks are applied, the
paper settings and the comparison with espnet2's ``ESPnetSpeakerModel``: docs/models.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from spkflow.core.checks import ConfigError, check_choice, check_keys, check_named_section
from spkflow.nnet.checkpoint import load_checkpoint

__all__ = [
    "SpeakerEmbedder",
    "EcapaTdnn",
    "ResNet",
    "DVectorLSTM",
    "SpecAugment",
    "build_model",
    "check_model_config",
    "load_model_dir",
    "lengths_to_mask",
    "MODEL_DEFAULTS",
]


#: frames above which an ECAPA-TDNN pools in blocks at inference (:meth:`EcapaTdnn._pool_in_blocks`):
#: 41 s of voiced speech, longer than any batch of stage 5 on CPU (``default_max_frames``: 3000)
POOL_BLOCK = 4096


def lengths_to_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """Bool mask [B, max_len], True on valid frames."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


class SpecAugment(nn.Module):
    """Frequency and time masks on a batch [B, T, F] (training mode only).

    Each utterance gets ``num_freq_masks`` bands of width U[0, freq_width] set to zero and
    ``num_time_masks`` spans of width U[0, time_width] frames set to zero (zero is the
    training mean after ``input_norm: global``).  Time masks stay inside each utterance's
    valid frames.
    """

    def __init__(
        self, freq_width: int = 0, num_freq_masks: int = 1, time_width: int = 0, num_time_masks: int = 1
    ) -> None:
        super().__init__()
        self.freq_width, self.num_freq_masks = int(freq_width), int(num_freq_masks)
        self.time_width, self.num_time_masks = int(time_width), int(num_time_masks)

    @staticmethod
    def _band(size: torch.Tensor, width: int, batch: int, device: torch.device, total: int) -> torch.Tensor:
        w = torch.randint(0, width + 1, (batch,), device=device)
        w = torch.minimum(w, size)
        start = (torch.rand(batch, device=device) * (size - w + 1).float()).long()
        idx = torch.arange(total, device=device)[None, :]
        return (idx >= start[:, None]) & (idx < (start + w)[:, None])

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if not self.training or (self.freq_width <= 0 and self.time_width <= 0):
            return x
        b, t, f = x.shape
        keep = torch.ones(b, t, f, dtype=torch.bool, device=x.device)
        if self.freq_width > 0:
            full = torch.full((b,), f, device=x.device)
            for _ in range(self.num_freq_masks):
                keep &= ~self._band(full, self.freq_width, b, x.device, f)[:, None, :]
        if self.time_width > 0:
            for _ in range(self.num_time_masks):
                keep &= ~self._band(lengths.to(x.device), self.time_width, b, x.device, t)[:, :, None]
        return x * keep.to(x.dtype)


class SpeakerEmbedder(nn.Module):
    """Base class: input normalisation + SpecAugment + :meth:`embed`.

    ``forward(feats [B, T, F], lengths [B]) -> [B, embed_dim]`` (not normalised; score with
    cosine).  Subclasses implement :meth:`embed` on normalised features.
    """

    embed_dim: int
    input_dim: int

    def __init__(self, input_dim: int, input_norm: str = "global", specaug: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if input_norm not in ("global", "none"):
            raise ConfigError(f"model.input_norm must be 'global' or 'none', got {input_norm!r}")
        self.input_dim = int(input_dim)
        self.input_norm = input_norm
        self.register_buffer("input_mean", torch.zeros(self.input_dim))
        self.register_buffer("input_std", torch.ones(self.input_dim))
        spec = dict(specaug or {})
        check_keys("model.specaug", spec, ("freq_width", "num_freq_masks", "time_width", "num_time_masks"))
        self.specaug = SpecAugment(**spec)

    def set_input_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Per-dimension mean and std of the training input (used when ``input_norm: global``)."""
        self.input_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.input_std.copy_(torch.as_tensor(std, dtype=torch.float32).clamp_min(1e-5))

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        if feats.dim() != 3 or feats.shape[-1] != self.input_dim:
            raise ValueError(f"expected feats [B, T, {self.input_dim}], got {tuple(feats.shape)}")
        b, t, _ = feats.shape
        if lengths is None:
            lengths = torch.full((b,), t, dtype=torch.long, device=feats.device)
        lengths = lengths.to(device=feats.device, dtype=torch.long)
        if lengths.shape != (b,) or bool((lengths < 1).any()) or bool((lengths > t).any()):
            raise ValueError(f"lengths must be [B] in [1, {t}], got {lengths.tolist()}")
        x = feats
        if self.input_norm == "global":
            x = (x - self.input_mean) / self.input_std
        mask = lengths_to_mask(lengths, t)
        x = x * mask[:, :, None].to(x.dtype)  # padding is exactly zero, whatever the caller put there
        x = self.specaug(x, lengths)
        return self.embed(x, lengths)

    def embed(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


class EcapaTdnn(SpeakerEmbedder):
    """ECAPA-TDNN from espnet2.spk modules, run with a frame mask (see the module docstring).

    ``channels`` is espnet2's ``ndim`` (paper: 512 or 1024), ``scale`` the Res2Net scale,
    ``output_channels`` the frame-level output (default ``3 * channels`` as in the paper),
    ``embed_dim`` the projector output (paper: 192).
    """

    def __init__(
        self,
        input_dim: int = 80,
        channels: int = 512,
        scale: int = 8,
        output_channels: int | None = None,
        embed_dim: int = 192,
        input_norm: str = "global",
        specaug: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(input_dim, input_norm, specaug)
        from espnet2.spk.encoder.ecapa_tdnn_encoder import EcapaTdnnEncoder
        from espnet2.spk.pooling.chn_attn_stat_pooling import ChnAttnStatPooling
        from espnet2.spk.projector.rawnet3_projector import RawNet3Projector

        if channels % scale:
            raise ConfigError(f"model.channels ({channels}) must be a multiple of model.scale ({scale})")
        out_ch = int(output_channels or 3 * channels)
        self.encoder = EcapaTdnnEncoder(int(input_dim), model_scale=int(scale), ndim=int(channels), output_size=out_ch)
        self.pooling = ChnAttnStatPooling(out_ch)
        self.projector = RawNet3Projector(self.pooling.output_size(), int(embed_dim))
        self.embed_dim = int(embed_dim)

    @staticmethod
    def _block(block: nn.Module, x: torch.Tensor, m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """espnet2 ``EcapaBlock.forward`` with padded frames zeroed before each dilated conv and
        a masked mean in the SE squeeze.  ``m``: [B, 1, T] float mask, ``n``: [B, 1, 1] lengths."""
        residual = x
        out = block.bn1(block.relu(block.conv1(x)))
        spx = torch.split(out, block.width, 1)
        pieces = []
        sp = spx[0]
        for i in range(block.nums):
            sp = spx[i] if i == 0 else sp + spx[i]
            sp = block.bns[i](block.relu(block.convs[i](sp * m)))
            pieces.append(sp)
        pieces.append(spx[block.nums])
        out = block.bn3(block.relu(block.conv3(torch.cat(pieces, 1))))
        se = block.se.se  # Sequential(AdaptiveAvgPool1d, Conv1d, ReLU, BatchNorm1d, Conv1d, Sigmoid)
        s = (out * m).sum(dim=2, keepdim=True) / n
        for layer in list(se)[1:]:
            s = layer(s)
        return out * s + residual

    def encode(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Frame-level output [B, C, T] of espnet2's encoder, computed with a frame mask."""
        enc = self.encoder
        t = x.shape[1]
        m = lengths_to_mask(lengths, t)[:, None, :].to(x.dtype)  # [B, 1, T]
        n = lengths.to(x.dtype).view(-1, 1, 1)
        h = x.transpose(1, 2) * m
        h = enc.bn(enc.relu(enc.conv(h)))
        x1 = self._block(enc.layer1, h, m, n)
        x2 = self._block(enc.layer2, h + x1, m, n)
        x3 = self._block(enc.layer3, h + x1 + x2, m, n)
        cat = torch.cat((x1, x2, x3), dim=1)
        del h, x1, x2, x3  # a long input's frames are not held three times over (the same values)
        out = enc.layer4(cat)
        return enc.relu(out) if torch.is_grad_enabled() else torch.relu_(out)

    def embed(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.encode(x, lengths)
        if self.training or torch.is_grad_enabled() or h.shape[-1] <= POOL_BLOCK or torch.jit.is_tracing():
            pooled = self.pooling(h, feat_lengths=lengths)
        else:
            pooled = self._pool_in_blocks(h, lengths)
        return self.projector(pooled)

    def _pool_in_blocks(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """espnet2's ``ChnAttnStatPooling.forward`` (with lengths) for inference on a long input:
        the same operations, but the ``[B, 3C, T]`` input of the attention (the frames with their
        mean and std repeated along time: 235 MB for 10 minutes of the demo's model) is never made
        whole; the attention runs :data:`POOL_BLOCK` frames at a time (its 1x1 convolutions are
        per frame), and no masked copy is made when nothing is padded."""
        p = self.pooling
        t = x.shape[-1]
        lengths = lengths.to(x.device)
        pad = ~lengths_to_mask(lengths, t)[:, None, :]  # [B, 1, T], True on padding
        padded = bool(pad.any())
        masked = x.masked_fill(pad, 0) if padded else x
        n = lengths.view(-1, 1, 1).clamp(min=1)
        mean = masked.sum(dim=-1, keepdim=True) / n
        var = (masked**2).sum(dim=-1, keepdim=True) / n - mean**2
        del masked
        std = torch.sqrt(var.clamp(min=torch.finfo(var.dtype).eps, max=1e4))
        w = x.new_empty(x.shape)
        for a in range(0, t, POOL_BLOCK):
            b = min(t, a + POOL_BLOCK)
            w[:, :, a:b] = p.attention(
                torch.cat((x[:, :, a:b], mean.expand(-1, -1, b - a), std.expand(-1, -1, b - a)), 1)
            )
        if padded:
            w.masked_fill_(pad, torch.finfo(w.dtype).min)
        w = p.softmax(w)
        mu = torch.sum(x * w, dim=2)
        sq = x**2
        sq *= w  # (x**2) * w, in place
        sg = torch.sqrt((torch.sum(sq, dim=2) - mu**2).clamp(min=1e-4, max=1e4))
        return torch.cat((mu, sg), dim=1)


# espnet2's ResNetEncoder depths: block kind and blocks per stage (He et al. 2016; the deeper
# ones are the speaker-verification variants espnet2 and WeSpeaker add).
RESNET_TYPES: dict[str, tuple[str, tuple[int, int, int, int]]] = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
    "resnet221": ("bottleneck", (6, 16, 48, 3)),
    "resnet293": ("bottleneck", (10, 20, 64, 3)),
}


_Length = TypeVar("_Length", int, torch.Tensor)


def _halve(lengths: _Length, stride: int) -> _Length:
    """Output length (frames or frequency bins; an int or a tensor of them) of a kernel-3,
    padding-1 (or kernel-1) convolution with ``stride``."""
    return (lengths - 1) // stride + 1


def _check_resnet(cfg: Mapping[str, Any], source: str = "config") -> None:
    """The ``resnet`` values a config file can get wrong, checked when the file is loaded."""
    check_choice(source, "model.resnet_type", cfg.get("resnet_type", "resnet34"), tuple(RESNET_TYPES))
    nb = cfg.get("num_blocks")
    ints = isinstance(nb, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in nb)
    if nb is not None and not (ints and len(nb) == 4 and min(nb) >= 1):
        raise ConfigError(f"{source}: model.num_blocks must be four integers >= 1 (or null), got {nb!r}")
    ch = cfg.get("channels", 32)
    if isinstance(ch, bool) or not isinstance(ch, int) or ch < 1:
        raise ConfigError(f"{source}: model.channels must be an integer >= 1, got {ch!r}")


class ResNet(SpeakerEmbedder):
    """ResNet speaker embedder from espnet2.spk modules, run with a frame mask.

    ``resnet_type`` picks espnet2's block kind and depth (``resnet34``: 3-4-6-3 basic blocks);
    ``num_blocks`` (four ints) overrides the depth with the same block kind.  ``channels`` is
    espnet2's ``m_channels`` (the first stage's width; stages 2-4 double it; ResNet34: 32),
    ``embed_dim`` the projector output (WeSpeaker's ResNet34: 256).  Parts: espnet2's
    ``ResNetEncoder`` (2-D convolutions over frequency x time, stride 2 in both at stages 2-4,
    so the frame rate drops 8x), ``StatsPooling`` (mean and standard deviation over time,
    given lengths) and ``RawNet3Projector`` (BatchNorm + linear).  Parameter names are
    espnet2's (``encoder.layer1.0.conv1.weight``, ...).

    What this guarantees that espnet2's ``ResNetEncoder.forward`` does not: a padded utterance
    in a batch gets the embedding it gets alone (eval mode, max |diff| <= 1e-4 after L2
    normalisation; ``test/nnet/test_models.py``).  espnet2's forward convolves across the padded
    frames, whose values after BatchNorm are not zero, so the last valid frames of each stage
    change with the padding, and it has no lengths for the pooling.  :meth:`encode` runs the
    same modules but zeroes the padded frames before every convolution with a time kernel of
    3, which is what the convolution's own zero padding does at the end of an utterance that
    is alone; a stride-2 stage maps a length ``L`` to ``(L - 1) // 2 + 1`` and the mask is
    rebuilt for that length, and an output frame inside it reads only input frames inside
    the input length or the zeroed frame just after it -- the same values as alone.  The
    statistics pooling then averages over the valid output frames only.  The 1x1 shortcuts
    read one frame each and need no mask.  Batches of equal-length crops (training) skip
    the masks, which are all ones there.
    """

    def __init__(
        self,
        input_dim: int = 80,
        resnet_type: str = "resnet34",
        num_blocks: list[int] | tuple[int, ...] | None = None,
        channels: int = 32,
        embed_dim: int = 256,
        input_norm: str = "global",
        specaug: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(input_dim, input_norm, specaug)
        from espnet2.spk.encoder.resnet_encoder import ResNetEncoder
        from espnet2.spk.layers.resnet_block import BasicBlock, Bottleneck
        from espnet2.spk.pooling.stat_pooling import StatsPooling
        from espnet2.spk.projector.rawnet3_projector import RawNet3Projector

        _check_resnet({"resnet_type": resnet_type, "num_blocks": num_blocks, "channels": channels})
        kind, blocks = RESNET_TYPES[resnet_type]
        if num_blocks is not None:
            blocks = tuple(num_blocks)
        block = BasicBlock if kind == "basic" else Bottleneck
        self.encoder = ResNetEncoder(int(input_dim), block=block, num_blocks=blocks, m_channels=channels)
        freq = int(input_dim)
        for _ in range(3):  # stages 2-4 halve the frequency axis too (kernel 3, padding 1, stride 2)
            freq = _halve(freq, 2)
        self.frame_dim = freq * channels * 8 * block.expansion  # espnet2's output_size() when input_dim % 8 == 0
        self.pooling = StatsPooling(self.frame_dim)
        self.projector = RawNet3Projector(self.pooling.output_size(), int(embed_dim))
        self.embed_dim = int(embed_dim)

    @staticmethod
    def _block(block: nn.Module, x: torch.Tensor, m: torch.Tensor | None, m_out: torch.Tensor | None) -> torch.Tensor:
        """espnet2's ``BasicBlock``/``Bottleneck`` forward with padded frames zeroed before each
        time-kernel-3 convolution.  ``m``: [B, 1, 1, T] float mask of the input frames,
        ``m_out``: the same for the block's (possibly strided) output; None: no padding."""
        conv3 = getattr(block, "conv3", None)
        if conv3 is None:  # BasicBlock: 3x3 (stride s) -> 3x3
            out = F.relu(block.bn1(block.conv1(x if m is None else x * m)))
            out = block.bn2(block.conv2(out if m_out is None else out * m_out))
        else:  # Bottleneck: 1x1 -> 3x3 (stride s) -> 1x1
            out = F.relu(block.bn1(block.conv1(x)))
            out = F.relu(block.bn2(block.conv2(out if m is None else out * m)))
            out = block.bn3(conv3(out))
        return F.relu(out + block.shortcut(x))

    def encode(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Frame-level output ``[B, D, T']`` of espnet2's encoder (same layout: frequency-major
        ``D = F' x C``), computed with a frame mask, and the output lengths ``[B]``."""
        enc = self.encoder
        padded = bool((lengths != x.shape[1]).any())

        def mask(n: torch.Tensor, t: int) -> torch.Tensor | None:
            return lengths_to_mask(n, t)[:, None, None, :].to(x.dtype) if padded else None

        h = x.transpose(1, 2).unsqueeze(1)  # [B, 1, F, T], padded frames already zero
        h = F.relu(enc.bn1(enc.conv1(h)))
        n = lengths
        m = mask(n, h.shape[-1])
        for stage in (enc.layer1, enc.layer2, enc.layer3, enc.layer4):
            for block in stage:
                stride = block.conv2.stride[-1] if hasattr(block, "conv3") else block.conv1.stride[-1]
                n_out = _halve(n, stride)
                t_out = _halve(h.shape[-1], stride)
                m_out = m if stride == 1 else mask(n_out, t_out)
                h = self._block(block, h, m, m_out)
                n, m = n_out, m_out
        b, c, f, t = h.shape
        return h.permute(0, 2, 1, 3).reshape(b, f * c, t), n

    def embed(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h, n = self.encode(x, lengths)
        return self.projector(self.pooling(h, feat_lengths=n))


class DVectorLSTM(SpeakerEmbedder):
    """GE2E d-vector LSTM: ``layers`` LSTM layers of ``hidden`` cells with projection ``embed_dim``.

    Training: the projected output at each crop's last frame.  Eval with ``infer_window > 0``:
    the mean of the L2-normalised last-frame outputs of windows of ``infer_window`` frames every
    ``infer_hop`` frames (the last window ends at the last frame; shorter utterances are one
    window).
    """

    def __init__(
        self,
        input_dim: int = 40,
        hidden: int = 768,
        embed_dim: int = 256,
        layers: int = 3,
        infer_window: int = 140,
        infer_hop: int = 70,
        input_norm: str = "global",
        specaug: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(input_dim, input_norm, specaug)
        if int(infer_window) < 0 or (int(infer_window) > 0 and int(infer_hop) < 1):
            raise ConfigError(f"model.infer_window must be >= 0 and infer_hop >= 1, got {infer_window}, {infer_hop}")
        proj = int(embed_dim) if int(embed_dim) < int(hidden) else 0
        self.lstm = nn.LSTM(int(input_dim), int(hidden), num_layers=int(layers), batch_first=True, proj_size=proj)
        self.embed_dim = int(embed_dim) if proj else int(hidden)
        self.infer_window, self.infer_hop = int(infer_window), int(infer_hop)

    def _last(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return h[-1]  # [B, embed_dim], in the caller's order

    def embed(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.training or self.infer_window <= 0:
            return self._last(x, lengths)
        win, hop = self.infer_window, self.infer_hop
        starts_all: list[int] = []
        owners: list[int] = []
        lens: list[int] = []
        for b, n in enumerate(lengths.tolist()):
            if n <= win:
                starts, size = [0], n
            else:
                starts = list(range(0, n - win + 1, hop))
                if starts[-1] != n - win:
                    starts.append(n - win)
                size = win
            starts_all += starts
            owners += [b] * len(starts)
            lens += [size] * len(starts)
        width = max(lens)
        idx = torch.tensor(starts_all, device=x.device)[:, None] + torch.arange(width, device=x.device)[None, :]
        idx = idx.clamp_max(x.shape[1] - 1)
        windows = x[torch.tensor(owners, device=x.device)[:, None], idx]  # [W, width, F]
        wl = torch.tensor(lens, device=x.device)
        windows = windows * lengths_to_mask(wl, width)[:, :, None].to(x.dtype)
        d = F.normalize(self._last(windows, wl), dim=-1)
        out = torch.zeros(x.shape[0], d.shape[1], dtype=d.dtype, device=d.device)
        own = torch.tensor(owners, device=x.device)
        out.index_add_(0, own, d)
        return out / torch.bincount(own, minlength=x.shape[0]).clamp_min(1)[:, None].to(d.dtype)


MODELS: dict[str, type[SpeakerEmbedder]] = {"ecapa_tdnn": EcapaTdnn, "resnet": ResNet, "dvector_lstm": DVectorLSTM}

# Accepted keys and defaults of each model (``name`` aside); ``build_model`` checks against these.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "ecapa_tdnn": {
        "input_dim": 80,
        "channels": 512,
        "scale": 8,
        "output_channels": None,
        "embed_dim": 192,
        "input_norm": "global",
        "specaug": None,
    },
    "resnet": {
        "input_dim": 80,
        "resnet_type": "resnet34",
        "num_blocks": None,
        "channels": 32,
        "embed_dim": 256,
        "input_norm": "global",
        "specaug": None,
    },
    "dvector_lstm": {
        "input_dim": 40,
        "hidden": 768,
        "embed_dim": 256,
        "layers": 3,
        "infer_window": 140,
        "infer_hop": 70,
        "input_norm": "global",
        "specaug": None,
    },
}


def check_model_config(cfg: Any, source: str = "config") -> tuple[str, dict[str, Any]]:
    """The model ``name`` and its other keys, after checking both against :data:`MODEL_DEFAULTS`
    (and, for ``resnet``, its depth and width values, so a bad one fails when the file is loaded).

    Raises :class:`~spkflow.core.checks.ConfigError` naming ``source`` (the config file) and the key.
    """
    name, cfg = check_named_section("model", cfg, MODEL_DEFAULTS, source)
    if name == "resnet":
        _check_resnet(cfg, source)
    return name, cfg


def build_model(cfg: Mapping[str, Any], source: str = "config") -> SpeakerEmbedder:
    """Build an embedder from its config section, e.g. ``{"name": "ecapa_tdnn", "channels": 256}``.

    Raises :class:`~spkflow.core.checks.ConfigError` naming ``source`` for an unknown name or key or a
    value the model cannot take.
    """
    name, kwargs = check_model_config(cfg, source)
    try:
        return MODELS[name](**kwargs)
    except ConfigError as err:  # raised by the constructor without the file
        raise ConfigError(f"{source}: {str(err).removeprefix('config: ')}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: model ({name}): a value does not fit: {err}") from None


def load_model_dir(
    model_dir: str | os.PathLike[str], device: str | torch.device = "cpu", checkpoint: str = "model.pth"
) -> tuple[SpeakerEmbedder, dict[str, Any]]:
    """Rebuild a trained embedder: ``config.yaml`` (sections ``frontend``, ``model``, ...) and
    ``model.pth`` (a plain state dict) from ``model_dir``.  Returns ``(model in eval mode on
    device, config)``.  Missing files or a state dict that does not fit the config raise
    errors naming the file."""
    model_dir = os.fspath(model_dir)
    cfg_path = os.path.join(model_dir, "config.yaml")
    ckpt_path = os.path.join(model_dir, checkpoint)
    for p in (cfg_path, ckpt_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p}: not found (is {model_dir} a trained model directory?)")
    with open(cfg_path, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    if not isinstance(config, dict) or "model" not in config:
        raise ConfigError(f"{cfg_path}: no 'model' section")
    model = build_model(config["model"], source=cfg_path)

    state = load_checkpoint(ckpt_path)  # CheckpointError names the file when it is truncated or holds code
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]  # a full training checkpoint also works
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ConfigError(f"{ckpt_path}: does not match the model in {cfg_path}: {err}") from None
    return model.to(device).eval(), config
