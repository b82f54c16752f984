"""The scoring that travels with a model: from two embeddings to a score, a log-likelihood ratio
and a same-speaker decision.

A :class:`Scoring` is stage 6's back end of a model: the linear backend (WCCN / LDA, fitted on
the training embeddings), the centring, the AS-norm cohort (the training speakers' mean
embeddings) with its size, and a score calibration (:mod:`spkflow.score.calibration`: linear
logistic regression from the final score to an LLR) with the decision threshold for a stated
prior.  Stage 6 writes it into the model dir (``python -m spkflow.bin.calibrate``:
``scoring.yaml`` + ``scoring.npz``), stage 7 packs the two files, and stage 6's own scores
(:mod:`spkflow.score.eval_report`), ``Embedder.verify`` / ``Embedder.score``, ``python -m
spkflow.bin.verify`` and ``identify`` all score through it: one code path, so they agree.

A score, for raw embeddings ``a`` and ``b``:

1. centring and backend: with a backend, ``l2((l2(x) - m) @ P)`` (:class:`~spkflow.score.backend.Backend`,
   ``m`` its training mean); without one, ``x - m`` with ``m`` the training speakers' mean embedding
   (stage 6's ``--score_center``), or nothing when the recipe did not centre;
2. cosine of the two (``norm_score`` when there is no cohort);
3. AS-norm against the cohort put through the same step 1, top ``cohort_size``
   (:func:`spkflow.score.trial_scoring.asnorm_stats`): ``norm_score``, what stage 6 writes to ``scores``;
4. ``llr = w * norm_score + b``; ``same_speaker = llr > threshold``, ``threshold = -logit(p_eff)``
   (0 for p_target 0.5 and equal costs: :func:`~spkflow.score.calibration.bayes_threshold`).

**Domain centring.**  ``domain``: raw embeddings of unlabelled recordings like the scored ones
(verify uses the recordings its pairs name, when there are at least :data:`MIN_DOMAIN` and the
scoring centres at all): their mean replaces ``m`` in step 1, for the trial and cohort vectors
alike (stage 6's ``--score_eval_mean``, Kaldi SRE16's in-domain centring).  Measured on the demo
(egs/speechocean762/spk1/RESULTS.md, "Calibrated decisions"): centred on the training mean, the
non-target scores of a corpus unlike the training data shift by several standard deviations and
no threshold carries over (the decisions' half total error rate on LibriSpeech is 3.0 x its EER);
centred on its own 51 recordings it is 1.0 x, on 10 of them drawn at random 1.0-1.4 x.  The
calibration is fitted the same way: on its trials centred on their own recordings.  A lone pair
(or fewer than :data:`MIN_DOMAIN` recordings, ``domain=PAIR``) is centred on the mean of the
recordings the calibration was fitted on (``pair_mean`` in ``scoring.npz``), the centring the
calibration saw, instead of the training mean; measured single-pair against batch decisions:
egs/speechocean762/spk1/RESULTS.md, "One pair".

What it guarantees beyond WeSpeaker's ``compute_similarity`` (a cosine rescaled to [0, 1]) and
SpeechBrain's ``verify_files`` (a fixed cosine threshold of 0.25): the decision comes from an
LLR fitted on trials the reported figures do not come from (``fitted`` says which), for a stated
prior; the files are checked (format, version, the npz's sha256 recorded in the yaml, shapes)
and read without pickle; a model without them scores plain cosine and says so.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from spkflow.core.atomic import atomic_write, write_text_atomic
from spkflow.core.errors import InputError
from spkflow.score.backend import Backend, l2_rows
from spkflow.score.calibration import (
    LogisticCalibration,
    actual_dcf,
    bayes_threshold,
    calibration_trials_problem,
    cllr,
    fit_logistic,
)
from spkflow.score.metrics import compute_eer, compute_min_dcf
from spkflow.score.trial_scoring import (
    ScoreResult,
    Trials,
    asnorm_stats,
    check_both_labels,
    read_cohort,
    read_embeddings,
    read_mean,
    read_trials,
    score_trials,
)
from spkflow.score.unsupervised_calibration import GATE, BatchCalibration, calibrate_batch

__all__ = [
    "CALIBRATIONS",
    "MIN_DOMAIN",
    "PAIR",
    "SCORING_FILES",
    "Decision",
    "Scoring",
    "Verdict",
    "calibrate_trials",
    "decision_metrics",
    "fit_scoring",
    "has_scoring",
    "indexed_cosine",
    "plain_cosine",
]

#: the two files of a scoring in a model dir (and members of a pack)
SCORING_FILES = ("scoring.yaml", "scoring.npz")
FORMAT = "spkflow-scoring"
FORMAT_VERSION = 1
#: fewest recordings whose mean verify centres a batch on (fewer: the calibration set's mean)
MIN_DOMAIN = 10
#: ``domain`` of a lone pair (or fewer than MIN_DOMAIN recordings): the calibration set's mean
PAIR = "pair"
#: how a batch of pairs is calibrated (:meth:`Scoring.on_batch`): ``auto`` the batch's own
#: calibration when trusted and it raises the model's threshold by more than
#: :data:`~spkflow.score.unsupervised_calibration.GATE` std, else the model's; ``batch`` the
#: batch's own whenever trusted; ``model`` always the model's (the behaviour before)
CALIBRATIONS = ("auto", "batch", "model")


@dataclass(frozen=True)
class Decision:
    """The operating point: target prior and costs; ``threshold`` is the Bayes LLR threshold."""

    p_target: float = 0.5
    c_miss: float = 1.0
    c_fa: float = 1.0

    @property
    def threshold(self) -> float:
        return bayes_threshold(self.p_target, self.c_miss, self.c_fa) + 0.0  # no -0.0

    def to_dict(self) -> dict[str, float]:
        return {"p_target": self.p_target, "c_miss": self.c_miss, "c_fa": self.c_fa, "llr_threshold": self.threshold}


@dataclass(frozen=True)
class Verdict:
    """Scores of pairs (floats for one pair, arrays for several): ``score`` the plain cosine of
    the model's embeddings, ``norm_score`` after backend, centring and AS-norm (stage 6's score),
    ``llr`` the calibrated log-likelihood ratio and ``same_speaker`` ``llr > threshold`` (both
    None without a calibration)."""

    score: Any
    norm_score: Any
    llr: Any
    same_speaker: Any
    threshold: float | None


@dataclass(frozen=True)
class Scoring:
    """See the module docstring.  Build with :meth:`load`, :meth:`from_options` or ``Scoring()``
    (plain cosine); ``cohort`` and ``mean`` are raw embeddings (``[S, D]``, ``[D]``)."""

    backend: Backend | None = None
    mean: np.ndarray | None = None
    cohort: np.ndarray | None = None
    cohort_size: int = 0
    calibration: LogisticCalibration | None = None
    decision: Decision = Decision()
    fitted: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    #: the centring for a lone pair (:data:`PAIR`): ``[2, D]``, the raw mean and the mean of the
    #: L2-normalised embeddings of the recordings the calibration was fitted on
    pair_mean: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.backend is not None and self.mean is not None:
            raise ValueError("a backend centres on its own training mean: no second mean")
        if self.cohort is not None and not 2 <= min(self.cohort_size, len(self.cohort)):
            raise ValueError(f"AS-norm needs a cohort of >= 2 and cohort_size >= 2, got {self.cohort_size}")
        if self.calibration is not None and len(self.calibration.weights) != 1:
            raise ValueError(
                f"calibration on {self.calibration.names}: this version calibrates the score alone "
                "(quality measures are not computed here)"
            )

    # ------------------------------------------------------------------ description
    @property
    def is_plain(self) -> bool:
        """Plain cosine: no backend, no centring, no cohort, no calibration."""
        return self.backend is None and self.mean is None and self.cohort is None and self.calibration is None

    @property
    def centres(self) -> bool:
        """Whether scores are centred on a training mean (a backend's, or a raw one): only then is
        a batch centred on its own mean instead (a scoring without centring never is)."""
        return self.backend is not None or self.mean is not None

    @property
    def label(self) -> str:
        """The name stage 6's RESULTS.md gives these scores, e.g. ``WCCN, AS-norm (top 25)``."""
        name = "cosine" if self.cohort is None else f"AS-norm (top {min(self.cohort_size, len(self.cohort))})"
        if self.mean is not None:
            name += ", centred"
        if self.backend is not None and self.backend.name != "cosine":
            name = f"{self.backend.name.upper()}, {name}"
        return name

    def describe(self) -> str:
        """One paragraph for a model card or a log: what the scores are and where the LLRs come from."""
        parts = []
        if self.backend is not None and self.backend.name != "cosine":
            dims = f"{self.backend.proj.shape[0]} -> {self.backend.proj.shape[1]} dims"
            parts.append(f"a {self.backend.name.upper()} backend ({dims}) fitted on the training embeddings")
        elif self.mean is not None:
            parts.append("the training speakers' mean embedding subtracted")
        parts.append("cosine scoring")
        if self.cohort is not None:
            k = min(self.cohort_size, len(self.cohort))
            parts.append(f"AS-norm against the top {k} of {len(self.cohort)} training speakers")
        text = ", ".join(parts) + f" (`{self.label}`)"
        if self.calibration is None:
            return text + "; no calibration: scores, no LLRs or decisions."
        c = self.calibration
        return (
            f"{text}; LLR = {c.weights[0]:.4g} x score {c.bias:+.4g} (linear logistic calibration fitted on "
            f"{c.fitted_on or 'unnamed trials'}); same speaker when LLR > {self.decision.threshold:.3g} "
            f"(p_target {self.decision.p_target:g}, c_miss {self.decision.c_miss:g}, c_fa {self.decision.c_fa:g}).  "
            + (
                f"A batch of >= {MIN_DOMAIN} recordings is centred on its own mean first, a single pair on the "
                + ("calibration set's mean." if self.pair_mean is not None else "training mean.")
                if self.centres
                else "No centring (the recipe scored uncentred cosines)."
            )
        )

    def with_decision(self, decision: Decision) -> Scoring:
        return replace(self, decision=decision)

    def on_batch(self, scores: Any, n_recordings: int, mode: str = "auto") -> tuple[Scoring, BatchCalibration | None]:
        """This scoring with the calibration a batch of pairs is decided by (``mode``, one of
        :data:`CALIBRATIONS`): ``scores`` the batch's final scores, ``n_recordings`` how many
        recordings its pairs name.  Returns the scoring (the batch's own calibration in place of
        the model's when :func:`~spkflow.score.unsupervised_calibration.calibrate_batch` says so)
        and that outcome, whose ``reason`` says which decides and why (None: the model has no
        calibration, or ``model``)."""
        if mode not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {mode!r}")
        if self.calibration is None or mode == "model":
            return self, None
        b = calibrate_batch(
            scores,
            n_recordings=n_recordings,
            model=self.calibration,
            threshold=self.decision.threshold,
            gate=GATE if mode == "auto" else -np.inf,
        )
        return (replace(self, calibration=b.calibration) if b.used else self), b

    # ------------------------------------------------------------------ building
    @classmethod
    def from_options(
        cls,
        *,
        backend_path: str | None = None,
        cohort_scp: str | None = None,
        cohort_size: int = 200,
        mean_scp: str | None = None,
    ) -> Scoring:
        """Stage 6's options as a scoring: a backend file, a cohort scp (AS-norm), a mean scp (centring)."""
        if backend_path and mean_scp:
            raise ValueError(
                f"{backend_path}: a backend subtracts its own training mean; do not centre on {mean_scp} as well"
            )
        backend = Backend.load(backend_path) if backend_path else None
        cohort = read_cohort(cohort_scp) if cohort_scp else None
        mean = read_mean(mean_scp) if mean_scp else None
        return cls(backend, mean, cohort, cohort_size if cohort is not None else 0)

    # ------------------------------------------------------------------ scoring
    def _centred(self, domain: np.ndarray | str | None) -> tuple[Backend | None, np.ndarray | None]:
        """(backend, raw mean) for this call: the training ones, centred on ``domain``, or with
        ``domain`` :data:`PAIR` on the calibration set's mean (the training one without it)."""
        if isinstance(domain, str):
            if domain != PAIR:
                raise ValueError(f"domain must be embeddings [M, D], {PAIR!r} or None, got {domain!r}")
            if self.pair_mean is None or not self.centres:
                return self.backend, self.mean
            if self.backend is not None:
                return self.backend.centred_on(self.pair_mean[1]), None
            return None, self.pair_mean[0]
        if domain is None:
            return self.backend, self.mean
        own = np.asarray(domain, dtype=np.float64)
        if own.ndim != 2 or own.shape[0] == 0 or not np.all(np.isfinite(own)):
            raise ValueError(f"domain must be finite embeddings [M, D], M >= 1, got shape {own.shape}")
        if self.backend is not None:  # the backend's mean lives among L2-normalised vectors
            return self.backend.centred_on(l2_rows(own).mean(axis=0)), None
        return None, own.mean(axis=0)

    def score_trials(
        self,
        trials: Trials,
        embeddings: Mapping[str, np.ndarray],
        *,
        emb_source: str = "<embeddings>",
        skip_missing: bool = False,
        domain: np.ndarray | str | None = None,
        cohort_exclude: Mapping[str, int] | None = None,
    ) -> ScoreResult:
        """Stage 6's scores of ``trials`` (:func:`~spkflow.score.trial_scoring.score_trials` after the
        backend, with the cohort): ``raw_scores`` the cosines in the backend's space,
        ``scores`` the final ``norm_score``."""
        backend, mean = self._centred(domain)
        emb: Mapping[str, np.ndarray] = embeddings
        cohort = self.cohort
        if backend is not None:
            keys = [k for k in {*trials.enroll, *trials.test} if k in embeddings]
            if keys:
                mat = np.stack([np.asarray(embeddings[k], dtype=np.float64).reshape(-1) for k in keys])
                emb = dict(zip(keys, _transform(backend, mat, emb_source), strict=True))
            if cohort is not None:
                cohort = _transform(backend, cohort, "the cohort")
        return score_trials(
            trials,
            emb,
            emb_source=emb_source,
            skip_missing=skip_missing,
            cohort=cohort,
            cohort_size=self.cohort_size,
            mean=mean,
            cohort_exclude=cohort_exclude,
        )

    def space(self, x: Any, domain: np.ndarray | str | None = None) -> np.ndarray:
        """Raw embeddings ``[N, D]`` in the scoring's space (step 1, then L2-normalised): what
        the cosine of :meth:`score_trials` is taken between."""
        backend, mean = self._centred(domain)
        v = np.atleast_2d(np.asarray(x, dtype=np.float64))
        if backend is not None:
            v = _transform(backend, v, "embeddings")
        if mean is not None:
            v = v - mean
        return l2_rows(v)

    def enrol(self, groups: list[np.ndarray], domain: np.ndarray | str | None = None) -> np.ndarray:
        """Speaker models ``[S, D']``: each group's embeddings in the space, averaged and
        L2-normalised (the speaker models of :mod:`spkflow.score.sid`)."""
        return l2_rows(np.stack([self.space(g, domain).mean(axis=0) for g in groups]))

    def score_models(self, test: np.ndarray, models: np.ndarray, domain: np.ndarray | str | None = None) -> np.ndarray:
        """Final scores ``[T, S]`` of raw test embeddings against speaker models from
        :meth:`enrol` (cosine, then AS-norm of both sides as in :meth:`score_trials`)."""
        t = self.space(test, domain)
        raw = t @ models.T
        if self.cohort is None:
            return raw
        c = self.space(self.cohort, domain)
        k = min(self.cohort_size, len(c))
        mu_t, sd_t = asnorm_stats(t, c, k)
        mu_m, sd_m = asnorm_stats(models, c, k)
        # 0.5 * ((raw - mu_t) / sd_t + (raw - mu_m) / sd_m), the same operations in place: two
        # [T, S] arrays at a time, not five (an hour's 4,800 windows scored against each other)
        out = raw - mu_t[:, None]
        out /= sd_t[:, None]
        raw -= mu_m[None, :]
        raw /= sd_m[None, :]
        out += raw
        out *= 0.5
        return out

    def llr(self, norm_score: Any) -> np.ndarray | None:
        """Calibrated LLRs of final scores, any shape (None without a calibration)."""
        if self.calibration is None:
            return None
        x = np.asarray(norm_score, dtype=np.float64)
        out = self.calibration.llr(x.reshape(-1))
        return out.reshape(x.shape) if x.ndim else out

    def verdict(self, cosine: np.ndarray, norm_score: np.ndarray, *, single: bool = False) -> Verdict:
        """A :class:`Verdict` from plain cosines and final scores (``single``: floats, not arrays)."""
        llr = self.llr(norm_score)
        same = None if llr is None else llr > self.decision.threshold
        thr = None if llr is None else self.decision.threshold
        if single:
            return Verdict(
                float(cosine[0]),
                float(norm_score[0]),
                None if llr is None else float(llr[0]),
                None if same is None else bool(same[0]),
                thr,
            )
        return Verdict(cosine, norm_score, llr, same, thr)

    def score(self, emb_a: Any, emb_b: Any, *, domain: Any = None) -> Verdict:
        """Scores of embedding pairs: ``emb_a``, ``emb_b`` one embedding ``[D]`` each (floats
        returned) or ``[N, D]`` row by row (arrays).  ``domain``: raw embeddings ``[M, D]`` of
        recordings like these to centre on, :data:`PAIR` (the calibration set's mean), or None
        (the training mean: stage 6's default)."""
        a, b = np.asarray(emb_a, dtype=np.float64), np.asarray(emb_b, dtype=np.float64)
        single = a.ndim == 1 and b.ndim == 1
        a, b = np.atleast_2d(a), np.atleast_2d(b)
        if a.shape != b.shape or a.ndim != 2 or a.shape[0] == 0:
            raise ValueError(f"emb_a and emb_b must both be [D] or [N, D] of one shape, got {a.shape} and {b.shape}")
        n = a.shape[0]
        emb = {f"a{i}": a[i] for i in range(n)} | {f"b{i}": b[i] for i in range(n)}
        trials = Trials.from_pairs(((f"a{i}", f"b{i}", False) for i in range(n)), "<pairs>", labelled=False)
        dom = domain if domain is None or isinstance(domain, str) else np.atleast_2d(np.asarray(domain, np.float64))
        result = self.score_trials(trials, emb, domain=dom)
        return self.verdict(plain_cosine(a, b), result.scores, single=single)

    # ------------------------------------------------------------------ files
    def save(self, model_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write ``scoring.npz`` then ``scoring.yaml`` (which names the npz's sha256) into ``model_dir``."""
        d = Path(model_dir)
        arrays: dict[str, np.ndarray] = {}
        if self.backend is not None:
            arrays.update(
                backend_name=np.array(self.backend.name), backend_mean=self.backend.mean, backend_proj=self.backend.proj
            )
        if self.mean is not None:
            arrays["mean"] = np.asarray(self.mean, dtype=np.float64)
        if self.cohort is not None:
            arrays["cohort"] = np.asarray(self.cohort, dtype=np.float64)
        if self.pair_mean is not None:
            arrays["pair_mean"] = np.asarray(self.pair_mean, dtype=np.float64)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        data = buf.getvalue()
        with atomic_write(d / "scoring.npz", "wb", encoding=None) as f:
            f.write(data)
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "scoring": self.label,
            "backend": self.backend.name if self.backend is not None else "cosine",
            "centred": "backend training mean"
            if self.backend is not None
            else ("training mean" if self.mean is not None else "no"),
            "cohort": None
            if self.cohort is None
            else {"speakers": len(self.cohort), "size": min(self.cohort_size, len(self.cohort))},
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "decision": self.decision.to_dict(),
            "domain": {
                "min_recordings": MIN_DOMAIN,
                "fewer": "the calibration set's mean" if self.pair_mean is not None else "the training mean",
            },
            "fitted": dict(self.fitted),
            "arrays": {"file": "scoring.npz", "sha256": hashlib.sha256(data).hexdigest()},
            "description": self.describe(),
        }
        write_text_atomic(d / "scoring.yaml", yaml.safe_dump(meta, sort_keys=False, width=100))
        return d / "scoring.yaml", d / "scoring.npz"

    @classmethod
    def load(cls, model_dir: str | os.PathLike[str]) -> Scoring:
        """The scoring of a model dir; :class:`InputError` naming the file when one is missing or bad."""
        d = Path(model_dir)
        for name in SCORING_FILES:
            if not (d / name).is_file():
                raise InputError(d / name, None, "not found: stage 6 writes scoring.yaml and scoring.npz together")
        return cls.from_bytes((d / "scoring.yaml").read_bytes(), (d / "scoring.npz").read_bytes(), str(d))

    @classmethod
    def from_bytes(cls, yaml_bytes: bytes, npz_bytes: bytes, source: str) -> Scoring:
        """From the two files' contents (a pack's members); ``source`` names them in errors."""
        where = os.path.join(source, "scoring.yaml")
        try:
            meta = yaml.safe_load(yaml_bytes.decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise InputError(where, None, f"not valid YAML: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise InputError(where, None, f"not a scoring file: no 'format: {FORMAT}'")
        if meta.get("format_version") != FORMAT_VERSION:
            raise InputError(
                where, None, f"format version {meta.get('format_version')!r}; this spkflow reads {FORMAT_VERSION}"
            )
        if (meta.get("arrays") or {}).get("sha256") != hashlib.sha256(npz_bytes).hexdigest():
            raise InputError(where, None, "scoring.npz is not the file this scoring.yaml was written with (sha256)")
        try:
            with np.load(io.BytesIO(npz_bytes), allow_pickle=False) as z:
                arr = {k: z[k] for k in z.files}
            backend = None
            if "backend_proj" in arr:
                backend = Backend(str(arr["backend_name"]), arr["backend_mean"].astype(np.float64), arr["backend_proj"])
            cal = meta.get("calibration")
            cohort_info = meta.get("cohort") or {}
            scoring = cls(
                backend,
                arr.get("mean"),
                arr.get("cohort"),
                int(cohort_info.get("size", 0)) if "cohort" in arr else 0,
                None if cal is None else LogisticCalibration.from_dict(cal),
                Decision(**{k: float(v) for k, v in (meta.get("decision") or {}).items() if k != "llr_threshold"}),
                dict(meta.get("fitted") or {}),
                source,
                arr.get("pair_mean"),
            )
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise InputError(where, None, f"bad scoring: {type(exc).__name__}: {exc}") from None
        dims = {
            len(v)
            for v in (
                scoring.mean,
                *(() if scoring.cohort is None else scoring.cohort[:1]),
                *(() if scoring.pair_mean is None else scoring.pair_mean),
            )
            if v is not None
        }
        if scoring.pair_mean is not None and scoring.pair_mean.shape[0] != 2:
            raise InputError(where, None, f"pair_mean must be [2, D], got {scoring.pair_mean.shape}")
        if scoring.backend is not None:
            dims.add(scoring.backend.proj.shape[0])
            if scoring.backend.mean.shape != (scoring.backend.proj.shape[0],):
                raise InputError(where, None, "backend mean and projection disagree in dimension")
        if len(dims) > 1:
            raise InputError(where, None, f"arrays of different dimensions {sorted(dims)}")
        return scoring

    @property
    def dim(self) -> int | None:
        """Embedding dimension it expects (None: any)."""
        if self.backend is not None:
            return int(self.backend.proj.shape[0])
        for v in (self.mean, self.cohort):
            if v is not None:
                return int(np.shape(v)[-1])
        return None


def has_scoring(model_dir: str | os.PathLike[str]) -> bool:
    """Whether ``model_dir`` holds a scoring (stage 6 of a recipe that calibrates)."""
    return (Path(model_dir) / "scoring.yaml").is_file()


def plain_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of raw embeddings (the model's plain score)."""
    return np.einsum("nd,nd->n", l2_rows(np.asarray(a, np.float64)), l2_rows(np.asarray(b, np.float64)))


def indexed_cosine(emb: np.ndarray, ia: np.ndarray, ib: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Cosines of the pairs of rows ``(emb[ia[k]], emb[ib[k]])``: each row normalised once, the
    pairs gathered a chunk at a time (memory stays that of the rows, not of the pairs)."""
    unit = l2_rows(np.asarray(emb, dtype=np.float64))
    out = np.empty(len(ia))
    for a in range(0, len(ia), chunk):
        out[a : a + chunk] = np.einsum("nd,nd->n", unit[ia[a : a + chunk]], unit[ib[a : a + chunk]])
    return out


def _transform(backend: Backend, x: np.ndarray, source: str) -> np.ndarray:
    try:
        return backend.transform(x)
    except ValueError as err:
        raise InputError(source, None, str(err)) from None


# ----------------------------------------------------------------------------- calibration


def calibrate_trials(
    result: ScoreResult,
    *,
    prior: float = 0.5,
    quality: np.ndarray | None = None,
    names: tuple[str, ...] | None = None,
    fitted_on: str = "",
) -> LogisticCalibration:
    """A :class:`LogisticCalibration` fitted on scored, labelled trials (``result.scores``, plus
    quality-measure columns ``quality [n, k]`` when given): the step stage 6 shares between the
    pack's calibration and quality-measure functions."""
    if not result.trials.labelled:
        raise InputError(result.trials.path, None, "calibration needs labelled trials (utt1 utt2 target|nontarget)")
    check_both_labels(result.trials, " to calibrate on")
    x = result.scores[:, None] if quality is None else np.column_stack([result.scores, quality])
    return fit_logistic(x, result.labels, prior=prior, names=names, fitted_on=fitted_on)


def fit_scoring(
    trials_path: str,
    xvector_scp: str,
    *,
    backend_path: str | None = None,
    cohort_scp: str | None = None,
    cohort_size: int = 200,
    mean_scp: str | None = None,
    decision: Decision = Decision(),
    set_name: str = "",
) -> Scoring:
    """Stage 6's scoring (the options of :meth:`Scoring.from_options`) with a calibration fitted
    on the labelled ``trials_path`` scored with ``xvector_scp``, centred on those trials' own
    recordings as verify centres a batch (the training mean when there are fewer than
    :data:`MIN_DOMAIN`).  ``fitted`` records the trials, the calibration's in-sample figures and
    the files the backend, cohort and mean came from (``sources``: stage 6's metrics.json names them)."""
    trials = read_trials(trials_path)
    n_tar = int(np.count_nonzero(trials.target))
    too_few, _ = calibration_trials_problem(n_tar, len(trials) - n_tar)
    if too_few:
        raise InputError(trials_path, None, too_few)
    emb = read_embeddings(xvector_scp, {*trials.enroll, *trials.test})
    base = Scoring.from_options(
        backend_path=backend_path, cohort_scp=cohort_scp, cohort_size=cohort_size, mean_scp=mean_scp
    )
    own = np.stack([np.asarray(v, dtype=np.float64).reshape(-1) for v in emb.values()]) if emb else None
    domain = own if base.centres and own is not None and len(own) >= MIN_DOMAIN else None
    result = base.score_trials(trials, emb, emb_source=xvector_scp, domain=domain)
    name = set_name or trials_path
    cal = calibrate_trials(
        result,
        prior=decision.p_target,
        fitted_on=f"{name} ({int(result.labels.sum())} target / {int((result.labels == 0).sum())} non-target trials)",
    )
    llr = cal.llr(result.scores)
    figures = decision_metrics(llr, result.labels, decision)
    fitted = {
        "set": set_name,
        "trials": trials_path,
        "xvector_scp": xvector_scp,
        "n_target": int(result.labels.sum()),
        "n_nontarget": int((result.labels == 0).sum()),
        "centred_on": f"its {len(emb)} recordings"
        if domain is not None
        else ("the training mean" if base.centres else "nothing (the scoring does not centre)"),
        "in_sample": {k: round(float(figures[k]), 6) for k in ("cllr", "hter", "p_miss", "p_fa")},
        "eer": round(float(compute_eer(result.scores, result.labels)[0]), 6),
        "sources": {"backend": backend_path or "", "cohort_scp": cohort_scp or "", "mean_scp": mean_scp or ""},
    }
    pair_mean = None if domain is None else np.stack([domain.mean(axis=0), l2_rows(domain).mean(axis=0)])
    return replace(base, calibration=cal, decision=decision, fitted=fitted, pair_mean=pair_mean)


def decision_metrics(
    llr: np.ndarray, labels: np.ndarray, decision: Decision, p_targets: tuple[float, ...] = (0.01, 0.05)
) -> dict[str, float]:
    """How good the LLRs and the decisions ``llr > decision.threshold`` are on labelled trials:
    ``cllr`` (bits), ``p_miss`` / ``p_fa`` / ``hter`` (percent, of those decisions), and the
    actual and minimum DCF per p_target (the gap is what the calibration costs there)."""
    llr = np.asarray(llr, dtype=np.float64)
    lab = np.asarray(labels).astype(bool)
    accept = llr > decision.threshold
    p_miss = float((~accept[lab]).mean())
    p_fa = float(accept[~lab].mean())
    out: dict[str, float] = {
        "cllr": cllr(llr, lab),
        "llr_threshold": decision.threshold,
        "p_target": decision.p_target,
        "p_miss": 100.0 * p_miss,
        "p_fa": 100.0 * p_fa,
        "hter": 50.0 * (p_miss + p_fa),
    }
    for p in p_targets:
        out[f"act_dcf_p{p:g}"] = actual_dcf(llr, lab, p)
        out[f"min_dcf_p{p:g}"] = compute_min_dcf(llr, lab, p)
    return out
