"""The diarization pipeline of one recording in memory, and its policy: the part that the recipe
(``spkflow.bin.diar_cluster`` on stage 3's ``xvector.scp``), ``python -m spkflow.bin.diarize`` and
``Embedder.diarize`` share.

spkflow.diar works at three levels, one module each, each calling the one below and never one above:

* this module, **one recording in memory**: a waveform to speech regions, windows and their
  embeddings (:func:`embed_windows`, given an embedding function), window embeddings to speaker
  turns (:func:`diarize_recording`), and the defaults (:class:`Settings`, :meth:`Settings.options`);
* :mod:`spkflow.diar.recipe_stages`, **over a recording dir** (the recipe's ``data/<set>``):
  diar.sh's stages 2 (windows), 4 (clustering) and 5 (scoring), files in, files out;
* :mod:`spkflow.diar.file_list`, **over a list of audio files** (the command and the API): every
  input checked before any output, one RTTM per file, a user's files never replaced.

The policy (:meth:`Settings.options`), one place for the command, the API and, through
``diar_cluster``'s options, the recipe: the clustering ``method`` when none is asked for is
``ahc`` stopped at the calibrated LLR when the model's scoring has a calibration, else ``gmm``
(the count from the recording's own scores; spectral before: leave-one-corpus-out with
Resemblyzer, a model without calibration, 28.6 -> 20.2 % DER forgiving held out,
egs/speechocean762/diar1/RESULTS.md); the centring is the set's windows (``centre="set"``):
recordings like these when given (a domain), else the windows of all the recordings of the call
(the recipe's set, the command's files, the API's one file) when they are at least
:data:`CENTRE_FROM`, else the scoring's training mean (:func:`call_domain`); ``threshold`` moves
where ``ahc`` stops;
``num_speakers`` forces the count and ``max_speakers`` bounds an estimated one.  A forced count is
returned exactly (AHC counts only clusters of a share of the windows, resegmentation never
empties one: an hour of 8 speakers forced to 8 gave 7, one a catch-all of 3 speakers); one the
windows cannot give (more speakers than windows) is honoured as far as it can be and said in a
warning naming the recording.

Steps of :func:`diarize_recording`, each switchable in :class:`DiarOptions` (so that a baseline is
the same code with steps off):

1. the space: the model's scoring space (:meth:`spkflow.score.model_scoring.Scoring.space`: its
   backend, e.g. WCCN, and a centring), L2-normalised.  ``centre``: ``none``, the scoring's
   training mean; ``set``, the mean of every window of the recordings diarized together (no labels
   used: what verification does for a batch of recordings, and what lets a calibration fitted on
   other recordings carry over: the recipe's default, egs/speechocean762/diar1/RESULTS.md);
   ``recording``, the recording's *own* windows (which, in a one-speaker recording, is that
   speaker).  With ``backend`` off, plain L2-normalised embeddings;
2. clustering (:mod:`spkflow.diar.cluster`): ``spectral`` (speaker count estimated by the
   eigengap between 2 and the bound; then, with a calibrated scoring, clusters whose speaker
   models are the same speaker by the calibrated LLR are merged, down to one speaker:
   :func:`merge_same_speakers`; the library's own one-speaker test, a BIC fit of the affinities,
   took 4- to 6-speaker recordings for one speaker in 6 of 10 simulated ones) or ``ahc`` (average
   linkage on the scoring's calibrated LLRs, stopped at its Bayes threshold, or at ``threshold``
   when given: an LLR, or for a model without calibration a score of its space, tuned on held-out
   recordings as Kaldi's ``callhome_diarization`` tunes its PLDA threshold; a forced count cuts
   the tree at the first level with that many clusters of :data:`spkflow.diar.cluster.MIN_SHARE`
   of the windows), or ``gmm`` (average linkage on the cosine scores of the space, stopped where a
   two-component fit of the recording's *own* window-pair scores puts the change from one speaker
   to two, or at ``threshold``, a cosine: :mod:`spkflow.diar.pair_fit`; no calibration, so it
   serves a model without one and a domain unlike the calibration's);
3. resegmentation (``resegment``): windows reassigned to the nearest speaker centroid with
   similarities smoothed over neighbouring windows (with a forced count, no cluster emptied).
   By default (``None``) when the count is forced or the recording has at least
   :data:`RESEGMENT_FROM` windows: on the five corpora of leave-one-corpus-out (conversations of
   a minute) leaving it out after an estimated count lowered DER forgiving on each (AHC centred on
   the set; DSPSpeech-20 41.2 -> 24.1 %), while on the hour of 8 speakers it is what makes AHC's
   clusters speakers (estimated count 39.0 -> 21.7 %, forced 30.3 -> 9.3 %; a development figure:
   one long recording; egs/speechocean762/diar1/RESULTS.md);
4. turns: :func:`spkflow.diar.windows.windows_to_turns` (midpoint rule, one speaker per instant).

A recording without windows (silence, or speech shorter than a window) gives no turns; one with
a single window gives one speaker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from spkflow.diar.cluster import ahc_labels, resegment, spectral_labels
from spkflow.diar.pair_fit import POSTERIOR, count_labels
from spkflow.diar.regions import Regions, intersect
from spkflow.diar.rttm import Turn
from spkflow.diar.speech import DEFAULT_DETECTOR, Progress, detect_speech
from spkflow.diar.windows import Window, check_windowing, plan_windows, windows_to_turns
from spkflow.score.backend import l2_rows
from spkflow.score.model_scoring import Scoring

__all__ = [
    "CENTRES",
    "CENTRE_FROM",
    "EMBED_CHUNK",
    "METHODS",
    "RESEGMENT_FROM",
    "DiarOptions",
    "Settings",
    "Windowed",
    "call_domain",
    "centring",
    "cluster_recording",
    "diarize_recording",
    "embed_windows",
    "embedding_space",
    "merge_same_speakers",
]

log = logging.getLogger(__name__)

#: ``embed(crops, sample_rate) -> [N, D]`` raw embeddings (``Embedder.embed_batch``)
EmbedFn = Callable[[Sequence[np.ndarray], int], np.ndarray]

METHODS = ("spectral", "ahc", "gmm")

#: windows from which an estimated count is resegmented by default (7.5 minutes of speech at
#: run.sh's windows; the size from which spectral clustering groups windows, cluster.MAX_SPECTRAL)
RESEGMENT_FROM = 600
CENTRES = ("none", "set", "recording")
#: fewest windows of one call (all its recordings together) that it is centred on when no domain
#: is given (fewer: the training mean); leave-one-corpus-out, demo model, AHC at the calibrated
#: LLR (egs/speechocean762/diar1/RESULTS.md): one 60 s conversation's own ~75 windows lose to the
#: training mean on 4 corpora of 5, 36 of them together (~2,800 windows) win in 4 folds of 5, the
#: hour's own 3,995 windows take its forced-count DER from 19.35 to 9.28 %; 600 (7.5 minutes of
#: speech at 1.5 s / 0.75 s, the size from which resegmentation starts) lies between
CENTRE_FROM = 600
#: windows embedded per call of the embedding function by :func:`embed_windows` (48 s of speech at
#: 1.5 s / 0.75 s): the steps a progress bar moves by, each well under a minute on a loaded CPU
EMBED_CHUNK = 64


@dataclass(frozen=True)
class DiarOptions:
    """How one recording is clustered (see the module doc)."""

    method: str = "spectral"
    num_speakers: int | None = None
    max_speakers: int = 8
    backend: bool = True
    centre: str = "none"
    resegment: bool | None = None  # None: when the count is forced or the recording is long (the module doc)
    threshold: float | None = None  # where AHC and the LLR merge stop (None: the scoring's decision threshold)
    posterior: float | None = None  # gmm: the same-speaker posterior where it stops (None: pair_fit.POSTERIOR)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"clustering method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.centre not in CENTRES:
            raise ValueError(f"centre must be one of {', '.join(CENTRES)}, got {self.centre!r}")
        if self.num_speakers is not None and self.num_speakers < 1:
            raise ValueError(f"num_speakers must be >= 1, got {self.num_speakers}")
        if self.max_speakers < 1:
            raise ValueError(f"max_speakers must be >= 1, got {self.max_speakers}")
        if self.posterior is not None and not 0.0 < self.posterior < 1.0:
            raise ValueError(f"posterior must be in (0, 1), got {self.posterior}")

    def describe(self) -> str:
        parts = [
            "the model's scoring space" if self.backend else "plain L2-normalised embeddings",
            {
                "none": "centred on the training mean",
                "set": "centred on the set's windows",
                "recording": "centred on the recording's windows",
            }[self.centre],
            {
                "spectral": "spectral clustering (auto-tuned)",
                "ahc": "AHC stopped at the calibrated LLR threshold",
                "gmm": "AHC stopped where a two-component fit of the recording's own scores crosses",
            }[self.method],
        ]
        if self.resegment or (self.resegment is None and self.num_speakers):
            parts.append("resegmented")
        elif self.resegment is None:
            parts.append(f"resegmented from {RESEGMENT_FROM} windows")
        if self.threshold is not None and not self.num_speakers:
            parts.append(f"stopped at {self.threshold:g}")
        k = f"{self.num_speakers} speakers" if self.num_speakers else f"at most {self.max_speakers} speakers"
        return ", ".join(parts) + f", {k}"


@dataclass(frozen=True)
class Settings:
    """What a user chooses (the command's options, ``Embedder.diarize``'s arguments); ``None``:
    the pipeline's default, decided by :meth:`options` for the model at hand.  Checked when made,
    so that a bad value is refused before any audio is read."""

    method: str | None = None
    num_speakers: int | None = None
    max_speakers: int = 8
    threshold: float | None = None
    window: float = 1.5
    shift: float = 0.75
    min_window: float = 0.5

    def __post_init__(self) -> None:
        check_windowing(self.window, self.shift, self.min_window)
        DiarOptions(method=self.method or METHODS[0], num_speakers=self.num_speakers, max_speakers=self.max_speakers)

    def options(self, scoring: Scoring, *, centred: bool = False) -> DiarOptions:
        """The clustering for a model's ``scoring`` (the module doc's policy); ``centred``: the
        windows will be centred on recordings like these (a domain), not the training mean."""
        method = self.method or ("ahc" if scoring.calibration is not None else "gmm")
        return DiarOptions(
            method=method,
            num_speakers=self.num_speakers,
            max_speakers=self.max_speakers,
            centre="set" if centred else "none",
            threshold=self.threshold,
        )


def call_domain(windows: Sequence[np.ndarray], domain: np.ndarray | None = None) -> np.ndarray | None:
    """The raw embeddings a call's recordings are centred on (the module doc's policy; None: the
    training mean), said in one INFO line: ``domain`` when given (recordings like these, which
    win); else the rows of every ``windows[i]`` (each recording's raw window embeddings
    ``[N_i, D]``) stacked, when there are at least :data:`CENTRE_FROM` of them."""
    if domain is not None:
        dom = np.atleast_2d(np.asarray(domain, dtype=np.float64))
        log.info("centring: on the %d embeddings of the domain given", len(dom))
        return dom
    parts = [np.asarray(w, dtype=np.float64) for w in windows if len(w)]
    n = sum(len(w) for w in parts)
    if n < CENTRE_FROM:
        log.info(
            "centring: on the training mean (%d windows in %d recordings, fewer than %d to centre on; "
            "give recordings like these as a domain)",
            n,
            len(windows),
            CENTRE_FROM,
        )
        return None
    log.info("centring: on the %d windows of the %d recordings of this call", n, len(windows))
    return np.concatenate(parts)


def centring(x: np.ndarray, opts: DiarOptions, domain: np.ndarray | None) -> np.ndarray | None:
    """The raw embeddings to centre on (None: the scoring's training mean): the recording's own
    windows ``x`` (at least 2), or ``domain``, the windows of the set, for ``centre="set"``."""
    if opts.centre == "recording":
        return x if len(x) >= 2 else None
    if opts.centre == "set":
        if domain is None:
            raise ValueError("centre='set' needs the set's windows (domain)")
        return np.asarray(domain, dtype=np.float64)
    return None


def embedding_space(x: np.ndarray, scoring: Scoring, opts: DiarOptions, domain: np.ndarray | None = None) -> np.ndarray:
    """Step 1: rows of ``x`` ``[N, D]`` (raw embeddings) in the clustering space; ``domain``: the
    raw embeddings of the set's windows (``centre="set"``)."""
    x = np.asarray(x, dtype=np.float64)
    domain = centring(x, opts, domain)
    if opts.backend:
        return scoring.space(x, domain)
    if domain is not None:
        return l2_rows(x - domain.mean(axis=0))
    return l2_rows(x)


def cluster_recording(
    x: np.ndarray, scoring: Scoring, opts: DiarOptions, domain: np.ndarray | None = None
) -> np.ndarray:
    """Steps 1-3: labels ``[N]`` of the windows whose raw embeddings are the rows of ``x``
    (in time order); ``domain``: the set's windows (``centre="set"``)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.all(np.isfinite(x)):
        raise ValueError("window embeddings contain NaN or infinite values")
    y = embedding_space(x, scoring, opts, domain)
    if opts.method == "spectral" and not opts.backend:
        labels = spectral_labels(y, num_speakers=opts.num_speakers, max_speakers=opts.max_speakers)
    elif opts.method == "spectral":
        labels = spectral_labels(y, num_speakers=opts.num_speakers, min_speakers=2, max_speakers=opts.max_speakers)
        if not opts.num_speakers and scoring.calibration is not None:
            labels = merge_same_speakers(
                x, labels, scoring, domain if opts.centre == "set" else None, threshold=opts.threshold
            )
    elif opts.method == "gmm":
        sim = y @ y.T
        if opts.num_speakers or opts.threshold is not None:
            labels = ahc_labels(
                sim,
                0.0 if opts.threshold is None else opts.threshold,
                num_speakers=opts.num_speakers,
                max_speakers=opts.max_speakers,
            )
        else:
            post = POSTERIOR if opts.posterior is None else opts.posterior
            labels = count_labels(sim, posterior=post, max_speakers=opts.max_speakers)
    else:
        space = scoring if opts.backend else Scoring(calibration=scoring.calibration, decision=scoring.decision)
        scores = space.score_models(x, y, centring(x, opts, domain))
        llr = space.llr(scores)
        if llr is not None:
            scores = llr  # clustered on the LLRs; one [N, N] array kept, not two (an hour: 4,800 windows)
        elif not opts.num_speakers and opts.threshold is None:
            raise ValueError(
                "clustering 'ahc' stops at the calibrated LLR threshold, but the model has no calibration "
                "(scoring.yaml): give the number of speakers or a threshold, or use 'spectral'"
            )
        labels = ahc_labels(
            scores,
            space.decision.threshold if opts.threshold is None else opts.threshold,
            num_speakers=opts.num_speakers,
            max_speakers=opts.max_speakers,
        )
    if opts.num_speakers and opts.resegment is not False:
        labels = resegment(y, labels, keep=True)
    elif opts.resegment or (opts.resegment is None and len(x) >= RESEGMENT_FROM):
        labels = resegment(y, labels)
    return labels


def merge_same_speakers(
    x: np.ndarray,
    labels: np.ndarray,
    scoring: Scoring,
    domain: np.ndarray | None = None,
    threshold: float | None = None,
) -> np.ndarray:
    """Clusters merged, most alike first, while the calibrated LLR between their speaker models
    (the mean of their windows, scored as the model's scoring scores two recordings: its backend,
    training-mean centring, or the set's windows ``domain``, and AS-norm, *not* centred on this
    recording, whose own mean would be the one speaker of a one-speaker recording) is above the
    scoring's threshold (or ``threshold``)."""
    stop = scoring.decision.threshold if threshold is None else threshold
    lab = np.asarray(labels, dtype=np.int64).copy()
    while True:
        ks = np.unique(lab)
        if len(ks) < 2:
            return lab
        models = scoring.enrol([x[lab == k] for k in ks], domain)
        llr = scoring.llr(scoring.score_models(models, models, domain))
        np.fill_diagonal(llr, -np.inf)
        i, j = np.unravel_index(int(np.argmax(llr)), llr.shape)
        if llr[i, j] <= stop:
            return lab
        lab[lab == ks[j]] = ks[i]


def diarize_recording(
    windows: Sequence[Window],
    x: np.ndarray,
    regions: Sequence[tuple[float, float]],
    scoring: Scoring,
    opts: DiarOptions,
    domain: np.ndarray | None = None,
) -> list[Turn]:
    """Turns of one recording from its windows (time order), their raw embeddings (rows of
    ``x``) and its speech regions; ``domain``: the set's windows (``centre="set"``).  A forced
    count that the windows do not give is a warning naming the recording (see the module doc)."""
    if len(windows) != len(x):
        raise ValueError(f"{len(windows)} windows but {len(x)} embeddings")
    if not windows:
        return []
    order = sorted(range(len(windows)), key=lambda i: (windows[i].start, windows[i].end))
    ws = [windows[i] for i in order]
    labels = cluster_recording(np.asarray(x)[order], scoring, opts, domain)
    found = len(set(labels.tolist()))
    if opts.num_speakers and found != opts.num_speakers:
        why = (
            f"it has {len(ws)} windows of at most {max(w.end - w.start for w in ws):.2f} s, one speaker each at most"
            if opts.num_speakers > len(ws)
            else "the clustering gave fewer"
        )
        log.warning("%s: %d speakers asked, %d found: %s", ws[0].recording, opts.num_speakers, found, why)
    return windows_to_turns(ws, labels.tolist(), regions)


@dataclass(frozen=True)
class Windowed:
    """One recording ready to cluster: its speech ``regions``, the ``windows`` over them (time
    order) and their raw embeddings ``x`` ``[len(windows), D]``."""

    recording: str
    regions: Regions
    windows: list[Window]
    x: np.ndarray


def embed_windows(
    wave: np.ndarray,
    sample_rate: int,
    recording: str,
    embed: EmbedFn,
    *,
    speech: str | Sequence[tuple[float, float]] = DEFAULT_DETECTOR,
    settings: Settings | None = None,
    on_speech: Progress | None = None,
    on_windows: Callable[[int, int], None] | None = None,
    chunk: int = EMBED_CHUNK,
) -> Windowed:
    """A waveform's speech regions (a detector of :mod:`spkflow.diar.speech`, or given regions,
    cut to the waveform), the windows of ``settings`` over them, embedded by ``embed``
    ``chunk`` windows at a time.  ``on_speech(seconds)``: the detector's progress;
    ``on_windows(done, total)``: called once the windows are planned (``done`` 0) and after each
    chunk, so a progress bar moves at least every ``chunk`` windows."""
    settings = settings or Settings()
    duration = len(wave) / sample_rate
    if isinstance(speech, str):
        regions = detect_speech(speech, wave, sample_rate, duration=duration, progress=on_speech)
    else:
        regions = intersect(list(speech), [(0.0, duration)])
    ws = plan_windows(recording, regions, settings.window, settings.shift, settings.min_window)
    if on_windows is not None:
        on_windows(0, len(ws))
    if not ws:
        return Windowed(recording, regions, [], np.zeros((0, 0)))
    parts, step = [], max(1, chunk)
    for i in range(0, len(ws), step):
        crops = [wave[int(round(w.start * sample_rate)) : int(round(w.end * sample_rate))] for w in ws[i : i + step]]
        parts.append(np.asarray(embed(crops, sample_rate), dtype=np.float64))
        if on_windows is not None:
            on_windows(min(len(ws), i + step), len(ws))
    return Windowed(recording, regions, ws, np.concatenate(parts))
