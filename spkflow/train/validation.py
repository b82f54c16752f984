"""Validation EER during training, computed with the code of stages 5 and 6.

Guarantees:

* The trials list is read by :func:`spkflow.score.trial_scoring.read_trials` (a bad line is an
  :class:`~spkflow.core.errors.InputError` naming file and line), scored by
  :func:`spkflow.score.trial_scoring.score_trials` (cosine of L2-normalised embeddings) and measured by
  :func:`spkflow.score.metrics.compute_eer`, so the validation EER of the last epoch is the figure
  stage 6 reports for the same model and set (without score normalisation).
* Each utterance is the stage-2 features through :func:`spkflow.features.fbank.apply_frontend`, the
  input stage 5 gives the model; utterances are grouped longest first by stage 5's
  :func:`plan_batches` and zero-padded by its padding function (the models are padding
  invariant, so the grouping does not change an embedding beyond float rounding).
* Utterances without features (e.g. left out by stage 2 with ``skip_bad``) leave their trials
  out with a warning; what remains must still hold target and non-target trials.
* Features are read once, when the :class:`Validator` is made; :meth:`Validator.eer` leaves
  the model in the mode (train/eval) it found it in.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import numpy as np
import torch

from spkflow.core.errors import InputError
from spkflow.data.ark import KaldiArkReader
from spkflow.embed.base import FRAME_RATE, plan_batches
from spkflow.embed.base import pad as pad_batch
from spkflow.features.fbank import apply_frontend
from spkflow.nnet.models import SpeakerEmbedder
from spkflow.score.metrics import compute_eer
from spkflow.score.trial_scoring import check_both_labels, read_trials, score_trials

__all__ = ["Validator", "embed_features"]

log = logging.getLogger(__name__)


@torch.no_grad()
def embed_features(
    model: SpeakerEmbedder,
    feats: Mapping[str, np.ndarray],
    device: torch.device,
    batch_size: int = 32,
    max_frames: int = 3000,
) -> dict[str, np.ndarray]:
    """Embeddings of whole (frontend-applied) utterances cut to ``max_frames`` frames, in batches
    of at most ``batch_size`` utterances planned as stage 5 plans them."""
    was_training = model.training
    model.eval()
    cut = {k: v[:max_frames] for k, v in feats.items()}
    durations = {k: len(v) / FRAME_RATE for k, v in cut.items()}
    out: dict[str, np.ndarray] = {}
    try:
        for batch in plan_batches(sorted(cut), durations, batch_size, batch_size * max_frames):
            x, lengths = pad_batch([cut[k] for k in batch])
            emb = model(torch.from_numpy(x).to(device), torch.from_numpy(lengths).to(device))
            out.update(zip(batch, emb.float().cpu().numpy(), strict=True))
    finally:
        model.train(was_training)
    return out


class Validator:
    """Validation EER on ``<data_dir>/trials`` with the stage-2 features of ``feats_dir`` (loaded once)."""

    def __init__(self, data_dir: str, feats_dir: str, use_vad: bool, mean_norm: bool) -> None:

        trials_path = os.path.join(data_dir, "trials")
        if not os.path.isfile(trials_path):
            raise InputError(trials_path, None, "cannot read the validation trials: no such file")
        self.trials = read_trials(trials_path)  # InputError: a bad line, or trials of one label only
        utts = sorted(set(self.trials.enroll) | set(self.trials.test))
        reader = KaldiArkReader(os.path.join(feats_dir, "feats.scp"))
        vad_path = os.path.join(feats_dir, "vad.scp")
        vad = KaldiArkReader(vad_path) if use_vad and os.path.isfile(vad_path) else None
        if use_vad and vad is None:
            raise InputError(vad_path, None, "frontend.vad is true but there is no vad.scp for validation")
        missing = {u for u in utts if u not in reader}
        if missing:  # e.g. left out by stage 2 with skip_bad: validation goes on without them
            pairs = zip(self.trials.enroll, self.trials.test, strict=True)
            keep = np.array([a not in missing and b not in missing for a, b in pairs])
            log.warning(
                "validation: %d utterances of %s have no features in %s (e.g. %s): %d of %d trials left out",
                len(missing),
                trials_path,
                reader.scp,
                sorted(missing)[0],
                int((~keep).sum()),
                len(self.trials),
            )
            self.trials = self.trials.subset(keep)
            check_both_labels(self.trials, f" left with features in {reader.scp}")
            utts = [u for u in utts if u not in missing]
        self.feats: dict[str, np.ndarray] = {}
        for u in utts:
            v = vad.read(u) if vad is not None else None
            self.feats[u] = apply_frontend(reader.read(u), v, use_vad=use_vad, mean_norm=mean_norm)
        reader.close()
        if vad is not None:
            vad.close()
        log.info(
            "validation: %d trials (%d target) over %d utterances of %s",
            len(self.trials),
            int(self.trials.target.sum()),
            len(utts),
            data_dir,
        )

    def eer(self, model: SpeakerEmbedder, device: torch.device, batch_size: int, max_frames: int) -> float:
        """Equal error rate in percent of the cosine scores of ``model``'s embeddings."""

        emb = embed_features(model, self.feats, device, batch_size, max_frames)
        result = score_trials(self.trials, emb, emb_source="validation embeddings")
        return float(compute_eer(result.scores, result.labels)[0])
