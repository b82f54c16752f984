"""Speech regions of a recording: where the windows to embed may lie.

Three detectors, one interface (``recording waveform -> sorted disjoint regions in seconds``):

* ``oracle``: the union of the reference turns (:func:`oracle_speech`), the usual condition for
  comparing embedders and clusterers without the detector's errors (WeSpeaker's and Kaldi's
  "oracle SAD" rows);
* ``energy``: the project's energy VAD (:func:`spkflow.features.vad.compute_vad`, Kaldi's
  ``compute-vad`` rule with a noise-floor guard) on 10 ms frames of the whole recording, then
  gaps shorter than ``min_gap`` filled and regions shorter than ``min_len`` dropped;
* ``silero``: silero-vad (the PyPI wheel ``silero-vad`` carries its model: nothing is downloaded;
  imported when first used), at 16 kHz, through the wheel's sequence ONNX model (the streaming
  model's probabilities, blocks of 16 s per call: an hour in about a minute on a loaded CPU).

What it guarantees: the regions lie inside ``[0, duration)``, are sorted and disjoint; a silent
recording gives no regions (not an error: its diarization is empty).  WeSpeaker's voxconverse
recipe fetches silero-vad from torch.hub at run time; here it comes from the installed wheel.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spkflow.diar.regions import Regions, clip, merge_gaps, union
from spkflow.diar.rttm import Turn
from spkflow.features.fbank import FbankOptions, compute_fbank, num_frames
from spkflow.features.vad import VadOptions, compute_vad

__all__ = [
    "DEFAULT_DETECTOR",
    "DETECTORS",
    "Progress",
    "SileroOptions",
    "detect_speech",
    "energy_speech",
    "fbank_in_blocks",
    "oracle_speech",
    "silero_probabilities",
    "silero_regions",
    "silero_speech",
]

DETECTORS = ("oracle", "energy", "silero")
#: the detector of ``python -m spkflow.bin.diarize`` and ``Embedder.diarize`` when none is named
DEFAULT_DETECTOR = "silero"
#: ``progress(seconds)``: called as a detector gets through the recording, with the seconds done so far
Progress = Callable[[float], None]
#: silero-vad's sample rate here (it also takes 8 kHz; 16 kHz is its better model)
SILERO_RATE = 16000


def oracle_speech(turns: Sequence[Turn], duration: float | None = None) -> Regions:
    """The union of the reference turns (cut to ``duration`` when given)."""
    regions = union((t.start, t.end) for t in turns)
    return clip(regions, duration) if duration is not None else regions


def energy_speech(
    wave: np.ndarray,
    sample_rate: int,
    vad: VadOptions | None = None,
    *,
    min_gap: float = 0.3,
    min_len: float = 0.25,
    progress: Progress | None = None,
) -> Regions:
    """Energy-VAD speech regions of a mono waveform (see the module doc)."""
    duration = len(wave) / sample_rate
    opts = FbankOptions(sample_frequency=float(sample_rate), num_mel_bins=40)
    if len(wave) < int(opts.frame_length * sample_rate / 1000):
        return []
    voiced = compute_vad(fbank_in_blocks(wave, sample_rate, opts, progress=progress), vad or VadOptions()) > 0.5
    shift = opts.frame_shift / 1000.0
    edges = np.flatnonzero(np.diff(np.concatenate([[0], voiced.astype(np.int8), [0]])))
    regions = [(s * shift, e * shift) for s, e in zip(edges[::2], edges[1::2], strict=True)]
    return clip(merge_gaps(regions, min_gap, min_len), duration)


def fbank_in_blocks(
    wave: np.ndarray,
    sample_rate: int,
    opts: FbankOptions,
    seconds: float = 60.0,
    progress: Progress | None = None,
) -> np.ndarray:
    """:func:`compute_fbank` of a long recording, ``seconds`` of frames at a time: the same frames
    (each frame reads only its own samples: ``snip_edges``, no dither) to float32 rounding, without
    the whole recording's frame matrix and spectra in memory at once (an hour's took 3-4 GB);
    ``progress`` is told the seconds done after each block."""
    if opts.sample_frequency != sample_rate or not opts.snip_edges or opts.dither != 0.0:
        return compute_fbank(wave, sample_rate, opts)
    shift, size = opts.window_shift, opts.window_size
    total = num_frames(len(wave), opts)
    per = max(1, int(seconds * 1000 / opts.frame_shift))
    blocks = []
    for f in range(0, total, per):
        blocks.append(compute_fbank(wave[f * shift : (min(total, f + per) - 1) * shift + size], sample_rate, opts))
        if progress is not None:
            progress(min(total, f + per) * shift / sample_rate)
    return np.concatenate(blocks)


@functools.lru_cache(maxsize=1)
def _silero_model() -> Any:
    try:
        from silero_vad import load_silero_vad

        return load_silero_vad(sequence=True)  # the wheel's ONNX model of blocks of frames (onnxruntime)
    except ImportError as err:
        raise RuntimeError(
            f"speech detection 'silero' needs the silero-vad and onnxruntime packages ({err}): "
            "bash tools/setup.sh installs them; or pass --speech energy"
        ) from None


def silero_probabilities(x: np.ndarray, progress: Progress | None = None) -> np.ndarray:
    """silero-vad's speech probability of every 32 ms frame of ``x`` (mono float at 16 kHz): its
    own sequence model (``load_silero_vad(sequence=True)``: the streaming model's LSTM run over
    blocks of 512 frames in one ONNX call each, the same probabilities to 1e-6 and the same
    timestamps as ``get_speech_timestamps``; 7x faster here), driven block by block as
    ``SileroVADSequence.audio_forward`` drives it, so that ``progress`` hears of each block."""
    from silero_vad.sequence_vad import RATE_CONFIG, frame_blocks

    model = _silero_model()
    frame, context = RATE_CONFIG[SILERO_RATE]
    hidden = np.zeros((1, 1, 128), dtype=np.float32)
    cell = np.zeros((1, 1, 128), dtype=np.float32)
    probs, done = [], 0
    for block in frame_blocks(np.ascontiguousarray(x, dtype=np.float32), frame, context, model.max_frames):
        values, hidden, cell = model.session.run(["speech_probs", "hn", "cn"], {"input": block, "h": hidden, "c": cell})
        probs.append(values.reshape(-1))
        done += len(block)
        if progress is not None:
            progress(min(len(x), done * frame) / SILERO_RATE)
    return np.concatenate(probs) if probs else np.zeros(0, dtype=np.float32)


@dataclass(frozen=True)
class SileroOptions:
    """silero-vad's rules from frame probabilities to regions (``get_speech_timestamps``'
    parameters, in seconds): speech starts at a probability of ``onset`` and ends below
    ``offset`` (None: ``onset - 0.15``, silero's), after at least ``min_silence`` of it; regions
    shorter than ``min_speech`` are dropped; each is padded by ``pad`` either side."""

    onset: float = 0.2
    offset: float | None = None
    min_speech: float = 0.5
    min_silence: float = 0.75
    pad: float = 0.2

    @classmethod
    def parse(cls, text: str) -> SileroOptions:
        """``"onset=0.4,min_silence=0.25"`` (any of the fields; the rest at their defaults)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, float] = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key.strip() not in fields:
                raise ValueError(
                    f"silero options: {item!r}: expected KEY=VALUE, KEY one of {', '.join(sorted(fields))}"
                )
            try:
                kw[key.strip()] = float(value)
            except ValueError:
                raise ValueError(f"silero options: {item!r}: {value!r} is not a number") from None
        return cls(**kw)


def silero_regions(probs: np.ndarray, samples: int, opts: SileroOptions | None = None) -> Regions:
    """Regions (s) of ``samples`` samples at 16 kHz from their frame probabilities ``probs``, by
    silero-vad's own ``get_speech_timestamps_from_probs`` with ``opts``."""
    from silero_vad import get_speech_timestamps_from_probs

    o = opts or SileroOptions()
    stamps = get_speech_timestamps_from_probs(
        np.asarray(probs, dtype=np.float64).tolist(),
        sampling_rate=SILERO_RATE,
        threshold=o.onset,
        neg_threshold=o.offset,
        min_speech_duration_ms=round(o.min_speech * 1000),
        min_silence_duration_ms=round(o.min_silence * 1000),
        speech_pad_ms=round(o.pad * 1000),
        audio_length_samples=samples,
    )
    regions = [(st["start"] / SILERO_RATE, st["end"] / SILERO_RATE) for st in stamps]
    return clip(merge_gaps(regions, 0.0, o.min_speech), samples / SILERO_RATE)


def silero_speech(
    wave: np.ndarray,
    sample_rate: int,
    opts: SileroOptions | None = None,
    *,
    progress: Progress | None = None,
) -> Regions:
    """silero-vad's speech regions of a mono waveform (resampled to 16 kHz when needed): its
    frame probabilities (:func:`silero_probabilities`) through its own rules
    (:func:`silero_regions`); ``progress`` is told the seconds done."""
    from spkflow.data.resample import resample

    duration = len(wave) / sample_rate
    x = resample(np.asarray(wave, dtype=np.float32), sample_rate, SILERO_RATE) if sample_rate != SILERO_RATE else wave
    if len(x) < 512:
        return []
    return clip(silero_regions(silero_probabilities(x, progress), len(x), opts), duration)


def detect_speech(
    method: str,
    wave: np.ndarray | None,
    sample_rate: int,
    *,
    turns: Sequence[Turn] | None = None,
    duration: float | None = None,
    vad: VadOptions | None = None,
    silero: SileroOptions | None = None,
    progress: Progress | None = None,
) -> Regions:
    """Speech regions by ``method`` (one of :data:`DETECTORS`); ``oracle`` needs ``turns``
    (and no waveform), the others the waveform; ``progress``: told the seconds done (detectors)."""
    if method == "oracle":
        if turns is None:
            raise ValueError("oracle speech needs the reference turns")
        return oracle_speech(turns, duration)
    if wave is None:
        raise ValueError(f"speech detection {method!r} needs the waveform")
    if method == "energy":
        return energy_speech(wave, sample_rate, vad, progress=progress)
    if method == "silero":
        return silero_speech(wave, sample_rate, silero, progress=progress)
    raise ValueError(f"speech detection must be one of {', '.join(DETECTORS)}, got {method!r}")
