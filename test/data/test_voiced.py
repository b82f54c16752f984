"""The VAD rule every crop and shard shares (spkflow.data.voiced): a frame is voiced above 0.5."""

from __future__ import annotations

import numpy as np

from spkflow.data.voiced import voiced_frames


def test_a_frame_is_voiced_above_half_not_at_it() -> None:
    vad = np.array([0.0, 0.5, np.nextafter(0.5, 1.0), 1.0, 0.49], dtype=np.float64)
    assert voiced_frames(vad).tolist() == [2, 3]
    assert voiced_frames(np.array([0.5, 1.0], dtype=np.float32)).tolist() == [1]
    assert voiced_frames(np.array([0.5, 0.5])) is None  # none voiced: all kept, never dropped
    assert voiced_frames(np.ones(3)) is None  # all voiced
