"""Stage 3's check of the training settings against the corpus, before any batch is planned.

A new user's corpus meets the template's defaults: ``--num_spk 32`` on 20 speakers, crops of
200-300 frames on 1-second clips (about 59 voiced frames each), a 6.19 M-parameter ECAPA-TDNN on
120 clips.  The batch planner refuses the first in its own terms once planning has started, the
loader wraps the short clips around without a word, and the size warning came at stage 4 only.
:func:`check_training` looks at them all at once and says what to change, naming the option:

* **errors** (the run cannot work): N (``--num_spk``) is more than the speakers with at least M
  (``--num_utt``) utterances (every speaker with ``--short_speakers repeat``): no N x M batch can
  be made; the message gives the largest N for this M and, when one exists, the M for which N
  fits.  Fewer batches per epoch than training processes is one too (a rank would have none);
* **warning**, crops much longer than the speech: the longest crop (``train.crop_max_frames``) is
  more than :data:`CROP_PER_MEDIAN` (2) times the median voiced length of the training
  utterances.  The typical utterance is then repeated more than twice over inside a crop (the
  loader wraps a short one around), so most of each crop is frames the model has just seen,
  paid for in compute.  Why 2: the demo's 80-160 frames on a median of 254 voiced frames
  (speechocean762 train) and VoxCeleb's 200-frame crops on medians of ~700 are far below it, and
  a crop up to twice the speech still holds each frame at most twice; the template's 200-300 on
  1-second clips (median 59) is 5 times over.  Suggested: half the median to the median;
* **warning**, a model large for the data: :func:`spkflow.train.sizing.model_size_warning`
  (parameters per training utterance and per training speaker; the thresholds and why: there).

The voiced lengths are read for at most :data:`SAMPLE_UTTS` utterances (every k-th one of the
sorted list), so the check takes seconds on VoxCeleb's million.  ESPnet's and WeSpeaker's
recipes start training with whatever the config says.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from spkflow.core.errors import InputError
from spkflow.data.tables import read_kv
from spkflow.data.voiced import voiced_frames
from spkflow.features.fbank import FbankOptions
from spkflow.train.batches import num_batches
from spkflow.train.sizing import model_size_warning
from spkflow.train.spk2utt import Spk2Utt, load_spk2utt

__all__ = ["CROP_PER_MEDIAN", "SAMPLE_UTTS", "Findings", "check_training", "crop_warning", "speakers_error"]

#: the longest crop may be this many times the median voiced length before a warning
CROP_PER_MEDIAN = 2.0
#: utterances whose voiced length is read (evenly spread over the sorted list)
SAMPLE_UTTS = 2000


@dataclasses.dataclass
class Findings:
    """What :func:`check_training` found: errors (the run cannot work) and warnings."""

    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)


def speakers_error(table: Spk2Utt, num_spk: int, num_utt: int, short_speakers: str, world_size: int) -> str | None:
    """Why no N x M batch (or none per rank) can be made of the speakers of ``table``, or None."""
    counts, where = np.asarray(table.counts), table.path
    eligible = int(np.count_nonzero(counts >= num_utt)) if short_speakers == "drop" else len(counts)
    if eligible < num_spk:
        with_m = f" with at least {num_utt} utterances" if short_speakers == "drop" else ""
        ranked = np.sort(counts)[::-1]
        ways = []
        if eligible >= 2:
            ways.append(f"lower --num_spk to {eligible} or fewer")
        elif len(ranked) >= 2 and ranked[1] >= 2:
            m = int(ranked[1])
            ways.append(f"lower --num_utt to {m} and --num_spk to {int(np.count_nonzero(counts >= m))} or fewer")
        if short_speakers == "drop" and len(ranked) >= num_spk:
            fits = int(ranked[num_spk - 1])  # the largest M that num_spk speakers have
            if 2 <= fits < num_utt:
                ways.append(f"--num_utt {fits} ({num_spk} speakers have that many)")
            ways.append(f"--short_speakers repeat (all {len(counts)} speakers, the short ones repeated)")
        how = ", or ".join(ways) if ways else "add recordings: no batch of 2 speakers x 2 utterances can be made"
        return f"--num_spk {num_spk} is more than the {eligible} training speakers{with_m} ({where}): {how}"
    per_epoch = num_batches(table, num_spk, num_utt, 1, short_speakers)
    if per_epoch < world_size:
        return (
            f"{per_epoch} batch(es) of {num_spk} x {num_utt} per epoch from {len(counts)} speakers ({where}), fewer "
            f"than the {world_size} training processes: lower --num_spk or --num_utt, or train on fewer processes"
        )
    return None


def crop_warning(crop_min: int, crop_max: int, median_voiced: float, what: str) -> str | None:
    """A warning when ``crop_max`` exceeds :data:`CROP_PER_MEDIAN` x the median voiced length, or None."""
    if median_voiced <= 0 or crop_max <= CROP_PER_MEDIAN * median_voiced:
        return None
    lo, hi = max(1, int(median_voiced // 2)), max(1, int(median_voiced))
    return (
        f"crops of {crop_min}-{crop_max} frames (train.crop_min_frames, train.crop_max_frames) on training "
        f"utterances of {median_voiced:g} {what} frames (median): a crop repeats the typical utterance "
        f"{crop_max / median_voiced:.1f} times over; set them to about {lo}-{hi} (half the median to the median)"
    )


def utterance_frames(
    train_dir: str, vad: bool, frame_shift_ms: float, sample: int = SAMPLE_UTTS
) -> tuple[list[int], str]:
    """Frames per utterance of a sample: voiced frames from stage 2's ``vad.scp`` (with ``vad``),
    else ``utt2num_frames``, else ``utt2dur`` (a data dir: training on audio).  Returns the
    lengths and what they count ("voiced" or "")."""
    vad_scp = os.path.join(train_dir, "vad.scp")
    if vad and os.path.isfile(vad_scp):
        import kaldiio

        table = read_kv(vad_scp)
        keys = sorted(table)[:: max(1, math.ceil(len(table) / sample))]
        lengths = []
        for k in keys:
            v = np.asarray(kaldiio.load_mat(table[k]))
            idx = voiced_frames(v)
            lengths.append(len(v) if idx is None else len(idx))
        return lengths, "voiced"
    for name, per_second in (("utt2num_frames", None), ("utt2dur", 1000.0 / frame_shift_ms)):
        path = os.path.join(train_dir, name)
        if os.path.isfile(path):
            values = read_kv(path)
            try:
                return [
                    int(float(values[k]) * (per_second or 1)) for k in sorted(values)[:: max(1, len(values) // sample)]
                ], ""
            except ValueError as err:
                raise InputError(path, None, f"not a number: {err}") from None
    return [], ""


def check_training(
    cfg: Mapping[str, Any] | None,
    *,
    spk2utt: str,
    num_spk: int,
    num_utt: int,
    short_speakers: str = "drop",
    world_size: int = 1,
    train_dir: str | None = None,
    fbank_conf: str | None = None,
) -> Findings:
    """The findings for a normalised training config ``cfg`` (see the module doc): ``spk2utt`` of
    the training set, the batch shape, the processes, the stage-2 features dir (or, training on
    audio, the data dir) and stage 2's fbank options (the model's input size).  Without ``cfg``:
    the batch shape only."""
    found = Findings()
    table = load_spk2utt(spk2utt)
    err = speakers_error(table, num_spk, num_utt, short_speakers, world_size)
    if err:
        found.errors.append(err)
    if cfg is None:
        return found
    fbank = FbankOptions.from_kaldi_conf(fbank_conf) if fbank_conf else FbankOptions()
    tcfg = cfg["train"]
    if train_dir:
        vad = bool(cfg["frontend"].get("vad", True))
        lengths, what = utterance_frames(train_dir, vad, fbank.frame_shift)
        if lengths:
            warn = crop_warning(
                int(tcfg["crop_min_frames"]), int(tcfg["crop_max_frames"]), float(np.median(lengths)), what
            )
            if warn:
                found.warnings.append(warn)
    from spkflow.nnet.models import build_model

    model_cfg = dict(cfg["model"])
    model_cfg.setdefault("input_dim", fbank.dim)
    params = sum(p.numel() for p in build_model(model_cfg).parameters())
    warn = model_size_warning(params, int(table.num_utts), int(table.num_speakers))
    if warn:
        found.warnings.append(warn)
    return found
