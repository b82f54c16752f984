"""Which frames a VAD keeps: the one rule that the whole-utterance frontend
(:func:`spkflow.features.fbank.select_voiced`), the crop loaders (features and audio) and the
shards of voiced frames (:mod:`spkflow.data.shard_jobs`) share, so that a shard holds exactly
the frames the loader would crop from the ark.

A frame is voiced where its VAD value is above 0.5 (``compute-vad`` writes 0 or 1).  An
utterance with no voiced frame keeps all of them: it is never dropped silently (Kaldi's
``select-voiced-frames`` drops it with a warning).
"""

from __future__ import annotations

import numpy as np

__all__ = ["voiced_frames"]


def voiced_frames(vad: np.ndarray) -> np.ndarray | None:
    """Indices of the frames ``vad`` keeps, or None when it keeps them all (every frame is
    voiced, or none is)."""
    idx = np.flatnonzero(np.asarray(vad) > 0.5)
    return idx if 0 < len(idx) < len(vad) else None
