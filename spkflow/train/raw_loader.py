"""N x M training loader on raw audio: crops of waveform, augmented, then fbank, in the workers.

``feats_type: raw`` (the training config's ``frontend``) next to the ark path of
:mod:`spkflow.train.loader`.  Batch ``b`` of epoch ``e`` is ``(feats [N*M, T, F], utt_ids, speed_index [N])``:

* ``T`` is the same per-batch crop length as the ark path (:func:`spkflow.train.batches.crop_frames`).
* Crops come from the voiced part of the utterance, as in the ark path: stage 2's ``vad.scp``
  marks voiced frames; every voiced frame contributes its hop (``frame_shift`` samples) to a
  "voiced waveform", and a crop is a window of it long enough for ``T`` frames (with wrap-around
  when the utterance is shorter, as the ark path).  The start frame is drawn the same way as the
  ark path draws it (from the voiced frame count); the crop's frames straddle the joins of voiced
  runs where the ark path concatenates whole frames.  Without VAD (or when every frame or none is
  voiced) the whole waveform is used.
* Reading: a crop reads only the samples it covers (its voiced-waveform positions mapped to the
  file's samples), one contiguous read from the smallest to the largest (a crop that wraps around
  spans most of the file), where the store can (:meth:`spkflow.train.stores.AudioFiles.samples`:
  WAV or FLAC at the loader's rate, and its rule for the decoded-audio cache); the length the VAD
  is checked against and the crop starts are drawn from comes from the file's header.  The crop's
  samples are those of the whole file decoded, bit for bit, so a batch does not depend on how its
  files were read.
* Speed perturbation (``augment.speed.factors``): one factor per speaker of the batch (drawn
  from the batch generator); a crop of ``ceil(samples * factor)`` samples is resampled to the
  length needed (:func:`spkflow.augment.wave.speed_perturb`), so every crop has ``T`` frames; the
  factor index is returned so that a classification loss can count a perturbed speaker as a new
  class, as the ark path's feature-domain speed perturbation does.  With ``augment.speed.perturb:
  false`` every crop is read at factor 1.0 and labelled with 1.0's class (the base model's
  classifier fine-tuned on unperturbed audio, as WeSpeaker's large-margin fine-tuning does).
* The crop is then augmented (:class:`spkflow.augment.wave.WaveAugment`) and turned into fbank with
  :func:`spkflow.features.fbank.compute_fbank` (stage 2's options, so an un-augmented raw crop equals
  the ark path's features of the same samples); ``mean_norm`` is ``"crop"`` or ``"none"`` (the
  per-utterance mean of the stored features does not describe an augmented crop).
* Where the fbank runs (``fbank_on``, the config's ``train.fbank_on``): ``workers`` computes it per
  crop in the DataLoader workers (numpy); ``device`` returns the augmented waveform crops
  ``[N*M, S]`` instead and :class:`CropFbank` computes fbank and ``mean_norm`` batched on the
  training device (:mod:`spkflow.features.torch_fbank`, within 1e-5 of the workers' numbers), so
  the workers only decode, augment and crop.
* Determinism: the crop starts and speed factors come from a generator seeded by (seed, epoch,
  batch), the augmentation of crop ``i`` from one seeded by (seed, epoch, batch, i): a batch is a
  pure function of the files and those numbers, whatever the number of workers, and a resume at
  batch k gives the batches of an uninterrupted run (``test/train/test_raw_loader.py``).

Throughput against the ark path, and why the augmentation is on the fly rather than stored
copies: ``docs/augmentation.md`` (``test/bench/bench_loader.py --raw``).
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spkflow.augment.wave import speed_perturb
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.ark import KaldiArkReader
from spkflow.data.voiced import voiced_frames
from spkflow.features.fbank import FbankOptions, compute_fbank, num_frames
from spkflow.features.torch_fbank import fbank_batch
from spkflow.train.loader import NxMBatches
from spkflow.train.stores import AudioFiles, check_batches

__all__ = ["NxMWaveDataset", "CropFbank", "samples_for_frames", "FBANK_ON"]

#: ``fbank_on`` of the dataset (the config's ``train.fbank_on`` also takes ``auto``: device on CUDA)
FBANK_ON = ("workers", "device")

_LOADER_PURPOSE = 0x6C6F6164  # "load": the same per-batch stream as the ark path (crop starts)
_SPEED_PURPOSE = 0x73706564  # "sped"
_AUG_PURPOSE = 0x61756720  # "aug "
RAW_MEAN_NORM = ("crop", "none")


def samples_for_frames(frames: int, opts: FbankOptions) -> int:
    """The fewest samples for which :func:`spkflow.features.fbank.num_frames` gives ``frames``."""
    shift, size = opts.window_shift, opts.window_size
    n = (frames - 1) * shift + size if opts.snip_edges else max(1, frames * shift - shift // 2)
    while num_frames(n, opts) < frames:
        n += 1
    return n


class NxMWaveDataset(NxMBatches):
    """Batch ``b`` -> ``(feats [N*M, T, F], utt_ids, speed_index LongTensor [N])``; see the module doc.
    ``speed_index`` is all zeros without speed perturbation (N = len(batch) // num_utt).

    Parameters
    ----------
    store: an audio store (:mod:`spkflow.train.stores`: :class:`~spkflow.train.stores.AudioFiles`
        or :class:`~spkflow.train.stores.AudioShards`, at the fbank options' sample rate), or the
        training data dir (``wav.scp``, optional ``segments``, ``utt2spk``), opened as ``AudioFiles``.
    batches: the epoch's batch list (speaker-major, ``num_utt`` utterances per speaker).
    fbank: stage 2's :class:`FbankOptions` (or its dict).
    vad_scp: stage 2's ``vad.scp`` (needed when ``use_vad``; default: beside ``wav.scp``).
    augment: a :class:`spkflow.augment.wave.WaveAugment` or None; its ``speed_factors`` set the
        speed perturbation.
    utt2spk: the speaker of each utterance (kept out of babble; default: the store's, the data
        dir's ``utt2spk``).
    fbank_on: ``workers`` (features out) or ``device`` (waveform crops ``[N*M, S]`` out, for
        :class:`CropFbank`; ``mean_norm`` is then its business).
    """

    def __init__(
        self,
        store: Any,
        batches: Sequence[Sequence[str]],
        *,
        fbank: FbankOptions | Mapping[str, Any] | None = None,
        seed: int = 0,
        epoch: int = 0,
        crop: int | tuple[int, int] = (140, 180),
        use_vad: bool = True,
        vad_scp: str | os.PathLike[str] | None = None,
        mean_norm: str = "none",
        augment: Any = None,
        num_utt: int = 1,
        utt2spk: Mapping[str, str] | None = None,
        fbank_on: str = "workers",
    ) -> None:

        if fbank is None:
            fbank = FbankOptions()
        self.fbank = fbank if isinstance(fbank, FbankOptions) else FbankOptions.from_dict(dict(fbank))
        self.rate = int(self.fbank.sample_frequency)
        if isinstance(store, (str, os.PathLike)):
            store = AudioFiles(store, self.rate)
        elif store.sample_rate != self.rate:
            raise ValueError(f"{store.name} is read at {store.sample_rate} Hz but the fbank options want {self.rate}")
        if mean_norm not in RAW_MEAN_NORM:
            raise ValueError(f"mean_norm must be one of {RAW_MEAN_NORM} on raw audio, got {mean_norm!r}")
        self.mean_norm = mean_norm
        if fbank_on not in FBANK_ON:
            raise ValueError(f"fbank_on must be one of {FBANK_ON}, got {fbank_on!r}")
        self.fbank_on = fbank_on
        self.augment = augment
        self.speed = list(augment.speed_factors) if augment is not None and augment.speed_factors else None
        # speed.perturb false: the classes of the factors, every crop at 1.0 (large-margin fine-tuning)
        self.fixed_speed = self.speed.index(1.0) if self.speed and not augment.speed_perturb else None
        self.num_utt = int(num_utt)
        self.vad: KaldiArkReader | None = None
        if use_vad:
            path = vad_scp or Path(store.name).parent / "vad.scp"
            if not Path(path).is_file():
                raise InputError(path, None, "use_vad needs stage 2's vad.scp; pass vad_scp or use_vad=False")
            self.vad = KaldiArkReader(path)
        self.utt2spk = dict(store.speakers if utt2spk is None else utt2spk)
        for b, batch in enumerate(batches):
            if self.speed and len(batch) % self.num_utt:
                raise ValueError(f"batch {b}: {len(batch)} utterances is not a multiple of M={self.num_utt}")
        if self.vad is not None:
            check_batches(batches, (self.vad, self.vad.scp))
        super().__init__(store, batches, seed, epoch, crop)

    def batch_numel(self) -> int:
        if not self.batches:
            return 0
        per_crop = self.crop_range[1] * self.fbank.dim
        if self.fbank_on == "device":
            per_crop = samples_for_frames(self.crop_range[1], self.fbank)
        return max(len(b) for b in self.batches) * per_crop

    def _voiced_frames(self, utt: str, samples: int) -> np.ndarray | None:
        """The voiced frames of ``utt`` (``samples`` samples long; None: use the whole waveform)."""
        if self.vad is None:
            return None
        v = self.vad.read(utt, cache_header=False)
        frames = num_frames(samples, self.fbank)
        if len(v) != frames:
            raise UtteranceError(
                utt, self.store.source(utt), f"{len(v)} VAD frames in {self.vad.scp} but the audio gives {frames}"
            )
        return voiced_frames(v)

    def _stream(self, utt: str) -> tuple[Any, np.ndarray | None, int]:
        """(the samples of ``utt`` as the store gives them (``len``, ``take``: whole in memory, or
        left in its file), its voiced frames (None: all), its number of frames as the ark path
        counts them: voiced frames, or all frames)."""

        samples = self.store.samples(utt)
        voiced = self._voiced_frames(utt, len(samples))
        if voiced is not None:
            return samples, voiced, len(voiced)
        frames = num_frames(len(samples), self.fbank)
        if frames <= 0:
            raise UtteranceError(utt, self.store.source(utt), f"{len(samples)} samples is shorter than one frame")
        return samples, None, frames

    def _take(self, stream: tuple[Any, np.ndarray | None, int], start: int, count: int) -> np.ndarray:
        """``count`` samples of the (voiced) waveform from frame ``start`` on, wrapping around at its
        end.  The voiced waveform is each voiced frame's hop (``frame_shift`` samples) in a row, the
        last hop cut at the end of the audio: a position maps to the audio's sample
        ``voiced[p // shift] * shift + p % shift``; only those samples are read (the store's ``take``)."""
        samples, voiced, _ = stream
        shift = self.fbank.window_shift
        length = len(samples) if voiced is None else len(voiced) * shift
        pos = start * shift + np.arange(count)
        if pos[-1] >= length:
            pos %= length
        if voiced is not None:
            pos = np.minimum(voiced[pos // shift] * shift + pos % shift, len(samples) - 1)
        return samples.take(pos)

    def crop(self, utt: str, start: int, count: int) -> np.ndarray:
        """``count`` samples of ``utt``'s (voiced) waveform from frame ``start`` on, as a batch
        takes them before speed perturbation and augmentation (float32)."""
        return self._take(self._stream(utt), start, count)

    def __getitem__(
        self, index: int | tuple[int, torch.Tensor | None]
    ) -> tuple[torch.Tensor, list[str], torch.Tensor, dict[str, int]]:
        """``(feats [N*M, T, F], utts, speed index [N], counts)``; ``counts``: crops per applied
        operation (``speed`` for a factor other than 1, then :class:`WaveAugment`'s names) and ``crops``."""
        b, into = index if isinstance(index, tuple) else (index, None)
        self.store.prepare(b)
        utts = self.batches[b]
        T = self.crop_length(b)
        need = samples_for_frames(T, self.fbank)
        shift = self.fbank.window_shift
        num_spk = len(utts) // self.num_utt if self.speed else 0
        speed_idx = np.zeros(max(1, len(utts) // self.num_utt), dtype=np.int64)  # [N]: all 0 without speed
        factors = np.ones(len(utts))
        if self.fixed_speed is not None:
            speed_idx = np.full(num_spk, self.fixed_speed, dtype=np.int64)
        elif self.speed:
            srng = np.random.default_rng([self.seed, self.epoch, b, _SPEED_PURPOSE])
            speed_idx = srng.integers(len(self.speed), size=num_spk)
            factors = np.asarray(self.speed)[np.repeat(speed_idx, self.num_utt)]
        # samples read per crop, and the frames they span (the ark path's T for factor 1)
        reads = [need if f == 1.0 else int(math.ceil(need * f)) + 2 for f in factors]
        spans = np.array([T if f == 1.0 else -(-(r - need) // shift) + T for f, r in zip(factors, reads, strict=True)])
        streams = [self._stream(u) for u in utts]
        n = np.array([frames for _, _, frames in streams], dtype=np.int64)
        # the start frame exactly as the ark path draws it (same generator, same bounds for factor 1)
        rng = np.random.default_rng([self.seed, self.epoch, b, _LOADER_PURPOSE])
        starts = rng.integers(0, np.where(n >= spans, n - spans + 1, n)).tolist()
        waves = self.fbank_on == "device"
        out = self.batch_tensor((len(utts), need) if waves else (len(utts), T, self.fbank.dim), into)
        buf = out.numpy()
        counts: collections.Counter[str] = collections.Counter(crops=len(utts))
        for i, u in enumerate(utts):
            x = self._take(streams[i], starts[i], reads[i])
            if factors[i] != 1.0:
                x = speed_perturb(x, float(factors[i]))
                if len(x) < need:
                    x = np.pad(x, (0, need - len(x)), mode="wrap")
                x = x[:need]
                counts["speed"] += 1
            if self.augment is not None:
                arng = np.random.default_rng([self.seed, self.epoch, b, _AUG_PURPOSE, i])
                x = self.augment(x, arng, speaker=self.utt2spk.get(u), counts=counts)
            if waves:
                buf[i] = x[:need]
                continue
            try:
                feats = compute_fbank(x, self.rate, self.fbank)
            except ValueError as e:
                raise UtteranceError(u, self.store.source(u), str(e)) from e
            buf[i] = feats[:T]
        if self.mean_norm == "crop" and not waves:
            buf -= buf.mean(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)
        return out, list(utts), torch.from_numpy(np.asarray(speed_idx, dtype=np.int64)), dict(counts)


class CropFbank:
    """Fbank of a batch of equal-length waveform crops ``[B, S]`` on their device -> ``[B, T, F]``
    float32, then ``mean_norm`` (``crop``: each crop's mean over its frames, as the workers'
    path subtracts it): :class:`NxMWaveDataset` with ``fbank_on="device"``.  Dither, when the
    options ask for it, comes from torch's generator of that device (the trainer seeds it per step)."""

    def __init__(self, fbank: FbankOptions | Mapping[str, Any], mean_norm: str = "none") -> None:
        self.fbank = fbank if isinstance(fbank, FbankOptions) else FbankOptions.from_dict(dict(fbank))
        if mean_norm not in RAW_MEAN_NORM:
            raise ValueError(f"mean_norm must be one of {RAW_MEAN_NORM} on raw audio, got {mean_norm!r}")
        self.mean_norm = mean_norm

    def __call__(self, waves: torch.Tensor) -> torch.Tensor:
        lengths = torch.full((waves.shape[0],), waves.shape[1], dtype=torch.int64, device=waves.device)
        feats, _ = fbank_batch(waves, lengths, self.fbank)
        if self.mean_norm == "crop":
            feats -= feats.mean(dim=1, keepdim=True, dtype=torch.float64).to(feats.dtype)
        return feats
