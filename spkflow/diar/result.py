"""What diarizing one recording gives back: :class:`Diarization`, the turns of one recording with
the ways a user takes them out (an RTTM file, a ``pyannote.core.Annotation``, a loop over turns).

>>> d = Embedder.from_pretrained("spk_train.zip").diarize("meeting.flac")   # doctest: +SKIP
>>> d.speakers                                   # ['spk1', 'spk2', ...] in order of first speech
>>> for t in d: print(t.start, t.end, t.speaker)  # Turn(recording, start, end, speaker), 10 ms times
>>> d.to_rttm("meeting.rttm")                    # atomic; a file spkflow did not write is refused
>>> d.to_annotation()                            # pyannote.core.Annotation (pyannote.metrics needs it)

What it guarantees
------------------
* **Times on the 10 ms frame**: every start and end is rounded to :data:`FRAME` (``2.26``, never
  ``2.2600000000000002``), turns left empty by the rounding are dropped, and the turns are sorted
  by (start, end, speaker); reading the RTTM back (:meth:`from_rttm`) gives an equal object.
* **RTTM-safe**: the recording and speaker ids are one RTTM field each (checked when made).
* **Nothing spkflow writes replaces a file it did not write** (:meth:`to_rttm`): the file is
  written atomically and entered in its folder's marker (:mod:`spkflow.diar.written`), as the
  command's RTTMs are; an existing file not in the marker is refused unless ``overwrite``.

Anchor: pyannote.audio's pipelines return a ``pyannote.core.Annotation`` (segments, tracks,
labels) whose times are the model's frame times as floats and whose ``write_rttm`` writes into an
open file, replacing whatever it was.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from spkflow.diar.rttm import Turn, read_rttm, safe_id, write_rttm
from spkflow.diar.written import PENDING, holding, write_marker

__all__ = ["FRAME", "Diarization", "on_frames"]

#: the time step turns are rounded to (s): the 10 ms frame shift of the features
FRAME = 0.01


def on_frames(t: float) -> float:
    """``t`` seconds rounded to the 10 ms frame, as the nearest float to its decimal (``2.26``)."""
    return round(float(t), 2)


@dataclass(frozen=True)
class Diarization:
    """Who spoke when in one recording: ``recording`` (its id) and ``turns`` (sorted by start, on
    10 ms frames).  Iterating over it, ``len`` and indexing give its turns, as the list
    ``Embedder.diarize`` returned before."""

    recording: str
    turns: tuple[Turn, ...]

    @classmethod
    def of(cls, recording: str, turns: Iterable[Turn]) -> Diarization:
        """The turns of ``recording`` rounded to the frame and sorted (those of other recordings:
        an error); ids that are not one RTTM field are an error naming them."""
        out = []
        for t in turns:
            if t.recording != recording:
                raise ValueError(f"a turn of recording {t.recording!r} in the diarization of {recording!r}")
            s, e = on_frames(t.start), on_frames(t.end)
            if e > s:
                out.append(Turn(recording, s, e, t.speaker))
        for what, v in [("recording", recording), *(("speaker", t.speaker) for t in out)]:
            if safe_id(v) != v:
                raise ValueError(
                    f"{what} id {v!r} is empty or holds whitespace: not one RTTM field (use {safe_id(v)!r})"
                )
        return cls(recording, tuple(sorted(out, key=lambda t: (t.start, t.end, t.speaker))))

    @classmethod
    def from_rttm(cls, path: str | os.PathLike[str], recording: str | None = None) -> Diarization:
        """The turns of ``recording`` in an RTTM file (None: its only recording; several are an
        error naming them), read by :func:`spkflow.diar.rttm.read_rttm`."""
        rttm = read_rttm(path)
        recs = rttm.recordings()
        if recording is None:
            if len(recs) > 1:
                raise ValueError(
                    f"{os.fspath(path)} holds {len(recs)} recordings ({', '.join(recs[:3])}, ...): name one"
                )
            recording = recs[0] if recs else Path(path).stem
        return cls.of(recording, (t for t in rttm.turns if t.recording == recording))

    # ------------------------------------------------------------------ what it holds
    @property
    def speakers(self) -> list[str]:
        """The speakers in order of first speech."""
        return list(dict.fromkeys(t.speaker for t in self.turns))

    @property
    def speech(self) -> float:
        """Seconds with at least one speaker."""
        total, end = 0.0, float("-inf")
        for t in self.turns:
            if t.end > end:
                total += t.end - max(t.start, end)
                end = t.end
        return round(total, 3)

    def __iter__(self) -> Iterator[Turn]:
        return iter(self.turns)

    def __len__(self) -> int:
        return len(self.turns)

    @overload
    def __getitem__(self, i: int) -> Turn: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Turn, ...]: ...
    def __getitem__(self, i: int | slice) -> Turn | tuple[Turn, ...]:
        return self.turns[i]

    def __repr__(self) -> str:
        return (
            f"Diarization({self.recording!r}: {len(self.speakers)} speakers, {len(self.turns)} turns, "
            f"{self.speech:.2f} s of speech)"
        )

    # ------------------------------------------------------------------ ways out
    def to_rttm(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the turns as an RTTM file (ten fields, millisecond times), atomically, and enter it
        in its folder's marker; a file there that spkflow did not write is refused (an
        :class:`~spkflow.core.errors.InputError` naming it) unless ``overwrite``.  Returns the path."""
        p = Path(path)
        text = "".join(f"{t.recording} {t.start} {t.end} {t.speaker}\n" for t in self.turns)
        with holding(p.parent, [p.name], overwrite=overwrite) as written:
            written[p.name] = PENDING
            write_marker(p.parent, written)
            write_rttm(p, self.turns)
            written[p.name] = "api:" + hashlib.sha256(text.encode()).hexdigest()[:24]
            write_marker(p.parent, written)
        return p

    def to_annotation(self) -> Any:
        """The turns as a ``pyannote.core.Annotation`` (uri: the recording; one track per turn;
        labels: the speakers), for pyannote.metrics and pyannote's tools."""
        try:
            from pyannote.core import Annotation, Segment
        except ImportError:
            raise RuntimeError("to_annotation needs pyannote.core (pip install pyannote.core)") from None
        ann = Annotation(uri=self.recording)
        for i, t in enumerate(self.turns):
            ann[Segment(t.start, t.end), i] = t.speaker
        return ann
