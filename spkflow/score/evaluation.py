"""Stage 6 outputs: score one evaluation set and write its files; summarise an experiment.

:func:`evaluate_set` turns ``trials`` + ``xvector.scp`` (+ an optional AS-norm cohort and a
fitted linear backend, :mod:`spkflow.score.backend`, or a model's whole scoring with its
calibration, :mod:`spkflow.score.verification`, through which it scores in either case) into
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
import datetime as _dt
import glob
import json
import logging
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError
from spkflow.score.metrics import compute_metrics, det_curve
from spkflow.score.plots import plot_det, plot_score_hist
from spkflow.score.scoring import ScoreResult, Trials, read_embeddings, read_trials, write_scores
from spkflow.score.verification import MIN_DOMAIN, Scoring, decision_metrics

__all__ = ["evaluate_set", "remove_outputs", "write_results_md", "P_TARGETS", "OUTPUTS"]

log = logging.getLogger(__name__)

P_TARGETS = (0.01, 0.05)
#: What :func:`evaluate_set` writes to its ``outdir``, in the order stale copies are removed.
OUTPUTS = ("metrics.json", "scores", "det.png", "score_hist.png")


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
) -> dict[str, Any]:
    """Score one set and write ``scores``, ``metrics.json`` and the plots to ``outdir``;
    returns the metrics dict (what ``metrics.json`` holds).  ``cohort_scp`` enables AS-norm,
    ``mean_scp`` centring (the mean of its vectors is subtracted before cosine scoring),
    ``backend_path`` a fitted :class:`spkflow.score.backend.Backend` (``.npz``) applied to the trial
    and cohort embeddings first (it centres on its training mean: not combined with ``mean_scp``).
    ``scoring_dir``: a model dir's whole scoring instead (``scoring.yaml`` + ``scoring.npz``,
    :class:`~spkflow.score.verification.Scoring`: backend, centring, cohort and calibration; not
    with the three options before).  ``eval_mean`` centres on the scored set's own mean instead,
    taken over the embeddings of the utterances its trials name (no labels used): the backend's
    mean is replaced by that of their L2-normalised vectors, or without a backend their raw mean
    is subtracted as ``mean_scp``'s would be (not combined with ``mean_scp``).

    With a calibration (in ``scoring_dir``), ``metrics.json`` also has ``calibrated``: Cllr,
    actual and minimum DCF, and the error rates of the decisions, for the LLRs that
    ``spkflow.bin.verify`` gives these trials (centred on the set's own recordings when there
    are at least :data:`~spkflow.score.verification.MIN_DOMAIN`)."""

    set_name = set_name or os.path.basename(os.path.normpath(outdir))
    if scoring_dir and (backend_path or cohort_scp or mean_scp):
        raise ValueError(f"{scoring_dir}: a model's scoring replaces --backend, --cohort-scp and --mean-scp")
    if backend_path and mean_scp:
        raise ValueError(
            f"{backend_path}: a backend subtracts its own training mean; do not centre on {mean_scp} as well"
        )
    if eval_mean and mean_scp:
        raise ValueError(f"{mean_scp}: centre on the training mean or on the set's own (eval_mean), not both")
    remove_outputs(outdir)
    trials = read_trials(trials_path)
    emb = read_embeddings(xvector_scp, set(trials.enroll).union(trials.test))
    if scoring_dir:
        scoring = Scoring.load(scoring_dir)
        # where its backend, cohort and mean came from (fit_scoring records them), for metrics.json
        sources = scoring.fitted.get("sources") or {}
        backend_path, cohort_scp = sources.get("backend"), sources.get("cohort_scp")
        mean_scp = sources.get("mean_scp")
    else:
        scoring = Scoring.from_options(
            backend_path=backend_path, cohort_scp=cohort_scp, cohort_size=cohort_size, mean_scp=mean_scp
        )
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
    metrics["scoring"] = label

    os.makedirs(outdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".score.", suffix=".tmp", dir=outdir)
    try:
        write_scores(os.path.join(tmp, "scores"), result)
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
        write_text_atomic(os.path.join(tmp, "metrics.json"), json.dumps(metrics, indent=2, sort_keys=True) + "\n")
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
        "the set': the mean of the set's own embeddings (no labels) instead of the training mean.",
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
            lines.append(_row(m, row_tag, model, loss, f"{back}AS-norm (top {m.get('cohort_size', '?')}){centred}"))
        else:
            lines.append(_row(m, row_tag, model, loss, f"{back}cosine{centred}"))
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
