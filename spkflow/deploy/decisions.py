"""Verification and identification of new recordings with a trained model: the work behind
``python -m spkflow.bin.verify`` and ``python -m spkflow.bin.identify``.

Recordings are named by audio path (a file: a name ending in ``|`` is a file name, never a
command), by utterance id of a data dir (``wav.scp`` + ``segments``, whose ``cmd |`` entries are
run as Kaldi runs them), or by key of an embedding scp (stage 5's ``xvector.scp``: no audio read,
the numbers stage 6 scored).  Each distinct recording is read and embedded once, in
batches (:meth:`spkflow.api.Embedder.embed_batch`, a progress bar on a terminal), and every pair
is scored at once by the model's :class:`~spkflow.score.model_scoring.Scoring`: thousands of pairs
take the time of embedding their recordings plus milliseconds.

What it guarantees
------------------
* **The API's and stage 6's numbers.**  Scores come from the same ``Scoring`` the API and stage
  6 use; a batch of pairs naming at least :data:`~spkflow.score.model_scoring.MIN_DOMAIN`
  recordings is centred on their own mean (``domain="auto"``; ``"pairs"`` always, ``"train"``
  never), as stage 6's ``--score_eval_mean true`` centres a set, so ``verify --pairs trials`` over
  stage 5's embeddings gives stage 6's scores, and one pair gives ``Embedder.verify``'s.
* **Bad input is named**: a pairs line (file and line), an unreadable recording (its path or
  utterance and why), an utterance absent from the data dir or scp.  With ``skip_bad`` the pairs
  (or files) whose recording cannot be read are left out and counted instead.
* **One reader, every format**: recordings named by path are read by
  :func:`spkflow.data.audio.read_audio` (m4a / aac / wma / webm through the pinned ffmpeg, as
  ``make_data_dir``'s pipes), and with a data dir and an embedding scp together a path is looked
  up by its utterance id (:func:`file_ids`), so a pairs file of paths takes the fast route.
* **No decision on too little speech**: a recording with fewer than ``min_speech`` seconds of
  voiced speech (:mod:`spkflow.features.speech`) gets a null decision and a ``warning`` in its
  JSON line, and every line is valid JSON (a non-finite number is null, with no decision).
* **A file cut short is said**: one that decodes to clearly less than its header states (an MP3
  or OGG cut short decodes without an error; ``make_data_dir`` calls it truncated by the same
  rule, :func:`spkflow.data.audio.truncation`) is scored on what decodes, with a ``note`` in its
  JSON lines and a warning on stderr.
* **A batch is decided by its own calibration where the model's evidently does not fit it**
  (``calibration="auto"``, :meth:`~spkflow.score.model_scoring.Scoring.on_batch`): at least
  :data:`~spkflow.score.unsupervised_calibration.MIN_PAIRS` pairs of
  :data:`~spkflow.score.unsupervised_calibration.MIN_RECORDINGS` recordings, a trusted
  two-Gaussian fit of their scores (no labels read), and a threshold above the model's; else,
  and always for one pair, the model's calibration decides, and the summary says which and why.
* **A lone pair is not centred on itself**: ``domain="pairs"`` needs :data:`MIN_DOMAIN`
  recordings; under ``auto`` fewer are centred on the calibration set's mean (``PAIR``).
* **Saved enrolment** (:mod:`spkflow.deploy.gallery`): :func:`identify` embeds the test
  recordings first, then takes its enrolment from :func:`enrolment` (a data dir, a saved
  gallery of the same model, or both).
* **Open-set identification by Bayes' rule on calibrated LLRs**: with the prior ``p_known``
  that the speaker is one of the ``S`` enrolled ones (spread evenly), the best speaker is chosen
  over "unknown" when its LLR exceeds ``log S - logit(p_known)``; the posteriors are reported.

Anchors: SpeechBrain's ``SpeakerRecognition.verify_files`` (one pair, a fixed cosine threshold of
0.25, no batch), WeSpeaker's ``wespeaker --task similarity`` / ``compute_similarity`` (a cosine
rescaled to [0, 1], no decision) and Resemblyzer's two-line API; Kaldi and SpeechBrain ship
closed-set identification only.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from spkflow.core import jsonsafe
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.audio import AudioReader, read_audio, shortfall
from spkflow.data.datadir import DataDir
from spkflow.data.tables import read_kv
from spkflow.deploy.gallery import Gallery, embedder_stamp
from spkflow.features.speech import MIN_SPEECH, speech_seconds
from spkflow.score.calibration import logit
from spkflow.score.metrics import compute_eer
from spkflow.score.model_scoring import MIN_DOMAIN, PAIR, Scoring, decision_metrics, indexed_cosine
from spkflow.score.trial_scoring import Trials, read_embeddings
from spkflow.score.unsupervised_calibration import BatchCalibration

__all__ = [
    "DOMAINS",
    "Recordings",
    "domain_choice",
    "domain_embeddings",
    "enrol_gallery",
    "enrolment",
    "file_ids",
    "identify",
    "open_set_threshold",
    "speech_warning",
    "verify_pairs",
]

log = logging.getLogger(__name__)

DOMAINS = ("auto", "pairs", "calibration", "train")
_CHUNK = 256  # recordings read and embedded at a time (bounded memory)


@dataclass
class Recordings:
    """Where recordings come from: audio paths (default), a data dir's utterances, or an embedding scp."""

    data_dir: str | None = None
    xvector_scp: str | None = None
    #: name -> utterance id, for names that are files of the data dir (:func:`file_ids`)
    aliases: Mapping[str, str] = field(default_factory=dict)
    #: seconds of voiced speech of each recording read (:func:`~spkflow.features.speech.speech_seconds`;
    #: none for an embedding scp: no audio is read)
    speech: dict[str, float] = field(default_factory=dict)
    #: what to say of a recording read by path: cut short (:func:`~spkflow.data.audio.shortfall`)
    notes: dict[str, str] = field(default_factory=dict)

    def note(self, names: Sequence[str]) -> str | None:
        """The JSON ``note`` of a row naming ``names``: what :attr:`notes` says of them, or None."""
        said = [f"{n}: {self.notes[n]}" for n in dict.fromkeys(names) if n in self.notes]
        return "; ".join(said) or None

    def embed(
        self,
        embedder: Any,
        names: Sequence[str],
        *,
        skip_bad: bool = False,
        progress: bool = True,
        batch_size: int = 32,
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """``name -> raw embedding`` of every name, and ``name -> reason`` of those that could
        not be read (only with ``skip_bad``; otherwise the first one raises, named)."""
        names = list(dict.fromkeys(names))
        key = {n: self.aliases.get(n, n) for n in names}
        if self.xvector_scp is not None:
            vec = read_embeddings(self.xvector_scp, set(key.values()))
            emb = {n: vec[key[n]] for n in names if key[n] in vec}
            missing = [n for n in names if n not in emb]
            if missing and not skip_bad:
                hint = (
                    "; a file path: give --data DATA_DIR, the data dir these embeddings were extracted from, to map "
                    "paths to its utterance ids"
                    if self.data_dir is None and (os.sep in missing[0] or os.path.exists(missing[0]))
                    else ""
                )
                raise InputError(
                    self.xvector_scp, None, f"no embedding of {missing[0]!r} ({len(missing)} missing){hint}"
                )
            return emb, {n: f"not in {self.xvector_scp}" for n in missing}
        reader = AudioReader(self.data_dir, sample_rate=None) if self.data_dir is not None else None
        if reader is not None:
            absent = [n for n in names if key[n] not in reader]
            if absent:
                raise InputError(
                    Path(self.data_dir or "") / "wav.scp", None, f"no utterance {absent[0]!r} (nor a file it lists)"
                )
        out: dict[str, np.ndarray] = {}
        bad: dict[str, str] = {}
        bar = _bar(len(names), progress)
        for start in range(0, len(names), _CHUNK):
            chunk, waves, rates = [], [], []
            for name in names[start : start + _CHUNK]:
                try:
                    if reader is not None:
                        wave, rate = reader.read_native(key[name])
                    else:
                        wave, rate = read_audio(name, utt=name)
                        if (short := shortfall(name, wave.shape[0], rate)) is not None:
                            self.notes[name] = short
                            log.warning("%s: %s; scored on what decodes", name, short)
                    if wave.shape[0] < rate * 0.025:
                        raise UtteranceError(name, name, f"shorter than one 25 ms frame ({wave.shape[0]} samples)")
                    self.speech[name] = speech_seconds(wave, rate)
                except UtteranceError as exc:
                    if not skip_bad:
                        raise
                    bad[name] = f"{exc.source}: {exc.message}"
                    log.warning("skipping %s: %s", name, bad[name])
                    continue
                chunk.append(name)
                waves.append(wave)
                rates.append(rate)
            if chunk:
                out.update(_embed_chunk(embedder, chunk, waves, rates, bad, skip_bad, batch_size))
            bar.update(min(_CHUNK, len(names) - start))
        bar.close()
        return out, bad


def _embed_chunk(
    embedder: Any,
    names: list[str],
    waves: list[np.ndarray],
    rates: list[int],
    bad: dict[str, str],
    skip_bad: bool,
    batch_size: int = 32,
) -> dict[str, np.ndarray]:
    """Embeddings of one chunk; a recording the frontend leaves nothing of (all silence to the
    VAD) is named, or with ``skip_bad`` left out."""
    try:
        return dict(zip(names, embedder.embed_batch(waves, rates, batch_size=batch_size), strict=True))
    except ValueError:
        pass
    out = {}
    for name, wave, rate in zip(names, waves, rates, strict=True):
        try:
            out[name] = embedder.embed(wave, rate)
        except ValueError as exc:
            exc = ValueError(f"{exc} (no speech to the model's VAD: {speech_seconds(wave, rate):.2f} s voiced)")
            if not skip_bad:
                raise UtteranceError(name, name, str(exc)) from None
            bad[name] = str(exc)
            log.warning("skipping %s: %s", name, exc)
    return out


def speech_warning(speech: Mapping[str, float], names: Sequence[str], min_speech: float) -> str | None:
    """The JSON ``warning`` of a row whose recordings hold less than ``min_speech`` seconds of
    voiced speech (no decision is made on it), or None."""
    short = [f"{n} has {speech[n]:.2f} s" for n in dict.fromkeys(names) if n in speech and speech[n] < min_speech]
    if not short:
        return None
    return f"too little speech ({'; '.join(short)} voiced, fewer than {min_speech:g} s): no decision"


def _num(x: Any) -> float | None:
    """A number for a JSON line: rounded to 6 decimals, null when not finite (JSON has no NaN)."""
    f = float(x)
    return round(f, 6) if math.isfinite(f) else None


def _bar(total: int, progress: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="embedding", unit="rec", file=sys.stderr, disable=not progress or total < 2)


def _domain(mode: str | np.ndarray, emb: dict[str, np.ndarray], scoring: Scoring) -> np.ndarray | str | None:
    """What to centre on: embeddings, :data:`~spkflow.score.model_scoring.PAIR` (the calibration
    set's mean, for fewer than MIN_DOMAIN recordings under ``auto``) or None (the training mean)."""
    if isinstance(mode, np.ndarray):  # embeddings of recordings like these, given
        return mode if scoring.centres else None
    if mode not in DOMAINS:
        raise ValueError(f"domain must be one of {', '.join(DOMAINS)}, got {mode!r}")
    if mode == "pairs" and scoring.centres and len(emb) < MIN_DOMAIN:
        raise ValueError(
            f"--domain-mean pairs: {len(emb)} recordings to centre on, it needs at least {MIN_DOMAIN} (fewer, "
            "centred on their own mean, are pushed apart: two recordings of one speaker score as different "
            f"speakers); use auto, train, or a data dir / embedding scp of >= {MIN_DOMAIN} recordings like these"
        )
    if mode == "train" or not scoring.centres:
        return None
    if mode == "calibration" or (mode == "auto" and len(emb) < MIN_DOMAIN) or not emb:
        return PAIR if scoring.pair_mean is not None else None
    return np.stack(list(emb.values()))


def _centred_on(dom: np.ndarray | str | None, domain: str | np.ndarray, what: str, scoring: Scoring) -> str:
    if not scoring.centres:
        return "nothing: the model's scoring does not centre"
    if dom is None:
        return "the training mean"
    if isinstance(dom, str):
        return "the calibration set's mean"
    return f"the {len(dom)} given recordings" if isinstance(domain, np.ndarray) else what


def _calibration_said(scoring: Scoring, batch: BatchCalibration | None, mode: str) -> dict[str, Any]:
    """The summary's ``calibration``: ``by`` (``batch``, ``model`` or None), ``reason``, the batch's fit."""
    if scoring.calibration is None:
        return {"by": None, "reason": "the model has no calibration: no LLRs, no decisions"}
    if batch is None:
        return {"by": "model", "reason": f"--calibration {mode}: the model's calibration decides"}
    return {"by": "batch" if batch.used else "model", **batch.to_dict()}


def verify_pairs(
    embedder: Any,
    pairs: Trials,
    out: IO[str],
    *,
    source: Recordings,
    domain: str | np.ndarray = "auto",
    scoring: Scoring | None = None,
    skip_bad: bool = False,
    progress: bool = True,
    min_speech: float = MIN_SPEECH,
    calibration: str = "auto",
) -> dict[str, Any]:
    """Score ``pairs`` and write one JSON line per pair to ``out`` (``a``, ``b``, ``score`` the
    plain cosine, ``norm_score``, ``llr``, ``same_speaker``; ``label`` for labelled pairs);
    returns a summary (counts, the centring, and for labelled pairs the figures of
    :func:`~spkflow.score.model_scoring.decision_metrics` and both EERs).  ``domain``: one of
    :data:`DOMAINS`, or raw embeddings of recordings like these to centre on (:func:`domain_embeddings`).
    A pair with a recording of fewer than ``min_speech`` seconds of voiced speech gets
    ``same_speaker`` null and a ``warning`` (:func:`speech_warning`).  ``calibration``: one of
    :data:`~spkflow.score.model_scoring.CALIBRATIONS` (:meth:`Scoring.on_batch`: the batch's own
    calibration, without labels, where it is large enough and trusted); the summary's
    ``calibration`` says which decided and why."""
    scoring = scoring if scoring is not None else embedder.scoring
    emb, bad = source.embed(embedder, [*pairs.enroll, *pairs.test], skip_bad=skip_bad, progress=progress)
    keep = np.array([a in emb and b in emb for a, b in zip(pairs.enroll, pairs.test, strict=True)], dtype=bool)
    if not keep.any():
        raise InputError(pairs.path, None, "no pair has both recordings readable")
    kept = pairs.subset(keep) if not keep.all() else pairs
    dom = _domain(domain, emb, scoring)
    result = scoring.score_trials(kept, emb, emb_source=pairs.path, domain=dom)
    scoring, batch = scoring.on_batch(result.scores, len(emb), calibration)
    names = list(emb)
    pos = {n: i for i, n in enumerate(names)}
    ia = np.fromiter((pos[u] for u in kept.enroll), dtype=np.int64, count=len(kept))
    ib = np.fromiter((pos[u] for u in kept.test), dtype=np.int64, count=len(kept))
    v = scoring.verdict(indexed_cosine(np.stack([emb[n] for n in names]), ia, ib), result.scores)
    flagged = 0
    for i, (x, y) in enumerate(zip(kept.enroll, kept.test, strict=True)):
        row: dict[str, Any] = {
            "a": x,
            "b": y,
            "score": _num(v.score[i]),
            "norm_score": _num(v.norm_score[i]),
            "llr": None if v.llr is None else _num(v.llr[i]),
            "same_speaker": None if v.same_speaker is None else bool(v.same_speaker[i]),
        }
        if row["llr"] is None and v.llr is not None:  # a NaN / infinite LLR decides nothing
            row["same_speaker"] = None
            row["warning"] = "the model's calibration gives no finite LLR: no decision"
        if kept.labelled:
            row["label"] = "target" if kept.target[i] else "nontarget"
        if (warn := speech_warning(source.speech, (x, y), min_speech)) is not None:
            row["same_speaker"] = None
            row["warning"] = warn
            flagged += 1
        if (note := source.note((x, y))) is not None:
            row["note"] = note
        out.write(jsonsafe.dumps(row) + "\n")
    summary: dict[str, Any] = {
        "pairs": len(kept),
        "little_speech_pairs": flagged,
        "min_speech": min_speech,
        "skipped_pairs": int((~keep).sum()),
        "bad_recordings": bad,
        "recordings": len(emb),
        "centred_on": _centred_on(dom, domain, f"the {len(emb)} recordings of the pairs", scoring),
        "scoring": scoring.label,
        "calibrated": scoring.calibration is not None,
        "calibration": _calibration_said(scoring, batch, calibration),
    }
    labels = kept.target.astype(int)
    if kept.labelled and 0 < labels.sum() < len(labels):
        summary["eer_cosine"] = compute_eer(v.score, labels)[0]
        summary["eer"] = compute_eer(result.scores, labels)[0]
        if v.llr is not None and np.isfinite(v.llr).all():  # a broken calibration: no figures of its decisions
            summary.update(decision_metrics(v.llr, labels, scoring.decision))
    return summary


def domain_choice(embedder: Any, domain: str, *, progress: bool = True) -> str | np.ndarray:
    """``--domain-mean`` of verify and identify: a named rule (:data:`DOMAINS`) as it is, else the
    embeddings of the recordings at the path ``domain`` (:func:`domain_embeddings`)."""
    return domain if domain in DOMAINS else domain_embeddings(embedder, domain, progress=progress)


def domain_embeddings(embedder: Any, path: str, *, progress: bool = True) -> np.ndarray:
    """Raw embeddings of unlabelled recordings to centre on: every utterance of a data dir
    (embedded here), every vector of an embedding scp, or the recordings of a saved gallery
    (``identify --save``: no audio read; one made with another model is refused).  Fewer than
    :data:`~spkflow.score.model_scoring.MIN_DOMAIN` is an error naming ``path``."""
    p = Path(path)
    if p.is_dir():
        emb, _ = Recordings(str(p)).embed(embedder, DataDir(p).utts(), progress=progress)
    elif p.is_file() and p.suffix == ".npz":
        g = Gallery.load(p, embedder_stamp(embedder), embedder.dim)
        emb = {str(i): v for i, v in enumerate(g.emb)}  # utterance ids of two enrolments may repeat
    elif p.is_file():
        emb = read_embeddings(p)
    else:
        raise InputError(p, None, "not found: give a data dir or an embedding scp of recordings like the scored ones")
    if len(emb) < MIN_DOMAIN:
        raise InputError(p, None, f"{len(emb)} recordings: the domain mean needs at least {MIN_DOMAIN}")
    return np.stack(list(emb.values()))


def open_set_threshold(n_speakers: int, p_known: float) -> float:
    """The best speaker's LLR above which it is more probable than "unknown" (Bayes' rule with
    the prior ``p_known`` spread evenly over ``n_speakers``)."""
    return math.log(n_speakers) - logit(p_known)


def enrol_gallery(
    embedder: Any,
    enrol: DataDir,
    source: Recordings,
    *,
    skip_bad: bool = False,
    progress: bool = True,
) -> tuple[Gallery, dict[str, str]]:
    """The enrolment of a data dir (its ``spk2utt``) as a :class:`~spkflow.deploy.gallery.Gallery`
    (raw embeddings and voiced seconds of every readable utterance), and the unreadable ones."""
    spk2utt = enrol.spk2utt()
    utt2spk = {u: s for s in spk2utt for u in spk2utt[s]}
    emb, bad = source.embed(embedder, list(utt2spk), skip_bad=skip_bad, progress=progress)
    if not emb:
        raise InputError(enrol.path, None, "no speaker could be enrolled")
    return Gallery.of(embedder_stamp(embedder), utt2spk, emb, source.speech), bad


def enrolment(
    embedder: Any,
    *,
    enrol_dir: str | None = None,
    gallery: str | None = None,
    remove: Sequence[str] = (),
    save: str | None = None,
    skip_bad: bool = False,
    progress: bool = True,
) -> Callable[[], tuple[Gallery, dict[str, str]]]:
    """The enrolment :func:`identify` calls for: a saved gallery (read now, so one made with
    another model is refused before anything is embedded), with the speakers of ``enrol_dir``
    added (or replacing theirs) and ``remove`` taken out, written to ``save`` when given."""
    stamp = embedder_stamp(embedder)
    saved = Gallery.load(gallery, stamp, embedder.dim) if gallery is not None else None
    if enrol_dir is None and saved is None:
        raise ValueError("give an enrolment data dir or a gallery")

    def run() -> tuple[Gallery, dict[str, str]]:
        g, bad = saved, {}
        if enrol_dir is not None:
            new, bad = enrol_gallery(embedder, DataDir(enrol_dir), Recordings(enrol_dir), skip_bad=skip_bad,
                                     progress=progress)  # fmt: skip
            g = new if g is None else g.merge(new)
        assert g is not None
        if remove:
            g = g.remove(list(remove), str(gallery or enrol_dir))
        if save is not None:
            g.save(save)
            log.info("gallery of %d speakers (%d utterances) -> %s", len(g.speaker_names()), len(g.utts), save)
        return g, bad

    return run


def identify(
    embedder: Any,
    tests: Sequence[str],
    out: IO[str],
    *,
    enrol: Callable[[], tuple[Gallery, dict[str, str]]],
    test_source: Recordings,
    top_k: int = 3,
    p_known: float = 0.5,
    threshold: float | None = None,
    domain: str | np.ndarray = "auto",
    skip_bad: bool = False,
    progress: bool = True,
    min_speech: float = MIN_SPEECH,
) -> dict[str, Any]:
    """Rank the enrolled speakers (each: the mean of its utterances in the scoring space) for
    every recording of ``tests``; write one JSON line per test (``speaker``: the best one or
    ``"unknown"``, ``file``, ``top``: the ``top_k`` speakers with ``llr``, ``norm_score`` and
    ``posterior``, ``p_unknown``).  ``enrol``: called once the tests are embedded (so an
    unreadable test fails first), gives the gallery (:func:`enrol_gallery`, or a saved one) and
    its unreadable utterances.  ``threshold``: a fixed LLR for "unknown" instead of Bayes' rule.
    ``domain``: as :func:`verify_pairs`, over the enrolment and test recordings together.
    Without a calibration the ranking is by score and no "unknown" is decided.  A test recording
    of fewer than ``min_speech`` seconds of voiced speech gets ``speaker`` null and a
    ``warning``; an enrolment utterance of fewer is left out of its speaker (logged)."""
    scoring: Scoring = embedder.scoring
    test_emb, bad_test = test_source.embed(embedder, tests, skip_bad=skip_bad, progress=progress)
    names = [t for t in dict.fromkeys(tests) if t in test_emb]
    if not names:
        raise InputError(str(test_source.data_dir or "<files>"), None, "no test recording could be read")
    gallery, bad_enrol = enrol()
    keep = ~(gallery.speech < min_speech)  # unknown (NaN) seconds are kept
    if not keep.all():
        first = gallery.utts[int(np.argmin(keep))]
        log.warning(
            "%d enrolment utterance(s) with fewer than %g s of voiced speech left out, e.g. %s",
            int((~keep).sum()),
            min_speech,
            first,
        )
    groups: dict[str, list[np.ndarray]] = {}
    for spk, vec, ok in zip(gallery.speakers, gallery.emb, keep, strict=True):
        if ok:
            groups.setdefault(spk, []).append(vec)
    speakers = list(groups)
    if not speakers:
        raise InputError("<enrolment>", None, f"no speaker has an utterance of >= {min_speech:g} s of voiced speech")
    enrol_emb = {f"enrol:{i}": v for i, (v, ok) in enumerate(zip(gallery.emb, keep, strict=True)) if ok}
    dom = _domain(domain, {**enrol_emb, **test_emb}, scoring)
    models = scoring.enrol([np.stack(groups[s]) for s in speakers], dom)
    scores = scoring.score_models(np.stack([test_emb[t] for t in names]), models, dom)
    llr = scoring.llr(scores)
    thr = None
    if llr is not None:
        thr = threshold if threshold is not None else open_set_threshold(len(speakers), p_known)
    k = min(top_k, len(speakers))
    decided: dict[str, int] = {}
    for i, name in enumerate(names):
        rank = np.argsort(-scores[i], kind="stable")[:k]
        top: list[dict[str, Any]] = []
        post = p_unknown = None
        if llr is not None:
            # posteriors over the S speakers and "unknown": p_known / S x exp(llr_s) against 1 - p_known
            w = np.log(p_known / len(speakers)) + llr[i]
            with np.errstate(invalid="ignore"):  # a NaN score (a broken embedding) gives NaN posteriors, said as null
                z = np.logaddexp(np.logaddexp.reduce(w), math.log1p(-p_known))
            post, p_unknown = np.exp(w - z), float(np.exp(math.log1p(-p_known) - z))
        for j in rank:
            item: dict[str, Any] = {"speaker": speakers[j], "norm_score": _num(scores[i, j])}
            if llr is not None and post is not None:
                item.update(llr=_num(llr[i, j]), posterior=_num(post[j]))
            top.append(item)
        best: str | None = speakers[rank[0]]
        if llr is not None and thr is not None and not llr[i, rank[0]] > thr:
            best = "unknown"
        warn = speech_warning(test_source.speech, (name,), min_speech)
        if warn is None and llr is not None and not np.isfinite(llr[i, rank[0]]):
            warn = "the model's calibration gives no finite LLR: no decision"
        if warn is not None:
            best = None
        decided[str(best)] = decided.get(str(best), 0) + 1
        row: dict[str, Any] = {"speaker": best, "file": name, "top": top}
        if p_unknown is not None:
            row["p_unknown"] = _num(p_unknown)
        if warn is not None:
            row["warning"] = warn
        if (note := test_source.note((name,))) is not None:
            row["note"] = note
        out.write(jsonsafe.dumps(row) + "\n")
    return {
        "tests": len(names),
        "speakers": len(speakers),
        "enrolment_utterances": len(enrol_emb),
        "gallery": gallery,
        "bad_recordings": {**bad_enrol, **bad_test},
        "threshold": thr,
        "centred_on": _centred_on(dom, domain, "the enrolment and test recordings", scoring),
        "unknown": decided.get("unknown", 0),
        "little_speech": decided.get("None", 0),
        "enrol_little_speech": int((~keep).sum()),
        "decided": decided,
        "scoring": scoring.label,
    }


def read_list(path: str) -> list[str]:
    """Recordings listed one per line (blank lines are errors naming the line)."""
    names = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                raise InputError(path, n, "blank line: one recording per line")
            names.append(line.strip())
    return names


def _entry_file(entry: str) -> str | None:
    """The audio file a wav.scp entry reads: the path itself, or the ``-i`` input of a pipe
    (make_data_dir's and the VoxCeleb2 recipe's ffmpeg pipes); None for other pipes and arks."""
    entry = entry.strip()
    if entry.endswith("|"):
        try:
            tokens = shlex.split(entry[:-1])
        except ValueError:
            return None
        return tokens[tokens.index("-i") + 1] if "-i" in tokens[:-1] else None
    return entry


def file_ids(data_dir: str | os.PathLike[str], names: Iterable[str]) -> dict[str, str]:
    """``name -> utterance id`` for every name that is no utterance id of ``data_dir`` but a file
    its ``wav.scp`` reads (compared as real paths, relative ones from the working directory, as
    Kaldi reads wav.scp); so a pairs file of paths can use the embeddings stage 5 extracted from
    that data dir.  A file listed twice, or cut into ``segments``, is an error naming it."""
    d = Path(data_dir)
    wav = read_kv(d / "wav.scp")
    segmented = (d / "segments").is_file()
    utts = set(read_kv(d / "segments")) if segmented else set(wav)
    index: dict[str, list[str]] = {}
    for utt, entry in wav.items():
        f = _entry_file(entry)
        if f is not None:
            index.setdefault(os.path.realpath(f), []).append(utt)
    out: dict[str, str] = {}
    for name in names:
        if name in utts or name in out:
            continue
        hits = index.get(os.path.realpath(name))
        if hits is None:
            continue
        if len(hits) > 1 or segmented:
            why = "cut into segments" if segmented else f"listed {len(hits)} times ({', '.join(hits[:3])})"
            raise InputError(d / "wav.scp", None, f"{name} is {why}: name its utterance ids instead")
        out[name] = hits[0]
    return out


def pairs_from(args: Iterable[str]) -> Trials:
    """Two recordings given on the command line as one unlabelled pair."""
    a, b = list(args)
    return Trials.from_pairs([(a, b, False)], "<command line>", labelled=False)
