"""Padded batches for encoders that take no lengths: :class:`PaddingMask` and the :class:`Block` rules.

ESPnet's speaker encoders take no lengths, and SpeechBrain's honour them only in their pooling and
SE layers: on a zero-padded batch their convolutions read padding (or, with SpeechBrain's reflect
padding, the batch's zeros instead of the utterance's own reflection) at every utterance's end, and
time averages run over padding, so every embedding but the longest utterance's changes.
:class:`PaddingMask` puts forward hooks on an encoder's layers so that, while :meth:`PaddingMask.active`
is in force, every layer sees each utterance of the batch exactly as it sees it alone:

* ``Conv1d`` / ``Conv2d`` with zero padding: padded frames are set to zero before the layer (what the
  layer's own zero padding gives the utterance alone);
* ``MaxPool1d``: ``-inf`` there (never chosen over a valid frame);
* ``AdaptiveAvgPool1d(1)`` (the SE squeeze): the mean over valid frames;
* a toolkit block named in a :class:`Block` table installs its own hooks (RawNet3's AFMS mean, a
  conformer layer's attention mask, SpeechBrain's per-utterance reflect padding).

Valid lengths are followed through the layers by the size of the time axis (a strided or unpadded
convolution or a pooling shortens it), so after the encoder :meth:`PaddingMask.lengths` gives the
valid frames of its output for the pooling.  Values in padded frames are garbage (possibly
``inf``/``nan``) and never reach a valid frame: every layer that mixes frames is masked with
``masked_fill`` first.  Outside :meth:`PaddingMask.active` the hooks do nothing, so the model is
unchanged for any other use.

Only encoders made of understood parts are accepted (:meth:`PaddingMask.supports`): the torch layers
of :meth:`PaddingMask.safe_layers` and the toolkit blocks of the caller's table.  Anything else
(a layer that could mix padded frames into valid ones without us knowing) makes ``supports`` say
which layer, and the caller runs the model one utterance (or one equal-length group) at a time.

Anchors: ESPnet's and WeSpeaker's extraction zero-pad and ignore lengths in the encoder; SpeechBrain
passes relative lengths (its convolutions still see the batch's padding).  Here a padded batch is
*equal* to single-utterance inference, up to the order of float sums (``test/embed/test_masking.py``,
``test/embed/test_embed_espnet.py``, ``test/embed/test_embed_speechbrain.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["Block", "PaddingMask", "Untracked", "qualname", "valid_mask"]


class Untracked(RuntimeError):
    """A layer saw a time axis whose valid lengths are unknown (or ambiguous); the caller falls
    back to smaller batches."""


def qualname(mod: Any) -> str:
    """``module.Class`` of an object's type: the key of a :class:`Block` table."""
    return f"{type(mod).__module__}.{type(mod).__qualname__}"


def valid_mask(lengths: Any, size: int, ndim: int, axis: int) -> Any:
    """Boolean mask, True on valid frames, broadcastable to a tensor of ``ndim`` dimensions whose
    first axis is the batch and whose ``axis`` (negative) is time, of ``size`` frames."""
    import torch

    m = torch.arange(size, device=lengths.device)[None, :] < lengths[:, None]  # [B, T]
    shape = [m.shape[0]] + [1] * (ndim - 1)
    shape[axis] = size
    return m.view(shape)


@dataclasses.dataclass(frozen=True)
class Block:
    """How :class:`PaddingMask` treats a toolkit module it knows by name (``module.Class``).

    A block listed with the defaults is one whose ``forward`` combines its sub-modules' outputs
    frame by frame (adds, concatenations over channels, splits): its sub-modules are checked
    and hooked like the encoder's own.

    ``frame_wise``: every sub-module works frame by frame on the block's layout (e.g. ``Linear``
    on ``[B, T, C]``, attention given a mask): not checked (layers that mix frames inside are
    still hooked).  ``time_axis``: the time axis of the ``Conv2d`` layers inside (-1 for
    ``[B, C, F, T]``, -2 for ``[B, C, T, F]``).  ``install(mask, module)``: the block's own
    hooks.  ``generic_hooks``: False when ``install`` takes care of every layer inside.
    ``check(module)``: why this instance is not handled (None when it is).
    """

    frame_wise: bool = False
    time_axis: int | None = None
    install: Callable[[PaddingMask, Any], None] | None = None
    generic_hooks: bool = True
    check: Callable[[Any], str | None] | None = None


class PaddingMask:
    """Forward hooks that make an encoder blind to the padding of a batch (see the module doc).

    ``blocks``: the toolkit's :class:`Block` table.  Raises ValueError when :meth:`supports` does
    not accept the encoder."""

    def __init__(self, encoder: Any, blocks: Mapping[str, Block]) -> None:
        import torch

        self._torch = torch
        self._lengths: dict[int, Any] | None = None
        ok, why = self.supports(encoder, blocks)
        if not ok:
            raise ValueError(why)
        _walk(self, encoder, "", blocks, None, False, True)

    @staticmethod
    def safe_layers() -> tuple[type, ...]:
        """torch layers that work frame by frame, or that :class:`PaddingMask` hooks by type."""
        import torch.nn as nn

        return (
            nn.Conv1d,
            nn.Conv2d,
            nn.BatchNorm1d,
            nn.BatchNorm2d,
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
            nn.Dropout1d,
            nn.Sequential,
            nn.ModuleList,
            nn.AdaptiveAvgPool1d,
            nn.MaxPool1d,
        )

    @staticmethod
    def supports(encoder: Any, blocks: Mapping[str, Block]) -> tuple[bool, str]:
        """(True, "") when every sub-module is understood; else (False, the first that is not)."""
        try:
            _walk(None, encoder, "", blocks, None, False, True)
        except _Unsupported as exc:
            return False, str(exc)
        return True, ""

    # ------------------------------------------------------------------ lengths
    @contextlib.contextmanager
    def active(self, lengths: Any, max_len: int) -> Iterator[PaddingMask]:
        """Hooks on for one forward of a batch padded to ``max_len`` frames with valid ``lengths``."""
        self._lengths = {int(max_len): lengths}
        try:
            yield self
        finally:
            self._lengths = None

    @property
    def is_active(self) -> bool:
        return self._lengths is not None

    def lengths(self, time_size: int) -> Any:
        """Valid lengths of a tensor whose time axis has ``time_size`` frames."""
        assert self._lengths is not None
        if time_size not in self._lengths:
            raise Untracked(f"no lengths known for a time axis of {time_size} frames")
        return self._lengths[time_size]

    def put(self, time_size: int, lengths: Any) -> None:
        """Record the valid lengths of a time axis of ``time_size`` frames (a block's own hook)."""
        assert self._lengths is not None
        prev = self._lengths.get(time_size)
        if prev is not None and not bool(self._torch.equal(prev, lengths)):
            raise Untracked(f"two different length sets for a time axis of {time_size} frames")
        self._lengths[time_size] = lengths

    def masked_mean(self, x: Any, axis: int = -1) -> Any:
        """Mean of ``x`` over its valid frames along ``axis`` (kept, size 1)."""
        lens = self.lengths(x.shape[axis]).to(x.device)
        valid = valid_mask(lens, x.shape[axis], x.dim(), axis)
        n = lens.clamp(min=1).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
        return x.masked_fill(~valid, 0.0).sum(dim=axis, keepdim=True) / n

    # ------------------------------------------------------------------ the generic hooks
    def _mask_before(self, mod: Any, args: tuple[Any, ...], axis: int, fill: float) -> tuple[Any, ...] | None:
        if self._lengths is None:
            return None
        x = args[0]
        t = x.shape[axis]
        lens = self.lengths(t)
        if bool((lens >= t).all()):
            return None
        valid = valid_mask(lens.to(x.device), t, x.dim(), axis)
        return (x.masked_fill(~valid, fill), *args[1:])

    def _track_after(self, mod: Any, args: tuple[Any, ...], out: Any, axis: int) -> None:
        if self._lengths is None:
            return
        lens = self.lengths(args[0].shape[axis])
        nn = self._torch.nn

        def at(v: Any) -> int:
            return int(v[axis]) if isinstance(v, (tuple, list)) else int(v)

        k, s, d = at(mod.kernel_size), at(mod.stride), at(mod.dilation)
        if isinstance(mod, (nn.Conv1d, nn.Conv2d)) and isinstance(mod.padding, str):
            new = lens.clone() if mod.padding == "same" else (lens - d * (k - 1) - 1) // s + 1
        else:
            span = lens + 2 * at(mod.padding) - d * (k - 1) - 1
            new = -((-span) // s) + 1 if isinstance(mod, nn.MaxPool1d) and mod.ceil_mode else span // s + 1
        self.put(out.shape[axis], new.clamp(min=0, max=out.shape[axis]))

    def _masked_mean_hook(self, mod: Any, args: tuple[Any, ...], out: Any) -> Any:
        if self._lengths is None:
            return None
        x = args[0]
        self.put(1, self._torch.ones_like(self.lengths(x.shape[-1])))
        return self.masked_mean(x)


class _Unsupported(Exception):
    pass


def _walk(
    mask: PaddingMask | None,
    mod: Any,
    name: str,
    blocks: Mapping[str, Block],
    axis: int | None,
    trusted: bool,
    hooks: bool,
) -> None:
    """Check ``mod`` and its sub-modules (raise :class:`_Unsupported` naming the first that is not
    understood); with a ``mask``, install its hooks.  ``axis``: the time axis of a Conv2d here;
    ``trusted``: inside a frame-wise block; ``hooks``: generic hooks wanted here."""
    import torch.nn as nn

    where = name or "<encoder>"
    block = blocks.get(qualname(mod))
    if block is not None:
        why = block.check(mod) if block.check is not None else None
        if why:
            raise _Unsupported(f"layer '{where}' ({qualname(mod)}): {why} is not handled")
        axis = block.time_axis if block.time_axis is not None else axis
        if mask is not None and block.install is not None:
            block.install(mask, mod)
        trusted = trusted or block.frame_wise
        hooks = hooks and block.generic_hooks
    elif not trusted and type(mod) not in PaddingMask.safe_layers():
        raise _Unsupported(f"layer '{where}' ({qualname(mod)}) may mix padded frames into valid ones")
    if hooks and isinstance(mod, (nn.Conv1d, nn.Conv2d)):
        if mod.padding_mode != "zeros":
            raise _Unsupported(f"layer '{where}' pads with {mod.padding_mode!r}, not zeros")
        t = -1 if isinstance(mod, nn.Conv1d) else axis
        if t is None:
            raise _Unsupported(f"layer '{where}' (Conv2d): which of its axes is time is not known")
        if mask is not None:
            mod.register_forward_pre_hook(functools.partial(mask._mask_before, axis=t, fill=0.0))
            mod.register_forward_hook(functools.partial(mask._track_after, axis=t))
    elif hooks and isinstance(mod, nn.MaxPool1d):
        if mask is not None:
            mod.register_forward_pre_hook(functools.partial(mask._mask_before, axis=-1, fill=float("-inf")))
            mod.register_forward_hook(functools.partial(mask._track_after, axis=-1))
    elif hooks and isinstance(mod, nn.AdaptiveAvgPool1d):
        if mod.output_size not in (1, (1,)):
            raise _Unsupported(f"layer '{where}' pools to {mod.output_size} frames (only 1 is handled)")
        if mask is not None:
            mod.register_forward_hook(mask._masked_mean_hook)
    for child_name, child in mod.named_children():
        _walk(mask, child, f"{name}.{child_name}" if name else child_name, blocks, axis, trusted, hooks)
