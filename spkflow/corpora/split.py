"""One corpus into a training set and a test set by speaker: no speaker in both.

:func:`split_speakers` holds out ``test`` speakers (a count, or a share of them) chosen by a
seeded permutation of the ``LC_ALL=C``-sorted speaker ids.  What it guarantees:

* the two sets' speakers are disjoint and together are all of them; every utterance of a
  speaker goes with it;
* the split is a pure function of (the speaker ids, ``test``, ``seed``): the same folder gives
  the same sets on any machine, in whatever order its files were found, and adding recordings
  of speakers already there moves no speaker;
* the test set has at least 2 speakers (non-target trials need two) and the training set at
  least 2 (an N x M batch needs N >= 2); a share is rounded to the nearest count within those
  bounds, and a corpus of fewer than 4 speakers is refused (``ValueError``, saying why).

Anchor: Kaldi's ``utils/subset_data_dir_tr_cv.sh --cv-spk-percent P --seed S`` splits a data
dir by speaker too, from a shuffled speaker list; here the split comes with the data dirs'
other guarantees (sorted, validated, written only where spkflow may write) and trials sized
for the test set (:mod:`spkflow.corpora.trials`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from spkflow.corpora.base import CorpusData
from spkflow.data.tables import c_sorted

__all__ = ["MIN_SPEAKERS", "split_speakers", "held_out_count"]

#: speakers each side keeps at least
MIN_SPEAKERS = 2


def held_out_count(num_speakers: int, test: float) -> int:
    """How many of ``num_speakers`` go to the test set: ``test`` itself when it is a whole number
    >= 1, else ``round(test * num_speakers)``; always within [2, num_speakers - 2]."""
    if num_speakers < 2 * MIN_SPEAKERS:
        raise ValueError(
            f"{num_speakers} speaker(s): a split by speaker needs at least {2 * MIN_SPEAKERS} "
            f"({MIN_SPEAKERS} to train, {MIN_SPEAKERS} to test)"
        )
    if not test > 0 or (test >= 1 and test != int(test)):
        raise ValueError(f"test speakers {test!r}: give a share in (0, 1) or a whole number >= 1")
    want = int(test) if test >= 1 else math.floor(test * num_speakers + 0.5)
    if want > num_speakers - MIN_SPEAKERS:
        raise ValueError(
            f"{int(test)} test speakers of {num_speakers} leave fewer than {MIN_SPEAKERS} to train"
            if test >= 1
            else f"a test share of {test:g} of {num_speakers} speakers leaves fewer than {MIN_SPEAKERS} to train"
        )
    return max(MIN_SPEAKERS, want)


def split_speakers(data: CorpusData, test: float, seed: int = 0) -> tuple[CorpusData, CorpusData]:
    """``(training set, test set)`` of ``data`` by speaker (see the module doc)."""
    speakers = c_sorted({u.spk for u in data.utterances})
    k = held_out_count(len(speakers), test)
    order = np.random.default_rng(seed).permutation(len(speakers))
    held = {speakers[i] for i in order[:k].tolist()}

    def part(keep: bool, suffix: str) -> CorpusData:
        utts = [u for u in data.utterances if (u.spk in held) == keep]
        names = {u.utt for u in utts}
        spk = {u.spk for u in utts}
        return replace(
            data,
            name=f"{data.name} ({suffix})",
            utterances=utts,
            spk2gender={s: g for s, g in data.spk2gender.items() if s in spk},
            durations=None if data.durations is None else {u: d for u, d in data.durations.items() if u in names},
            trials=None,
        )

    return part(False, "training speakers"), part(True, "test speakers")
