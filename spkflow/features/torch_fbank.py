"""Kaldi fbank, energy VAD and the frontend in torch, batched, on any device (the GPU path).

Padded waveforms + lengths in, padded frames + frame counts out::

    feats, frames = fbank_batch(waves [B, S], lengths [B], opts)        # [B, T, F] float32, [B]
    voiced = vad_batch(feats, frames, vad_opts)                         # [B, T] bool
    x, n = frontend_batch(feats, frames, voiced, mean_norm)             # what the model sees

or all three at once with :class:`BatchFrontend` (what stage 5 runs on the model's device with
``--fbank-on device``, and the raw training loader with ``train.fbank_on: device``).

What it guarantees
------------------
* **The numpy path's numbers.**  Each row equals :func:`spkflow.features.fbank.compute_fbank`
  of the row's first ``lengths[b]`` samples within 1e-5 on the log scale (every option of
  :class:`~spkflow.features.fbank.FbankOptions`; dither excepted, whose noise is drawn from torch's
  generator), on CPU and CUDA: ``test/features/test_torch_fbank.py`` checks real speech of every
  rate the recipes use (16 kHz, and 8 kHz audio resampled to 16 kHz as stage 2 reads
  dsp20_8k / FSDD).  :func:`vad_batch` gives exactly :func:`~spkflow.features.vad.compute_vad`'s
  decisions on the same features (the same float64 arithmetic, numpy's percentile rule), and
  :func:`frontend_batch` :func:`~spkflow.features.fbank.apply_frontend`'s frames.
* **Float64 up to the power spectrum**, as the numpy version, and for the same reason: the lowest
  mel bins of quiet frames lie 100-120 dB under the frame's peak, and float32 (``precision``)
  moves them by up to 0.04 on the log scale on speechocean762, failing the 1e-3 bound on every
  corpus here (``bench_gpu.py --parts parity``: docs/gpu.md).  On a GPU that should cost
  little (~25 MB of tensors per 6 s utterance: under a tenth of an H100's bandwidth at 10,000
  utterances/s; an estimate, docs/gpu.md).  The mel projection runs in float64 too (no TF32, no autocast: the
  frontend switches autocast off), the log and the output are float32.
* **Batched = alone.**  A row's frames depend on its own samples only; padding frames
  (``t >= frames[b]``) are zero.  Rows shorter than one frame raise ``ValueError`` naming the
  row (the callers check lengths per utterance first, so an utterance is named there).

Anchors: ``torchaudio.compliance.kaldi.fbank`` takes one waveform (no batch, no lengths) and
computes in the input's dtype (float32 in practice: the errors above); Lhotse's
``Wav2LogFilterBank`` / ``torchaudio.transforms.MelSpectrogram`` batch but are not Kaldi's numbers
(other mel scale, window and DC handling); WeSpeaker and SpeechBrain compute fbank per utterance
in the data loader, ESPnet in the model (float32, padded frames not zeroed).
"""

from __future__ import annotations

import functools
import math

import torch

from spkflow.features.fbank import FbankOptions, mel_matrix, window
from spkflow.features.vad import VadOptions

__all__ = ["frame_counts", "fbank_batch", "vad_batch", "frontend_batch", "BatchFrontend"]

_EPS = 1.1920928955078125e-07  # float32 epsilon: Kaldi's floor on filterbank energies


def frame_counts(lengths: torch.Tensor, opts: FbankOptions) -> torch.Tensor:
    """:func:`spkflow.features.fbank.num_frames` of each length (int64, same device)."""
    n = lengths.to(torch.int64)
    shift, size = opts.window_shift, opts.window_size
    if opts.snip_edges:
        return torch.where(n < size, torch.zeros_like(n), 1 + (n - size).clamp_min(0) // shift)
    return (n + shift // 2) // shift


@functools.lru_cache(maxsize=32)
def _constants(opts: FbankOptions, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(window [size], mel matrix [padded/2 + 1, bins]) as float64 tensors on ``device``."""
    w = torch.tensor(window(opts), dtype=torch.float64, device=device)
    m = torch.tensor(mel_matrix(opts), dtype=torch.float64, device=device)
    return w, m


def _windowed_fast(x: torch.Tensor, t: int, opts: FbankOptions, win: torch.Tensor) -> torch.Tensor:
    """``snip_edges`` frames without dither or energy, in one pass over the frame matrix (the
    numpy fast path, batched): pre-emphasis once on the signal; per frame it then differs only by
    ``(1 - c) * frame_mean`` and in column 0."""
    shift, size, c = opts.window_shift, opts.window_size, opts.preemphasis_coefficient
    starts = torch.arange(t, device=x.device) * shift
    if opts.remove_dc_offset:
        csum = torch.nn.functional.pad(torch.cumsum(x, dim=1), (1, 0))
        means = (csum[:, starts + size] - csum[:, starts]) / size
    else:
        means = x.new_zeros(x.shape[0], t)
    pre = x.clone()
    if c != 0.0:
        pre[:, 1:] -= c * x[:, :-1]
    frames = pre.unfold(1, size, shift)[:, :t] - ((1.0 - c) * means)[..., None]
    frames[..., 0] = (x[:, starts] - means) * (1.0 - c)
    return frames.mul_(win)


def _frame_matrix(x: torch.Tensor, lengths: torch.Tensor, t: int, opts: FbankOptions) -> torch.Tensor:
    """Frames [B, t, size] as Kaldi's ExtractWindow cuts them from each row's own samples
    (reflected around both of the row's edges when not ``snip_edges``)."""
    shift, size = opts.window_shift, opts.window_size
    if opts.snip_edges:
        return x.unfold(1, size, shift)[:, :t].clone()
    span = (t - 1) * shift + size  # samples covered by t frames, starting shift//2 - size//2
    pos = torch.arange(span, device=x.device) + (shift // 2 - size // 2)
    n = lengths.to(torch.int64)[:, None]
    idx = torch.where(pos < 0, -pos - 1, pos).expand(x.shape[0], -1)  # -1 -> 0: the edge sample repeats
    idx = torch.where(idx >= n, 2 * n - 1 - idx, idx)
    idx = torch.minimum(idx.clamp_min(0), (n - 1).clamp_min(0))  # only for rows shorter than half a window
    return torch.gather(x, 1, idx).unfold(1, size, shift)[:, :t].clone()


def fbank_batch(
    waves: torch.Tensor,
    lengths: torch.Tensor,
    opts: FbankOptions | None = None,
    *,
    generator: torch.Generator | None = None,
    precision: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-mel filterbanks of a padded batch: ``waves [B, S]`` (float, [-1, 1], at
    ``opts.sample_frequency``; samples past ``lengths[b]`` are ignored) -> ``(feats [B, T, F]
    float32, frames [B] int64)`` on the waves' device, ``T = max(frames)``, padding frames zero.
    ``generator`` draws the dither (only when ``opts.dither != 0``).  ``precision``: of everything
    before the log (float32 only to measure what it costs in accuracy: see the module doc)."""
    opts = opts or FbankOptions()
    if waves.ndim != 2 or lengths.ndim != 1 or lengths.shape[0] != waves.shape[0]:
        raise ValueError(f"expected waves [B, S] and lengths [B], got {tuple(waves.shape)} and {tuple(lengths.shape)}")
    lengths = lengths.to(waves.device)
    frames = frame_counts(lengths, opts)
    if waves.shape[0] == 0:
        return waves.new_zeros((0, 0, opts.dim), dtype=torch.float32), frames
    short = (frames <= 0).nonzero().flatten().tolist()
    if short:
        b = short[0]
        raise ValueError(
            f"row {b}: {int(lengths[b])} samples at {int(opts.sample_frequency)} Hz is shorter than one "
            f"frame ({opts.window_size} samples)"
        )
    if int(lengths.max()) > waves.shape[1]:
        raise ValueError(f"lengths up to {int(lengths.max())} but the waves have {waves.shape[1]} samples")
    t = int(frames.max())
    win, mel = (c.to(precision) for c in _constants(opts, str(waves.device)))
    with torch.autocast(waves.device.type, enabled=False):
        x = waves.to(precision) * 32768.0
        energy = None
        if opts.snip_edges and opts.dither == 0.0 and not opts.use_energy:
            fr = _windowed_fast(x, t, opts, win)
        else:
            fr = _frame_matrix(x, lengths, t, opts)
            if opts.dither != 0.0:
                fr += opts.dither * torch.randn(fr.shape, generator=generator, dtype=fr.dtype, device=fr.device)
            if opts.remove_dc_offset:
                fr -= fr.mean(dim=-1, keepdim=True)
            if opts.use_energy and opts.raw_energy:
                energy = (fr * fr).sum(-1)
            if opts.preemphasis_coefficient != 0.0:
                c = opts.preemphasis_coefficient
                fr = torch.cat([fr[..., :1] * (1.0 - c), fr[..., 1:] - c * fr[..., :-1]], dim=-1)
            fr = fr.mul_(win)
            if opts.use_energy and not opts.raw_energy:
                energy = (fr * fr).sum(-1)
        spec = torch.fft.rfft(fr, n=opts.padded_window_size)
        del fr
        ri = torch.view_as_real(spec)
        power = ri[..., 0].square() + ri[..., 1].square()
        del spec, ri
        if not opts.use_power:
            power = power.sqrt()
        out = (power @ mel).to(torch.float32)
        if opts.use_log_fbank:
            out = out.clamp_min(_EPS).log()
        if energy is not None:
            log_e = energy.clamp_min(_EPS).log()
            if opts.energy_floor > 0.0:
                log_e = log_e.clamp_min(math.log(opts.energy_floor))
            log_e = log_e.to(torch.float32)[..., None]
            out = torch.cat([out, log_e] if opts.htk_compat else [log_e, out], dim=-1)
    valid = torch.arange(t, device=out.device) < frames[:, None]
    return out.mul_(valid[..., None]).contiguous(), frames


def _percentile(sorted_rows: torch.Tensor, n: torch.Tensor, q: float) -> torch.Tensor:
    """numpy's ``percentile(x, q)`` (method "linear", the same float64 operations) of each row's
    first ``n[b]`` values, given the rows sorted ascending with the padding at the end."""
    vi = (n - 1).to(torch.float64) * (q / 100.0)
    prev = vi.floor()
    last = vi >= (n - 1).to(torch.float64)
    gamma = vi - prev
    i = torch.where(last, n - 1, prev.to(torch.int64))
    j = torch.where(last, n - 1, i + 1)
    a = sorted_rows.gather(1, i[:, None])[:, 0]
    b = sorted_rows.gather(1, j[:, None])[:, 0]
    diff = b - a
    return torch.where(gamma >= 0.5, b - diff * (1.0 - gamma), a + diff * gamma)


def vad_batch(feats: torch.Tensor, frames: torch.Tensor, opts: VadOptions | None = None) -> torch.Tensor:
    """:func:`spkflow.features.vad.compute_vad` of each row's first ``frames[b]`` frames of
    log-mel ``feats [B, T, F]`` -> voiced ``[B, T]`` bool (False on padding)."""
    opts = opts or VadOptions()
    bsz, t = feats.shape[:2]
    n = frames.to(device=feats.device, dtype=torch.int64)
    valid = torch.arange(t, device=feats.device) < n[:, None]
    if t == 0:
        return valid
    f = feats.to(torch.float64)
    peak = f.amax(dim=-1, keepdim=True)
    energy = (peak[..., 0] + (f - peak).exp().sum(-1).log()) - math.log(opts.fft_bins)
    energy = energy.masked_fill(~valid, 0.0)
    count = n.clamp_min(1).to(torch.float64)
    threshold = opts.vad_energy_threshold + opts.vad_energy_mean_scale * (energy.sum(1) / count)
    if opts.vad_floor_margin > 0:
        rows = energy.masked_fill(~valid, math.inf).sort(dim=1).values
        m = n.clamp_min(1)
        floor, top = _percentile(rows, m, opts.vad_floor_percentile), _percentile(rows, m, 95.0)
        guard = (top - floor) > 2 * opts.vad_floor_margin
        threshold = torch.where(guard, torch.maximum(threshold, floor + opts.vad_floor_margin), threshold)
    above = (energy > threshold[:, None]) & valid
    c = opts.vad_frames_context
    if c == 0:
        return above
    csum = torch.nn.functional.pad(above.to(torch.float64).cumsum(1), (1, 0))
    i = torch.arange(t, device=feats.device)[None, :].expand(bsz, -1)
    lo, hi = (i - c).clamp_min(0), torch.minimum(i + c + 1, n[:, None])
    num = csum.gather(1, hi.clamp_min(0)) - csum.gather(1, lo)
    den = (hi - lo).to(torch.float64)  # the window is cut at the edges, as in Kaldi
    return (num >= den * opts.vad_proportion_threshold) & valid


def frontend_batch(
    feats: torch.Tensor, frames: torch.Tensor, voiced: torch.Tensor | None = None, mean_norm: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`spkflow.features.fbank.apply_frontend` per row: the voiced frames of each row
    moved to its front (all of them when none is voiced, or without ``voiced``), then the mean over
    them subtracted (``mean_norm``).  Returns ``(x [B, T', F], lengths [B])``, ``T' = max(lengths)``,
    padding zero."""
    bsz, t, dim = feats.shape
    n = frames.to(device=feats.device, dtype=torch.int64)
    steps = torch.arange(t, device=feats.device)
    valid = steps < n[:, None]
    x = feats
    if voiced is not None:
        keep = voiced & valid
        count = keep.sum(1)
        keep = torch.where((count == 0)[:, None], valid, keep)  # never drop an utterance: all frames
        n = torch.where(count == 0, n, count)
        order = torch.where(keep, steps, steps + t).argsort(dim=1)
        x = feats.gather(1, order[..., None].expand(-1, -1, dim))
        valid = steps < n[:, None]
    width = int(n.max()) if bsz else 0
    x, valid = x[:, :width], valid[:, :width, None]
    if mean_norm:
        mean = (x.to(torch.float64) * valid).sum(1, keepdim=True) / n.clamp_min(1)[:, None, None]
        x = x - mean.to(x.dtype)
    return (x * valid).contiguous(), n


class BatchFrontend:
    """Fbank -> energy VAD -> frontend of a padded waveform batch, on the batch's device: the
    input of a spkflow model (its ``config.yaml`` ``frontend``), as the numpy path computes it
    per utterance in the loader workers.  ``__call__(waves [B, S], lengths [B]) -> (x [B, T, F]
    float32, lengths [B])``."""

    def __init__(
        self, fbank: FbankOptions, vad: VadOptions | None = None, use_vad: bool = False, mean_norm: bool = False
    ) -> None:
        if fbank.dither != 0.0:
            raise ValueError("fbank on the device needs dither 0 (its noise would not be the numpy path's)")
        self.fbank, self.vad, self.use_vad, self.mean_norm = fbank, vad or VadOptions(), use_vad, mean_norm

    def __call__(self, waves: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats, frames = fbank_batch(waves, lengths, self.fbank)
        voiced = vad_batch(feats, frames, self.vad) if self.use_vad else None
        return frontend_batch(feats, frames, voiced, self.mean_norm)
