"""Verification and identification of new recordings with a trained model: the work behind
``python -m spkflow.bin.verify`` and ``python -m spkflow.bin.identify``.

Recordings are named by audio path (any ``wav.scp`` entry), by utterance id of a data dir
(``wav.scp`` + ``segments``), or by key of an embedding scp (stage 5's ``xvector.scp``: no audio
read, the numbers stage 6 scored).  Each distinct recording is read and embedded once, in
batches (:meth:`spkflow.api.Embedder.embed_batch`, a progress bar on a terminal), and every pair
is scored at once by the model's :class:`~spkflow.score.verification.Scoring`: thousands of pairs
take the time of embedding their recordings plus milliseconds.

What it guarantees
------------------
* **The API's and stage 6's numbers.**  Scores come from the same ``Scoring`` the API and stage
  6 use; a batch of pairs naming at least :data:`~spkflow.score.verification.MIN_DOMAIN`
  recordings is centred on their own mean (``domain="auto"``; ``"pairs"`` always, ``"train"``
  never), as stage 6's ``--score_eval_mean true`` centres a set, so ``verify --pairs trials`` over
  stage 5's embeddings gives stage 6's scores, and one pair gives ``Embedder.verify``'s.
* **Bad input is named**: a pairs line (file and line), an unreadable recording (its path or
  utterance and why), an utterance absent from the data dir or scp.  With ``skip_bad`` the pairs
  (or files) whose recording cannot be read are left out and counted instead.
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
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from spkflow.core import jsonsafe
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.audio import AudioReader, read_audio
from spkflow.data.datadir import DataDir
from spkflow.score.calibration import logit
from spkflow.score.metrics import compute_eer
from spkflow.score.scoring import Trials, read_embeddings
from spkflow.score.verification import MIN_DOMAIN, Scoring, decision_metrics, indexed_cosine

__all__ = ["DOMAINS", "Recordings", "domain_embeddings", "identify", "open_set_threshold", "verify_pairs"]

log = logging.getLogger(__name__)

DOMAINS = ("auto", "pairs", "train")
_CHUNK = 256  # recordings read and embedded at a time (bounded memory)


@dataclass
class Recordings:
    """Where recordings come from: audio paths (default), a data dir's utterances, or an embedding scp."""

    data_dir: str | None = None
    xvector_scp: str | None = None

    def embed(
        self, embedder: Any, names: Sequence[str], *, skip_bad: bool = False, progress: bool = True
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """``name -> raw embedding`` of every name, and ``name -> reason`` of those that could
        not be read (only with ``skip_bad``; otherwise the first one raises, named)."""
        names = list(dict.fromkeys(names))
        if self.xvector_scp is not None:
            emb = read_embeddings(self.xvector_scp, names)
            missing = [n for n in names if n not in emb]
            if missing and not skip_bad:
                raise InputError(self.xvector_scp, None, f"no embedding of {missing[0]!r} ({len(missing)} missing)")
            return emb, {n: f"not in {self.xvector_scp}" for n in missing}
        reader = AudioReader(self.data_dir, sample_rate=None) if self.data_dir is not None else None
        if reader is not None:
            absent = [n for n in names if n not in reader]
            if absent:
                raise InputError(Path(self.data_dir or "") / "wav.scp", None, f"no utterance {absent[0]!r}")
        out: dict[str, np.ndarray] = {}
        bad: dict[str, str] = {}
        bar = _bar(len(names), progress)
        for start in range(0, len(names), _CHUNK):
            chunk, waves, rates = [], [], []
            for name in names[start : start + _CHUNK]:
                try:
                    wave, rate = reader.read_native(name) if reader is not None else read_audio(name, utt=name)
                    if wave.shape[0] < rate * 0.025:
                        raise UtteranceError(name, name, f"shorter than one 25 ms frame ({wave.shape[0]} samples)")
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
                out.update(_embed_chunk(embedder, chunk, waves, rates, bad, skip_bad))
            bar.update(min(_CHUNK, len(names) - start))
        bar.close()
        return out, bad


def _embed_chunk(
    embedder: Any, names: list[str], waves: list[np.ndarray], rates: list[int], bad: dict[str, str], skip_bad: bool
) -> dict[str, np.ndarray]:
    """Embeddings of one chunk; a recording the frontend leaves nothing of (all silence to the
    VAD) is named, or with ``skip_bad`` left out."""
    try:
        return dict(zip(names, embedder.embed_batch(waves, rates), strict=True))
    except ValueError:
        pass
    out = {}
    for name, wave, rate in zip(names, waves, rates, strict=True):
        try:
            out[name] = embedder.embed(wave, rate)
        except ValueError as exc:
            if not skip_bad:
                raise UtteranceError(name, name, str(exc)) from None
            bad[name] = str(exc)
            log.warning("skipping %s: %s", name, exc)
    return out


def _bar(total: int, progress: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="embedding", unit="rec", file=sys.stderr, disable=not progress or total < 2)


def _domain(mode: str | np.ndarray, emb: dict[str, np.ndarray], scoring: Scoring) -> np.ndarray | None:
    if isinstance(mode, np.ndarray):  # embeddings of recordings like these, given
        return mode if scoring.centres else None
    if mode not in DOMAINS:
        raise ValueError(f"domain must be one of {', '.join(DOMAINS)}, got {mode!r}")
    if mode == "pairs" and scoring.centres and len(emb) < MIN_DOMAIN:
        raise ValueError(
            f"--domain-mean pairs: {len(emb)} recordings to centre on; centring fewer than {MIN_DOMAIN} on "
            "their own mean pushes any two of them apart (two recordings of one speaker score as different "
            "speakers): use auto (the model's mean for so few), train, or a data dir / embedding scp of "
            f">= {MIN_DOMAIN} recordings like these"
        )
    if mode == "train" or (mode == "auto" and (len(emb) < MIN_DOMAIN or not scoring.centres)) or not emb:
        return None
    return np.stack(list(emb.values()))


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
) -> dict[str, Any]:
    """Score ``pairs`` and write one JSON line per pair to ``out`` (``a``, ``b``, ``score`` the
    plain cosine, ``norm_score``, ``llr``, ``same_speaker``; ``label`` for labelled pairs);
    returns a summary (counts, the centring, and for labelled pairs the figures of
    :func:`~spkflow.score.verification.decision_metrics` and both EERs).  ``domain``: one of
    :data:`DOMAINS`, or raw embeddings of recordings like these to centre on (:func:`domain_embeddings`)."""
    scoring = scoring if scoring is not None else embedder.scoring
    emb, bad = source.embed(embedder, [*pairs.enroll, *pairs.test], skip_bad=skip_bad, progress=progress)
    keep = np.array([a in emb and b in emb for a, b in zip(pairs.enroll, pairs.test, strict=True)], dtype=bool)
    if not keep.any():
        raise InputError(pairs.path, None, "no pair has both recordings readable")
    kept = pairs.subset(keep) if not keep.all() else pairs
    dom = _domain(domain, emb, scoring)
    result = scoring.score_trials(kept, emb, emb_source=pairs.path, domain=dom)
    names = list(emb)
    pos = {n: i for i, n in enumerate(names)}
    ia = np.fromiter((pos[u] for u in kept.enroll), dtype=np.int64, count=len(kept))
    ib = np.fromiter((pos[u] for u in kept.test), dtype=np.int64, count=len(kept))
    v = scoring.verdict(indexed_cosine(np.stack([emb[n] for n in names]), ia, ib), result.scores)
    for i, (x, y) in enumerate(zip(kept.enroll, kept.test, strict=True)):
        row: dict[str, Any] = {
            "a": x,
            "b": y,
            "score": round(float(v.score[i]), 6),
            "norm_score": round(float(v.norm_score[i]), 6),
            "llr": None if v.llr is None else round(float(v.llr[i]), 6),
            "same_speaker": None if v.same_speaker is None else bool(v.same_speaker[i]),
        }
        if kept.labelled:
            row["label"] = "target" if kept.target[i] else "nontarget"
        out.write(jsonsafe.dumps(row) + "\n")
    summary: dict[str, Any] = {
        "pairs": len(kept),
        "skipped_pairs": int((~keep).sum()),
        "bad_recordings": bad,
        "recordings": len(emb),
        "centred_on": ("the training mean" if scoring.centres else "nothing (the scoring does not centre)")
        if dom is None
        else (
            f"the {len(dom)} given recordings"
            if isinstance(domain, np.ndarray)
            else f"the {len(emb)} recordings of the pairs"
        ),
        "scoring": scoring.label,
        "calibrated": scoring.calibration is not None,
    }
    labels = kept.target.astype(int)
    if kept.labelled and 0 < labels.sum() < len(labels):
        summary["eer_cosine"] = compute_eer(v.score, labels)[0]
        summary["eer"] = compute_eer(result.scores, labels)[0]
        if v.llr is not None:
            summary.update(decision_metrics(v.llr, labels, scoring.decision))
    return summary


def domain_embeddings(embedder: Any, path: str, *, progress: bool = True) -> np.ndarray:
    """Raw embeddings of unlabelled recordings to centre on: every utterance of a data dir
    (embedded here) or every vector of an embedding scp.  Fewer than
    :data:`~spkflow.score.verification.MIN_DOMAIN` is an error naming ``path``."""
    p = Path(path)
    if p.is_dir():
        emb, _ = Recordings(str(p)).embed(embedder, DataDir(p).utts(), progress=progress)
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


def identify(
    embedder: Any,
    enrol: DataDir,
    tests: Sequence[str],
    out: IO[str],
    *,
    enrol_source: Recordings,
    test_source: Recordings,
    top_k: int = 3,
    p_known: float = 0.5,
    threshold: float | None = None,
    domain: str | np.ndarray = "auto",
    skip_bad: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Rank the speakers of ``enrol`` (each: the mean of its utterances in the scoring space)
    for every recording of ``tests``; write one JSON line per test (``file``, ``top``: the
    ``top_k`` speakers with ``llr``, ``norm_score`` and ``posterior``, ``speaker``: the best one or
    ``"unknown"``, ``p_unknown``).  ``threshold``: a fixed LLR for "unknown" instead of Bayes'
    rule.  ``domain``: as :func:`verify_pairs`, over the enrolment and test recordings together.
    Without a calibration the ranking is by score and no "unknown" is decided."""
    scoring: Scoring = embedder.scoring
    spk2utt = enrol.spk2utt()
    utts = [u for s in spk2utt for u in spk2utt[s]]
    enrol_emb, bad_enrol = enrol_source.embed(embedder, utts, skip_bad=skip_bad, progress=progress)
    speakers = [s for s in spk2utt if any(u in enrol_emb for u in spk2utt[s])]
    if not speakers:
        raise InputError(enrol.path, None, "no speaker could be enrolled")
    test_emb, bad_test = test_source.embed(embedder, tests, skip_bad=skip_bad, progress=progress)
    names = [t for t in dict.fromkeys(tests) if t in test_emb]
    if not names:
        raise InputError(str(test_source.data_dir or "<files>"), None, "no test recording could be read")
    dom = _domain(domain, {**{f"enrol:{u}": v for u, v in enrol_emb.items()}, **test_emb}, scoring)
    models = scoring.enrol([np.stack([enrol_emb[u] for u in spk2utt[s] if u in enrol_emb]) for s in speakers], dom)
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
            z = np.logaddexp(np.logaddexp.reduce(w), math.log1p(-p_known))
            post, p_unknown = np.exp(w - z), float(np.exp(math.log1p(-p_known) - z))
        for j in rank:
            item: dict[str, Any] = {"speaker": speakers[j], "norm_score": round(float(scores[i, j]), 6)}
            if llr is not None and post is not None:
                item.update(llr=round(float(llr[i, j]), 6), posterior=round(float(post[j]), 6))
            top.append(item)
        best = speakers[rank[0]]
        if llr is not None and thr is not None and llr[i, rank[0]] <= thr:
            best = "unknown"
        decided[best] = decided.get(best, 0) + 1
        row = {"file": name, "speaker": best, "top": top}
        if p_unknown is not None:
            row["p_unknown"] = round(p_unknown, 6)
        out.write(jsonsafe.dumps(row) + "\n")
    return {
        "tests": len(names),
        "speakers": len(speakers),
        "enrolment_utterances": len(enrol_emb),
        "bad_recordings": {**bad_enrol, **bad_test},
        "threshold": thr,
        "centred_on": ("the training mean" if scoring.centres else "nothing (the scoring does not centre)")
        if dom is None
        else (
            f"the {len(dom)} given recordings"
            if isinstance(domain, np.ndarray)
            else "the enrolment and test recordings"
        ),
        "unknown": decided.get("unknown", 0),
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


def pairs_from(args: Iterable[str]) -> Trials:
    """Two recordings given on the command line as one unlabelled pair."""
    a, b = list(args)
    return Trials.from_pairs([(a, b, False)], "<command line>", labelled=False)
