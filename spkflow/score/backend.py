"""Linear backends on speaker embeddings, fitted on labelled embeddings and applied before
cosine scoring: ``cosine`` (identity), ``wccn`` (within-class covariance normalisation) and
``lda`` (linear discriminant analysis).  Used by verification scoring (stage 6, fitted on the
training set) and by speaker identification (:mod:`spkflow.score.sid`, fitted on the enrolment
utterances): one mechanism for both.

Anchors: Kaldi's ``ivector-compute-lda`` (LDA with the within-class covariance whitened, the
x-vector recipes' step before PLDA), Hatch, Kajarekar and Stolcke's WCCN (Interspeech 2006),
SpeechBrain's ``speechbrain.processing.PLDA_LDA`` and WeSpeaker's cosine + AS-norm.  What this
version guarantees that theirs do not say:

* **One definition of the space.**  ``transform(x) = l2((l2(x) - mean) @ proj)``: inputs are
  L2-normalised first (length normalisation, as Kaldi does before LDA/PLDA), the training mean
  is subtracted (so centring is part of the backend), and the output is L2-normalised, so
  cosine scoring and AS-norm cohorts see the same space as the trial embeddings.
* **Shrinkage on a small training set.**  The within-class covariance is shrunk towards
  ``reg x its mean eigenvalue x I`` before it is inverted, so 125 speakers of 12 utterances
  (or 4 enrolment utterances) give a well-conditioned transform; ``wccn`` whitens it
  (``proj = L^-T`` for ``Sw = L L^T``: the training vectors' within-class covariance becomes
  the identity), ``lda`` then keeps the ``lda_dim`` most discriminant directions.
* **Bad input is named**: an utterance of the embeddings without a speaker in ``utt2spk``,
  fewer than two speakers or no speaker with two utterances raise an error naming the file.
* Saved as a plain ``.npz`` (``name``, ``mean``, ``proj``), written atomically, loaded
  without pickle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError

__all__ = ["BACKENDS", "Backend", "fit_backend", "fit_backend_on", "l2_rows"]

BACKENDS = ("cosine", "wccn", "lda")


def l2_rows(x: np.ndarray) -> np.ndarray:
    """Rows (last axis) scaled to unit length; all-zero rows stay zero."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@dataclass(frozen=True)
class Backend:
    """``transform(x) = l2((l2(x) - mean) @ proj)``; cosine: mean 0, proj = identity."""

    name: str
    mean: np.ndarray
    proj: np.ndarray

    def transform(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.shape[-1] != self.proj.shape[0]:
            raise ValueError(f"{self.name} backend expects {self.proj.shape[0]}-dim embeddings, got {x.shape[-1]}")
        return l2_rows((l2_rows(x) - self.mean) @ self.proj)

    def centred_on(self, mean: np.ndarray) -> Backend:
        """The same projection centred on another mean (of L2-normalised embeddings), e.g. the
        evaluation set's own (unlabelled in-domain centring, ``spkflow.score.eval_report``)."""
        mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        if mean.shape != self.mean.shape:
            raise ValueError(f"{self.name} backend has a {self.mean.shape[0]}-dim mean, got {mean.shape[0]}")
        return replace(self, mean=mean)

    def save(self, path: str | os.PathLike[str]) -> None:
        with atomic_write(path, "wb") as f:
            np.savez(f, name=np.array(self.name), mean=self.mean, proj=self.proj)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Backend:
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls(str(z["name"]), np.asarray(z["mean"], np.float64), np.asarray(z["proj"], np.float64))
        except (OSError, KeyError, ValueError) as err:
            raise InputError(os.fspath(path), None, f"not a backend file (name, mean, proj): {err}") from None


def fit_backend(name: str, x: np.ndarray, labels: Sequence[str], lda_dim: int = 0, reg: float = 0.1) -> Backend:
    """``cosine`` (identity), ``wccn`` or ``lda`` fitted on the embeddings ``x [N, D]`` (L2-normalised
    here) with speaker ``labels``.  The within-class covariance is shrunk towards ``reg x mean
    eigenvalue x I``; ``lda`` keeps ``lda_dim`` directions (default min(D, speakers - 1))."""
    x = l2_rows(np.asarray(x, dtype=np.float64))
    d = x.shape[1]
    if name == "cosine":
        return Backend("cosine", np.zeros(d), np.eye(d))
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (one of {', '.join(BACKENDS)})")
    if reg < 0:
        raise ValueError(f"reg must be >= 0, got {reg}")
    classes = sorted(set(labels))
    y = np.array([classes.index(s) for s in labels])
    counts = np.bincount(y, minlength=len(classes))
    if len(classes) < 2 or counts.max() < 2:
        raise ValueError(f"the {name} backend needs >= 2 speakers and a speaker with >= 2 utterances")
    mu = x.mean(axis=0)
    means = np.stack([x[y == c].mean(axis=0) for c in range(len(classes))])
    within = x - means[y]
    sw = within.T @ within / len(x)
    sw += reg * max(np.trace(sw) / d, 1e-8) * np.eye(d)
    inv = np.linalg.inv(np.linalg.cholesky(sw))  # inv @ sw @ inv.T = I
    if name == "wccn":
        return Backend("wccn", mu, inv.T)
    sb = (means - mu).T @ ((means - mu) * counts[:, None]) / len(x)
    evals, evecs = np.linalg.eigh(inv @ sb @ inv.T)  # sb v = l sw v through sw = L L^T
    keep = lda_dim or min(d, len(classes) - 1)
    return Backend("lda", mu, inv.T @ evecs[:, np.argsort(evals)[::-1][:keep]])


def fit_backend_on(
    name: str,
    embeddings: Mapping[str, np.ndarray],
    utt2spk: Mapping[str, str],
    *,
    emb_source: str = "<embeddings>",
    utt2spk_source: str = "utt2spk",
    lda_dim: int = 0,
    reg: float = 0.1,
) -> Backend:
    """:func:`fit_backend` on every utterance of ``embeddings``, labelled by ``utt2spk`` (an
    utterance without a speaker is an :class:`InputError` naming both sources)."""
    utts = sorted(embeddings)
    missing = [u for u in utts if u not in utt2spk]
    if missing:
        raise InputError(
            utt2spk_source, None, f"{len(missing)} utterance(s) of {emb_source} have no speaker, e.g. {missing[0]!r}"
        )
    if not utts:
        raise InputError(emb_source, None, "no embeddings to fit a backend on")
    try:
        return fit_backend(name, np.stack([embeddings[u] for u in utts]), [utt2spk[u] for u in utts], lda_dim, reg)
    except ValueError as err:
        raise InputError(emb_source, None, str(err)) from None
