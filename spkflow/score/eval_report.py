"""Stage 6 outputs: score one evaluation set and write its files; summarise an experiment.

:func:`evaluate_set` turns ``trials`` + ``xvector.scp`` (+ an optional AS-norm cohort and a
fitted linear backend, :mod:`spkflow.score.backend`, or a model's whole scoring with its
calibration, :mod:`spkflow.score.model_scoring`, through which it scores in either case) into
``<outdir>/scores`` (``utt1 utt2 score target|nontarget``), ``metrics.json``, ``det.png`` and
``score_hist.png``.  :func:`write_results_md` (re)writes ``<exp>/RESULTS.md`` from every
``<exp>/eval/<set>/metrics.json``.  Guarantees:

* the outputs of an earlier run of the set are removed first (``metrics.json`` first), so
  after a failed re-score nothing in ``outdir`` looks current; the new files are written
  under temporary names in ``outdir`` and moved into place only when all of them are
  complete, ``metrics.json`` last: a ``metrics.json`` never describes scores that are not on
  disk, and an interrupted run leaves no ``scores`` without it (bar the instant between two
  renames);
* a trial list without both target and non-target trials (also after ``skip_missing``) is
  an :class:`~spkflow.core.errors.InputError` naming the trials file, before anything is written;
* ``metrics.json`` always has ``eer`` (percent), ``eer_threshold``, ``min_dcf_p0.01``,
  ``min_dcf_p0.05`` (+ ``_threshold``), ``n_target``, ``n_nontarget``, ``n_skipped``,
  ``score_norm``, ``backend`` and ``scoring`` (the row's name in RESULTS.md); with AS-norm also
  ``raw``, the same figures for plain cosine scores (in the backend's space when there is one);
  with a calibration ``calibrated`` (Cllr, actual / minimum DCF, the decisions' error rates,
  and whether these are the calibration's own trials);
* RESULTS.md is regenerated from the JSON files rather than appended to, so re-running a
  set replaces its row instead of duplicating it.

Compared with the anchor (ESPnet's ``egs2/TEMPLATE/spk1/spk.sh`` stage 8, which prints EER
and minDCF into a text file), the results are machine-readable, plotted, and collected into
one markdown table per set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import glob
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spkflow.core import jsonsafe
from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError
from spkflow.data.tables import read_kv
from spkflow.score.calibration import LogisticCalibration, actual_dcf, cllr
from spkflow.score.metrics import compute_metrics, det_curve
from spkflow.score.model_scoring import MIN_DOMAIN, Scoring, decision_metrics
from spkflow.score.plots import plot_det, plot_score_hist
from spkflow.score.qmf import draw_trials, fit_qmf, load_qmf, qmf_features, read_durations, save_qmf
from spkflow.score.trial_scoring import ScoreResult, Trials, read_embeddings, read_trials, write_scores

__all__ = [
    "ScoringSetup",
    "evaluate_set",
    "fit_qmf_file",
    "remove_outputs",
    "score_set",
    "write_results_md",
    "P_TARGETS",
    "OUTPUTS",
]

log = logging.getLogger(__name__)

P_TARGETS = (0.01, 0.05)
#: What :func:`evaluate_set` writes to its ``outdir``, in the order stale copies are removed.
OUTPUTS = ("metrics.json", "scores", "scores.qmf", "det.png", "score_hist.png")


def _set_vectors(emb: dict[str, np.ndarray], source: str) -> np.ndarray:
    """The scored utterances' embeddings as ``[N, D]`` (``eval_mean``); an empty set, a
    non-finite vector or mixed dimensions are an :class:`InputError` naming ``source``."""
    vecs = [np.asarray(v, dtype=np.float64).reshape(-1) for v in emb.values()]
    if not vecs:
        raise InputError(source, None, "no embedding of a trial utterance to take the set's mean from")
    for key, v in zip(emb, vecs, strict=True):
        if v.shape != vecs[0].shape or not np.all(np.isfinite(v)):
            raise InputError(source, None, f"embedding of {key!r} is non-finite or of another dimension")
    return np.stack(vecs)


def _centred_label(centred: bool | str | None, eval_mean: bool) -> str:
    """``centred``: a training mean was subtracted (a mean scp, or a scoring's training mean)."""
    return ", centred on the set" if eval_mean else (", centred" if centred else "")


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


@dataclass
class ScoringSetup:
    """Stage 6's scoring options for :func:`score_set` (the QMF's calibration trials are scored
    as the test sets are): centring (``mean_scp`` or the set's own mean), a linear backend,
    AS-norm with a cohort, or a model's whole scoring (``scoring_dir``)."""

    cohort_scp: str | None = None
    cohort_size: int = 200
    mean_scp: str | None = None
    backend_path: str | None = None
    eval_mean: bool = False
    scoring_dir: str | None = None

    def check(self) -> None:
        if self.scoring_dir and (self.backend_path or self.cohort_scp or self.mean_scp):
            raise ValueError(f"{self.scoring_dir}: a model's scoring replaces --backend, --cohort-scp and --mean-scp")
        if self.backend_path and self.mean_scp:
            raise ValueError(
                f"{self.backend_path}: a backend subtracts its own training mean; "
                f"do not centre on {self.mean_scp} as well"
            )
        if self.eval_mean and self.mean_scp:
            raise ValueError(f"{self.mean_scp}: centre on the training mean or on the set's own (eval_mean), not both")

    def scoring(self) -> Scoring:
        """The :class:`~spkflow.score.model_scoring.Scoring` these options describe."""
        self.check()
        if self.scoring_dir:
            return Scoring.load(self.scoring_dir)
        return Scoring.from_options(
            backend_path=self.backend_path,
            cohort_scp=self.cohort_scp,
            cohort_size=self.cohort_size,
            mean_scp=self.mean_scp,
        )


def score_set(
    trials: Trials,
    xvector_scp: str,
    setup: ScoringSetup,
    *,
    skip_missing: bool = False,
    utt2spk: Mapping[str, str] | None = None,
) -> tuple[ScoreResult, dict[str, float], str]:
    """Score ``trials`` with the embeddings of ``xvector_scp`` as ``setup`` says (through
    :meth:`Scoring.score_trials <spkflow.score.model_scoring.Scoring.score_trials>`, as stage 6
    scores a test set).  Returns the result, each utterance's raw embedding norm (the QMF's
    magnitude) and the backend's name.  ``utt2spk`` (calibration trials drawn from the cohort's
    own speakers, whose keys are speakers): an utterance's speaker is left out of its AS-norm
    cohort."""
    scoring = setup.scoring()
    emb = read_embeddings(xvector_scp, set(trials.enroll).union(trials.test))
    magnitudes = {k: float(np.linalg.norm(v)) for k, v in emb.items()}
    exclude = None
    if utt2spk is not None and setup.cohort_scp:
        row = {k: i for i, k in enumerate(read_kv(setup.cohort_scp))}  # read_cohort's row order
        exclude = {u: row[utt2spk[u]] for u in emb if utt2spk.get(u) in row}
    own = _set_vectors(emb, xvector_scp) if setup.eval_mean else None
    result = scoring.score_trials(
        trials, emb, emb_source=xvector_scp, skip_missing=skip_missing, domain=own, cohort_exclude=exclude
    )
    return result, magnitudes, scoring.backend.name if scoring.backend is not None else "cosine"


def evaluate_set(
    trials_path: str,
    xvector_scp: str,
    outdir: str,
    *,
    cohort_scp: str | None = None,
    cohort_size: int = 200,
    mean_scp: str | None = None,
    backend_path: str | None = None,
    scoring_dir: str | None = None,
    eval_mean: bool = False,
    skip_missing: bool = False,
    model_tag: str = "",
    set_name: str | None = None,
    plots: bool = True,
    qmf_path: str | None = None,
    utt2dur: str | None = None,
) -> dict[str, Any]:
    """Score one set and write ``scores``, ``metrics.json`` and the plots to ``outdir``;
    returns the metrics dict (what ``metrics.json`` holds).  ``cohort_scp`` enables AS-norm,
    ``mean_scp`` centring (the mean of its vectors is subtracted before cosine scoring),
    ``backend_path`` a fitted :class:`spkflow.score.backend.Backend` (``.npz``) applied to the trial
    and cohort embeddings first (it centres on its training mean: not combined with ``mean_scp``).
    ``scoring_dir``: a model dir's whole scoring instead (``scoring.yaml`` + ``scoring.npz``,
    :class:`~spkflow.score.model_scoring.Scoring`: backend, centring, cohort and calibration; not
    with the three options before).  ``eval_mean`` centres on the scored set's own mean instead,
    taken over the embeddings of the utterances its trials name (no labels used): the backend's
    mean is replaced by that of their L2-normalised vectors, or without a backend their raw mean
    is subtracted as ``mean_scp``'s would be (not combined with ``mean_scp``).  ``qmf_path``: a
    QMF fitted by :func:`fit_qmf_file`; its calibrated scores (log-likelihood ratios) go to
    ``scores.qmf`` and their figures (EER, minDCF, Cllr, actual DCF) to ``metrics.json``'s
    ``qmf``; ``utt2dur``: the set's durations (needed by a QMF with the ``duration`` measure).

    With a calibration (in ``scoring_dir``), ``metrics.json`` also has ``calibrated``: Cllr,
    actual and minimum DCF, and the error rates of the decisions, for the LLRs that
    ``spkflow.bin.verify`` gives these trials (centred on the set's own recordings when there
    are at least :data:`~spkflow.score.model_scoring.MIN_DOMAIN`)."""

    set_name = set_name or os.path.basename(os.path.normpath(outdir))
    setup = ScoringSetup(cohort_scp, cohort_size, mean_scp, backend_path, eval_mean, scoring_dir)
    setup.check()
    remove_outputs(outdir)
    trials = read_trials(trials_path)
    qmf = load_qmf(qmf_path) if qmf_path else None
    if qmf is not None and "duration" in qmf[1] and not utt2dur:
        raise InputError(qmf_path, None, f"this QMF uses durations: give the utt2dur of {trials_path}'s set")
    emb = read_embeddings(xvector_scp, set(trials.enroll).union(trials.test))
    magnitudes = {k: float(np.linalg.norm(v)) for k, v in emb.items()}  # the QMF's measure, before any backend
    scoring = setup.scoring()
    if scoring_dir:  # where its backend, cohort and mean came from (fit_scoring records them), for metrics.json
        sources = scoring.fitted.get("sources") or {}
        backend_path, cohort_scp = sources.get("backend"), sources.get("cohort_scp")
        mean_scp = sources.get("mean_scp")
    own = _set_vectors(emb, xvector_scp) if (eval_mean or scoring.calibration is not None) else None
    result = scoring.score_trials(
        trials, emb, emb_source=xvector_scp, skip_missing=skip_missing, domain=own if eval_mean else None
    )
    backend_name = scoring.backend.name if scoring.backend is not None else "cosine"
    metrics: dict[str, Any] = {"set": set_name, "model_tag": model_tag}
    metrics.update(compute_metrics(result.scores, result.labels, P_TARGETS))
    metrics.update(
        {
            "n_skipped": result.n_skipped,
            "n_missing_utts": len(result.missing),
            "score_norm": result.score_norm,
            "cohort_size": result.cohort_size,
            "trials": trials_path,
            "xvector_scp": xvector_scp,
            "cohort_scp": cohort_scp or "",
            "mean_scp": mean_scp or "",
            "eval_mean": bool(eval_mean),
            "backend": backend_name,
            "backend_path": backend_path or "",
            "scoring_dir": scoring_dir or "",
            "centred": scoring.mean is not None,
            "date": _now(),
        }
    )
    if scoring.calibration is not None:
        assert own is not None
        metrics["calibrated"] = _calibrated(scoring, trials, emb, own, result, eval_mean, xvector_scp, skip_missing)
    llr = None
    if qmf is not None:
        durations = read_durations(utt2dur) if utt2dur else None
        llr, metrics["qmf"] = _apply_qmf(qmf, result, magnitudes, durations, utt2dur or "", qmf_path or "")
    curves = {}
    if result.score_norm != "none":
        metrics["raw"] = compute_metrics(result.raw_scores, result.labels, P_TARGETS)
        curves["cosine"] = det_curve(result.raw_scores, result.labels)
    label = "cosine" if result.score_norm == "none" else f"AS-norm (top {result.cohort_size})"
    centred = _centred_label(metrics["centred"], eval_mean)
    if centred:
        curves = {f"{k}{centred}": v for k, v in curves.items()}
        label += centred
    if backend_name != "cosine":
        curves = {f"{backend_name.upper()}, {k}": v for k, v in curves.items()}
        label = f"{backend_name.upper()}, {label}"
    curves[label] = det_curve(result.scores, result.labels)
    if llr is not None:
        curves[f"{label} + QMF"] = det_curve(llr, result.labels)
    metrics["scoring"] = label

    os.makedirs(outdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".score.", suffix=".tmp", dir=outdir)
    try:
        write_scores(os.path.join(tmp, "scores"), result)
        if llr is not None:
            write_scores(os.path.join(tmp, "scores.qmf"), dataclasses.replace(result, scores=llr))
        if plots:
            title = f"{set_name}" + (f" ({model_tag})" if model_tag else "")
            plot_det(curves, os.path.join(tmp, "det.png"), title=f"DET: {title}", p_targets=P_TARGETS)
            plot_score_hist(
                result.scores,
                result.labels,
                os.path.join(tmp, "score_hist.png"),
                title=f"Scores: {title}, EER {metrics['eer']:.2f}%",
                threshold=metrics["eer_threshold"],
                xlabel="cosine score" if result.score_norm == "none" else "AS-norm score",
            )
        write_text_atomic(os.path.join(tmp, "metrics.json"), jsonsafe.dumps(metrics, indent=2, sort_keys=True) + "\n")
        for name in reversed(OUTPUTS):  # metrics.json last
            if os.path.exists(os.path.join(tmp, name)):
                os.replace(os.path.join(tmp, name), os.path.join(outdir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return metrics


def _calibrated(
    scoring: Scoring,
    trials: Trials,
    emb: dict[str, np.ndarray],
    own: np.ndarray,
    result: ScoreResult,
    eval_mean: bool,
    source: str,
    skip_missing: bool,
) -> dict[str, Any]:
    """The ``calibrated`` section of metrics.json: the LLRs verify gives these trials."""
    assert scoring.calibration is not None
    on_set = len(own) >= MIN_DOMAIN and scoring.centres  # verify's rule for a batch
    if on_set == eval_mean:
        cal = result
    else:
        cal = scoring.score_trials(
            trials, emb, emb_source=source, skip_missing=skip_missing, domain=own if on_set else None
        )
    centred_on = (
        f"the set ({len(own)} recordings)" if on_set else ("the training mean" if scoring.centres else "nothing")
    )
    llr = scoring.llr(cal.scores)
    assert llr is not None
    fitted = str(scoring.fitted.get("trials", ""))
    out: dict[str, Any] = {
        "centred_on": centred_on,
        "fitted_on": scoring.calibration.fitted_on,
        "in_sample": bool(fitted) and os.path.abspath(fitted) == os.path.abspath(trials.path),
        "eer": compute_metrics(llr, cal.labels, ())["eer"],
    }
    out.update(decision_metrics(llr, cal.labels, scoring.decision, P_TARGETS))
    return out


def _apply_qmf(
    qmf: tuple[LogisticCalibration, tuple[str, ...]],
    result: ScoreResult,
    magnitudes: Mapping[str, float],
    durations: Mapping[str, float] | None,
    utt2dur: str,
    qmf_path: str,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The QMF's log-likelihood ratios of ``result``'s trials and their figures for metrics.json."""
    cal, measures = qmf
    try:
        x, _ = qmf_features(result, measures, durations=durations, magnitudes=magnitudes)
    except KeyError as err:
        raise InputError(utt2dur, None, f"no duration of {err.args[0]!r} (the QMF {qmf_path} uses durations)") from None
    except ValueError as err:
        raise InputError(qmf_path, None, f"cannot apply this QMF here: {err}") from None
    llr = cal.llr(x)
    figures: dict[str, Any] = compute_metrics(llr, result.labels, P_TARGETS)
    figures["cllr"] = cllr(llr, result.labels)
    for p in P_TARGETS:
        figures[f"act_dcf_p{p}"] = actual_dcf(llr, result.labels, p)
    figures.update(measures=list(measures), qmf=qmf_path, fitted_on=cal.fitted_on)
    return llr, figures


def fit_qmf_file(
    xvector_scp: str,
    utt2spk: str,
    out: str,
    setup: ScoringSetup,
    *,
    utt2dur: str | None = None,
    num_trials: int = 20000,
    seed: int = 0,
) -> dict[str, Any]:
    """Fit a QMF on ``num_trials`` target and as many non-target trials drawn from the training
    set (``utt2spk``, its embeddings ``xvector_scp``), scored as ``setup`` scores a test set
    (each utterance's own speaker left out of the cohort), and write it to ``out`` (JSON).
    Measures: ``duration`` with ``utt2dur``, ``magnitude``, ``imposter`` with a cohort.
    Returns a summary for the log."""
    have = set(read_kv(xvector_scp))
    u2s = {u: s for u, s in read_kv(utt2spk).items() if u in have}
    trials = draw_trials(u2s, num_trials, num_trials, seed=seed, source=utt2spk)
    measures = [m for m, on in (("duration", utt2dur), ("magnitude", True), ("imposter", setup.cohort_scp)) if on]
    result, magnitudes, _ = score_set(trials, xvector_scp, setup, utt2spk=u2s)
    durations = read_durations(utt2dur) if utt2dur else None
    if durations is not None:
        lost = sorted(u for u in set(trials.enroll).union(trials.test) if u not in durations)
        if lost:
            raise InputError(utt2dur, None, f"no duration of {lost[0]!r} ({len(lost)} trial utterances lack one)")
    n_tar, n_non = int(result.labels.sum()), int(len(result.labels) - result.labels.sum())
    cal = fit_qmf(
        result,
        measures,
        durations=durations,
        magnitudes=magnitudes,
        fitted_on=f"{n_tar} target + {n_non} non-target trials drawn from {utt2spk} (seed {seed})",
    )
    save_qmf(out, cal, measures)
    llr = cal.llr(qmf_features(result, measures, durations=durations, magnitudes=magnitudes)[0])
    return {
        "measures": measures,
        "n_target": n_tar,
        "n_nontarget": n_non,
        "eer_before": compute_metrics(result.scores, result.labels, P_TARGETS)["eer"],
        "eer_after": compute_metrics(llr, result.labels, P_TARGETS)["eer"],
        "cllr": cllr(llr, result.labels),
        "weights": dict(zip(cal.names, cal.weights, strict=True)),
    }


def remove_outputs(outdir: str) -> None:
    """Remove what :func:`evaluate_set` writes to ``outdir`` (``metrics.json`` first), and the
    temporary files of an interrupted run."""
    for name in OUTPUTS:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(outdir, name))
    for tmp in glob.glob(os.path.join(glob.escape(outdir), ".score.*.tmp")):
        shutil.rmtree(tmp, ignore_errors=True)


def _model_desc(exp_dir: str) -> tuple[str, str]:
    """(model, loss) names from ``<exp>/config.yaml`` when it is there and readable."""
    path = os.path.join(exp_dir, "config.yaml")
    if not os.path.isfile(path):
        return "", ""
    try:
        import yaml

        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
    except Exception as err:  # a summary must not fail on a config it only decorates
        log.warning("cannot read %s: %s", path, err)
        return "", ""

    def name(section: str) -> str:
        sec = cfg.get(section) if isinstance(cfg, dict) else None
        if isinstance(sec, dict):
            return str(sec.get("name") or sec.get("type") or "")
        return str(sec or "")

    return name("model"), name("loss")


#: What a metrics.json must hold for its RESULTS.md row.
_ROW_KEYS = ("eer", "min_dcf_p0.01", "min_dcf_p0.05", "n_target", "n_nontarget")


def _row(m: dict[str, Any], tag: str, model: str, loss: str, scoring: str) -> str:
    return (
        f"| {tag} | {model or '-'} | {loss or '-'} | {scoring} | {m['eer']:.2f} | "
        f"{m['min_dcf_p0.01']:.4f} | {m['min_dcf_p0.05']:.4f} | {m['n_target']} | "
        f"{m['n_nontarget']} | {m.get('n_skipped', 0)} |"
    )


def _peer_rows(exp_dir: str, set_name: str, trials: str | None) -> list[str]:
    """Rows of pretrained peers scored on the same trials (``exp/peer_*/eval/<set>/metrics.json``
    beside ``exp_dir``, written by e.g. ``local/peer_resemblyzer.py``)."""
    rows = []
    pattern = os.path.join(os.path.dirname(os.path.abspath(exp_dir)), "peer_*", "eval", set_name, "metrics.json")
    for path in sorted(glob.glob(pattern)):
        peer = os.path.dirname(os.path.dirname(os.path.dirname(path)))
        if os.path.samefile(peer, exp_dir):
            continue
        with open(path, encoding="utf-8") as f:
            p = json.load(f)
        if trials is None or os.path.abspath(p.get("trials", "")) == os.path.abspath(trials):
            rows.append(_row(p, os.path.basename(peer), "pretrained (peer)", "-", "cosine"))
    return rows


def write_results_md(exp_dir: str, out: str | None = None) -> str:
    """Rewrite ``<exp_dir>/RESULTS.md`` (or ``out``) from ``<exp_dir>/eval/*/metrics.json`` (one
    table per set, sets in name order, and the calibrated decisions when scored with a
    calibration); returns its path."""
    files = sorted(glob.glob(os.path.join(exp_dir, "eval", "*", "metrics.json")))
    if not files:
        raise FileNotFoundError(f"no {exp_dir}/eval/<set>/metrics.json to summarise")
    model, loss = _model_desc(exp_dir)
    tag = os.path.basename(os.path.normpath(exp_dir))
    lines = [
        f"# Results: {tag}",
        "",
        "Written by stage 6 of `spk.sh` from `eval/<set>/metrics.json`. EER in percent; minDCF",
        "normalised, c_miss = c_fa = 1. Cosine scoring of L2-normalised embeddings; AS-norm rows",
        "use the top-K cohort speakers of the training set; 'centred': the training speakers'",
        "mean embedding is subtracted first; 'WCCN' / 'LDA': the embeddings (trials and cohort) go",
        "through that backend, fitted on the training set's utterance embeddings, first; 'centred on",
        "the set': the mean of the set's own embeddings (no labels) instead of the training mean;",
        "'+ QMF': the scores calibrated with quality measures (fitted on training-set trials), Cllr in bits.",
        "",
    ]
    header = (
        "| model tag | model | loss | scoring | EER (%) | minDCF (p=0.01) | minDCF (p=0.05) "
        "| target | non-target | skipped |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for path in files:
        with open(path, encoding="utf-8") as f:
            try:
                m = json.load(f)
            except ValueError as err:
                raise InputError(path, None, f"not a metrics file ({err}); re-run scoring for this set") from None
        missing = [k for k in _ROW_KEYS if not isinstance(m, dict) or k not in m]
        if missing:
            raise InputError(path, None, f"no {', '.join(missing)} in it; re-run scoring for this set")
        set_name = m.get("set") or os.path.basename(os.path.dirname(path))
        row_tag = m.get("model_tag") or tag
        lines += [
            f"## {set_name}",
            "",
            f"Scored {m.get('date', '?')}: `{m.get('trials', '?')}` against `{m.get('xvector_scp', '?')}`.",
            "",
            header,
        ]
        centred = _centred_label(m.get("centred", m.get("mean_scp")), m.get("eval_mean", False))
        back = f"{m['backend'].upper()}, " if m.get("backend", "cosine") != "cosine" else ""
        if m.get("score_norm", "none") != "none" and isinstance(m.get("raw"), dict):
            raw = dict(m["raw"], n_skipped=m.get("n_skipped", 0))
            lines.append(_row(raw, row_tag, model, loss, f"{back}cosine{centred}"))
            scoring = f"{back}AS-norm (top {m.get('cohort_size', '?')}){centred}"
        else:
            scoring = f"{back}cosine{centred}"
        lines.append(_row(m, row_tag, model, loss, scoring))
        if isinstance(m.get("qmf"), dict):
            q = dict(m["qmf"], n_skipped=m.get("n_skipped", 0))
            lines.append(_row(q, row_tag, model, loss, f"{scoring} + QMF (Cllr {q.get('cllr', float('nan')):.3f})"))
        lines += _peer_rows(exp_dir, set_name, m.get("trials"))
        lines.append("")
        if isinstance(m.get("calibrated"), dict):
            lines += _calibrated_rows(m["calibrated"])
    out = os.path.join(exp_dir, "RESULTS.md") if out is None else out
    write_text_atomic(out, "\n".join(lines))
    return out


def _calibrated_rows(c: dict[str, Any]) -> list[str]:
    """The calibrated-decisions table of one set (metrics.json's ``calibrated``)."""
    where = "**the calibration's own trials (in-sample)**" if c.get("in_sample") else "trials it was not fitted on"
    return [
        f"Calibrated (LLRs as `spkflow.bin.verify` gives these trials, centred on {c.get('centred_on', '?')}; "
        f"calibration fitted on {c.get('fitted_on') or '?'}: {where}; decisions LLR > {c['llr_threshold']:.3g}, "
        f"p_target {c.get('p_target', 0.5):g}):",
        "",
        "| Cllr | EER (%) | decisions: HTER (%) | P_miss (%) | P_fa (%) | minDCF (p=0.01) | actDCF (p=0.01) "
        "| minDCF (p=0.05) | actDCF (p=0.05) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {c['cllr']:.3f} | {c['eer']:.2f} | {c['hter']:.2f} | {c['p_miss']:.2f} | {c['p_fa']:.2f} | "
        f"{c['min_dcf_p0.01']:.4f} | {c['act_dcf_p0.01']:.4f} | {c['min_dcf_p0.05']:.4f} | {c['act_dcf_p0.05']:.4f} |",
        "",
    ]


def summary_lines(m: Mapping[str, Any], outdir: str) -> list[str]:
    """The console lines of a scored set (its figures; the calibrated decisions when there are some)."""
    raw = "cosine" if m.get("backend", "cosine") == "cosine" else f"{m['backend'].upper()}, cosine"
    norm = "" if m["score_norm"] == "none" else f" ({raw} before AS-norm: EER {m['raw']['eer']:.2f}%)"
    if "qmf" in m:
        norm += f" (QMF: EER {m['qmf']['eer']:.2f}%, Cllr {m['qmf']['cllr']:.3f})"
    lines = [
        f"{m['set']}: EER {m['eer']:.2f}% minDCF(0.01) {m['min_dcf_p0.01']:.4f} minDCF(0.05) "
        f"{m['min_dcf_p0.05']:.4f}, {m['n_target']} target / {m['n_nontarget']} non-target trials, "
        f"{m['n_skipped']} skipped, scoring: {m['scoring']}{norm} -> {outdir}"
    ]
    if "calibrated" in m:
        c = m["calibrated"]
        sample = "; the calibration's own trials" if c["in_sample"] else ""
        lines.append(
            f"{m['set']} calibrated (centred on {c['centred_on']}{sample}): Cllr {c['cllr']:.3f}, decisions HTER "
            f"{c['hter']:.2f}% (miss {c['p_miss']:.2f}%, false alarm {c['p_fa']:.2f}%) against EER {c['eer']:.2f}%, "
            f"actDCF(0.01) {c['act_dcf_p0.01']:.4f}"
        )
    return lines


def training_calibration_warning(m: Mapping[str, Any]) -> str | None:
    """The warning for a set whose calibration was fitted on training-set trials (spk.sh's default
    calibration set), with the risk measured on this set; None otherwise."""
    c = m.get("calibrated")
    if not c or "(seen in training)" not in str(c.get("fitted_on", "")) or c["in_sample"]:
        return None
    ratio = f", {c['hter'] / c['eer']:.1f} x" if c["eer"] >= 0.01 else ""
    return (
        f"{m['set']}: the calibration was fitted on trials of the training set ({c['fitted_on']}), whose scores "
        f"the model has learnt to separate: here its decisions' HTER is {c['hter']:.2f}% against EER "
        f"{c['eer']:.2f}%{ratio} (misses {c['p_miss']:.2f}%, false alarms {c['p_fa']:.2f}%); fit it on held-out "
        "trials (spk.sh --calib_set SET) for decisions that hold on new data"
    )


def refresh_results_md(exp_dir: str, out: str | None = None) -> str:
    """After a set failed (its metrics.json is gone): rewrite RESULTS.md from the metrics.json files
    left, or remove it when that fails (no set left, another set's metrics.json damaged), so that it
    never shows the failed set's old row.  Returns what was done, for the log."""
    try:
        return f"rewrote {write_results_md(exp_dir, out)} without the failed set"
    except FileNotFoundError:
        why = "no set has metrics.json any more"
    except (InputError, OSError) as err:
        why = str(err)
    path = out or os.path.join(exp_dir, "RESULTS.md")
    if not os.path.exists(path):
        return f"{path}: none to rewrite ({why})"
    os.unlink(path)
    return f"removed {path}: {why}"
