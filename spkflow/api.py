"""The Python API: a trained spkflow embedder as an object, for use from other code and recipes.

>>> from spkflow import Embedder                                  # doctest: +SKIP
>>> emb = Embedder.from_pretrained("exp/spk_train")              # or a packed .zip; device="cuda"
>>> emb.embed_file("utt.flac").shape                              # (emb.dim,)
>>> emb.embed(wave, 8000)                                         # any rate: resampled as stage 5 does
>>> emb.embed_batch([w1, w2], [16000, 44100])                     # [2, dim], input order
>>> emb.embed_files(["a.m4a", "b.mp3", "c.wav"])                  # [3, dim], batched as stage 5
>>> emb.score_matrix(["a.m4a", "b.mp3", "c.wav"]).llr             # [3, 3] (or give [N, dim] embeddings)
>>> v = emb.verify("a.flac", "b.wav")                            # v.score, v.llr, v.same_speaker
>>> emb.score(emb_a, emb_b)                                       # the same on embeddings ([D] or [N, D])
>>> d = emb.diarize("meeting.flac")                              # d.speakers, d.turns, d.to_rttm("m.rttm")
>>> emb.diarize("meeting.flac", gallery="team.npz").speakers      # named by a saved enrolment (identify --save)
>>> Embedder.from_pretrained("spkrec-ecapa-voxceleb")             # SpeechBrain, ESPnet, WeSpeaker: detected
>>> Embedder.from_pretrained("resnet34.onnx", toolkit="wespeaker")  # or named
>>> Embedder.from_pretrained(os.path.dirname(resemblyzer.__file__))  # Resemblyzer's pretrained.pt

What it guarantees
------------------
* **Stage 5's numbers.**  The same code path as ``scripts/spk/extract_embeddings.sh``: audio
  read and converted to mono float like :mod:`spkflow.data.audio` (channel 0, int PCM / 2^15),
  resampled with :func:`spkflow.data.resample.resample`, Kaldi fbank, energy VAD and mean
  normalisation with the options recorded in the model's ``config.yaml`` (never defaults of
  this module), and the model of the extraction (:class:`~spkflow.embed.native.SpkflowEmbedder`,
  padding-invariant batches).  ``test/test_api.py`` checks, on audio at 8, 16 and 22.05 kHz
  and on the corpora: bit-identical vectors to stage 5 at batch size 1 when torch runs one
  thread (as stage 5's jobs do), and within 1e-5 (relative to the vector's norm, and after L2
  normalisation) of batched stage 5 with any thread count; padded batches and other thread
  counts only change the order of float sums (measured <= 1e-6 after L2 normalisation).
* **Any model stage 5 takes, opened as stage 5 opens it** (:func:`spkflow.embed.open_embedder`):
  a model dir, a packed file (verified by checksum, unpacked once into a cache) or an ONNX export
  (onnxruntime and numpy only, no torch), CPU or CUDA; an ESPnet speaker model dir, a SpeechBrain
  pretrained folder, a WeSpeaker ONNX model or Resemblyzer's ``.pt`` (``toolkit=``, or detected
  from the files) through
  the same adapter as ``extract_embeddings.sh``: waveforms resampled to the model's rate, batches
  equal to single-utterance inference (docs/toolkits.md).
* **Bad input is named**: a missing or corrupted model file, a waveform with NaN, several
  channels in a 2-D array other than ``[T, C]``, or audio shorter than one frame raise an
  error saying which.
* **Every format, one reader**: files (``embed_file``, ``embed_files``, ``verify``,
  ``score_matrix``, ``diarize``) are read by :func:`spkflow.data.audio.read_audio`, so m4a / aac /
  wma / webm (the pinned ffmpeg, with make_data_dir's pipe arguments) work as in a data dir.
* **A path is a path**: ``embed_file("cmd |")`` looks for a file of that name and runs nothing;
  Kaldi's ``cmd |`` and ``file.ark:offset`` are honoured only in a data dir's ``wav.scp``
  (``read_audio(entry, table=True)`` then :meth:`Embedder.embed`, for a caller who means it).
* **No decision on too little speech**: ``verify`` and ``score_matrix`` refuse a recording with
  fewer than ``min_speech`` seconds of voiced speech (:mod:`spkflow.features.speech`), naming it.
* **A lone pair** is centred on the mean of the recordings the calibration was fitted on
  (``domain="pair"``, the default), never on itself: a ``domain`` of fewer than
  :data:`~spkflow.score.model_scoring.MIN_DOMAIN` recordings is refused.
* ``import spkflow`` stays free of torch: this module imports numpy only, torch is imported
  when a model is loaded.
* **Verification as the recipe scored.**  :meth:`Embedder.verify` and :meth:`Embedder.score`
  apply the model's own scoring (:mod:`spkflow.score.model_scoring`: stage 6's backend, centring
  and AS-norm cohort, and the score calibration, from ``scoring.yaml`` / ``scoring.npz`` of the
  model dir or pack): ``score`` is the plain cosine, ``norm_score`` stage 6's score (equal to
  its ``scores`` file within 1e-5, ``test/test_api.py``), ``llr`` the calibrated
  log-likelihood ratio, ``same_speaker`` the decision at the stated prior.  A model without a
  scoring (an older pack, a stage-4 dir, an ONNX file) gives plain cosine and ``llr = None``,
  and says so in :attr:`Embedder.scoring_note`.

Anchors: ESPnet's ``Speech2Embedding`` (``espnet2/bin/spk_inference.py``; ``from_pretrained``
takes a model-zoo tag or files) embeds one waveform per call, at the model's rate (no rate
argument, no resampling, no file reader, no batch call, no VAD).  SpeechBrain's
``EncoderClassifier.encode_batch(wavs, wav_lens)`` takes a padded batch with relative lengths at
the model's rate (its ``load_audio`` resamples files).  Here every call takes the rate, and
files, arrays and batches all give the recipe's extraction result.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from spkflow.core.errors import UtteranceError
from spkflow.data.audio import read_audio, to_mono_float
from spkflow.data.resample import resample
from spkflow.deploy.decisions import Recordings
from spkflow.embed.base import default_max_frames
from spkflow.embed.open import inspect_model, open_embedder
from spkflow.features.fbank import wave_frontend
from spkflow.features.speech import MIN_SPEECH, speech_seconds
from spkflow.score.model_scoring import MIN_DOMAIN, PAIR, Scoring, Verdict

if TYPE_CHECKING:
    from spkflow.diar.result import Diarization

log = logging.getLogger(__name__)

__all__ = ["Embedder"]


class Embedder:
    """A speaker embedder with its frontend.  Build it with :meth:`from_pretrained`.

    Attributes: ``toolkit`` (:data:`spkflow.embed.TOOLKITS`), ``dim`` (embedding size),
    ``sample_rate`` (the rate the model's inputs are computed at; other rates are resampled),
    ``device``, ``config`` (spkflow, ESPnet: the model's ``config.yaml``), ``model`` (spkflow:
    the torch module ``model(feats [B, T, F], lengths [B]) -> [B, dim]`` on frontend output; ESPnet:
    its ``ESPnetSpeakerModel``; SpeechBrain: its ``embedding_model``; an ``.onnx`` file: the
    onnxruntime session), ``source`` (the path it was loaded from), ``meta`` (a pack's
    ``meta.yaml``, or None), ``scoring`` (the model's :class:`~spkflow.score.model_scoring.Scoring`;
    plain cosine for another toolkit's model) and ``scoring_note`` (what it is, in words).
    """

    def __init__(
        self, backend: Any, source: Path, meta: dict[str, Any] | None = None, scoring: Scoring | None = None
    ) -> None:
        self._backend = backend
        self.source = source
        self.meta = meta
        self.toolkit: str = getattr(backend, "name", "spkflow")
        self.scoring = scoring if scoring is not None else Scoring()
        self.scoring_note = (
            f"{source}: {self.scoring.describe()}"
            if scoring is not None
            else f"{source} holds no scoring (scoring.yaml): plain cosine scores, no LLRs or same-speaker decisions"
        )
        self.config: dict[str, Any] = backend.config
        self.model = backend.model
        self.device: str = backend.device
        self.dim = int(backend.dim)
        self.sample_rate = int(backend.sample_rate)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        device: str = "cpu",
        toolkit: str | None = None,
        *,
        trim_silences: bool | None = None,
    ) -> Embedder:
        """Load a model onto ``device`` (``cpu``, ``cuda``, ``cuda:N``): a stage-4 model dir
        (``config.yaml`` + ``model.pth``), a packed model file (``python -m spkflow.bin.pack``) or
        an exported ``.onnx`` file (``python -m spkflow.bin.export``; run by onnxruntime, without
        torch); or another toolkit's model (``toolkit``: ``espnet``, ``speechbrain``,
        ``wespeaker``, ``resemblyzer``; None: told from the files).  ``trim_silences``: Resemblyzer
        only, False to skip its webrtcvad trimming (default: trimmed, as its ``preprocess_wav``).
        Opened by :func:`spkflow.embed.open_embedder`."""
        info = inspect_model(path, toolkit)  # the toolkit, a pack unpacked; refusals named
        backend = open_embedder(info, info.toolkit, device, trim_silences=trim_silences)
        return cls(backend, info.path, info.meta, info.scoring())

    # ------------------------------------------------------------------ frontend
    def features(self, wave: Any, sample_rate: int) -> np.ndarray:
        """What the model sees for one utterance: for spkflow models ``[T, F]`` float32 after
        resampling, fbank, VAD and mean normalisation (the input of :attr:`model` and of an
        exported ONNX model); for other toolkits their stage-5 input (ESPnet, SpeechBrain: the
        waveform at :attr:`sample_rate`; WeSpeaker: its fbank)."""

        b = self._backend
        x = _mono(wave)
        sr = _rate(sample_rate)
        x = resample(x, sr, self.sample_rate)
        if self.toolkit != "spkflow":
            return b.prepare_wave(x)
        return wave_frontend(x, self.sample_rate, b.fbank, b.vad, use_vad=b.use_vad, mean_norm=b.mean_norm)

    # ------------------------------------------------------------------ embeddings
    def embed(self, wave: Any, sample_rate: int) -> np.ndarray:
        """Embedding ``[dim]`` (float32, not normalised) of a mono waveform (float in [-1, 1]
        or integer PCM; ``[T]`` or ``[T, channels]``, channel 0 used) at ``sample_rate``."""
        return self.embed_batch([wave], [sample_rate])[0]

    def embed_file(self, path: str | os.PathLike[str]) -> np.ndarray:
        """Embedding ``[dim]`` of an audio file (any format ``make_data_dir`` takes: libsndfile's,
        and m4a / aac / wma / webm through the pinned ffmpeg).  ``path`` is a file name, never a
        ``cmd |`` or ``file.ark:offset`` (those: ``read_audio(entry, table=True)``, then :meth:`embed`)."""

        spec = os.fspath(path)
        wave, rate = read_audio(spec, utt=spec)
        try:
            return self.embed(wave, rate)
        except ValueError as exc:
            raise UtteranceError(spec, spec, str(exc)) from None

    def embed_files(self, paths: Sequence[str | os.PathLike[str]], *, batch_size: int = 32) -> np.ndarray:
        """Embeddings ``[N, dim]`` of audio files (as :meth:`embed_file`), in input order: read
        in chunks and embedded in batches of similar length (:meth:`embed_batch`, stage 5's
        batching); an unreadable file raises, named."""
        return self._embed_files(paths, batch_size=batch_size)[0]

    def _embed_files(
        self, paths: Sequence[str | os.PathLike[str]], *, batch_size: int = 32
    ) -> tuple[np.ndarray, dict[str, float]]:
        names = [os.fspath(p) for p in paths]
        rec = Recordings()
        emb, _ = rec.embed(self, names, progress=False, batch_size=batch_size)
        out = np.stack([emb[n] for n in names]) if names else np.zeros((0, self.dim), dtype=np.float32)
        return out, rec.speech

    def score_matrix(
        self,
        items: Sequence[str | os.PathLike[str]] | np.ndarray,
        *,
        domain: Any = "auto",
        min_speech: float = MIN_SPEECH,
        calibration: str = "auto",
    ) -> Verdict:
        """Every pair of a list: audio files or raw embeddings ``[N, dim]``; a :class:`Verdict`
        of ``[N, N]`` arrays (symmetric; the diagonal scores each recording with itself).
        ``calibration``: as ``verify --calibration`` (:meth:`Scoring.on_batch` on the list's
        pairs: the list's own calibration, without labels, where it is large enough and the
        model's evidently does not fit it; ``"model"``: always the model's).
        ``domain``: ``"auto"`` centres on the list itself when it holds at least
        :data:`~spkflow.score.model_scoring.MIN_DOMAIN` recordings (as ``verify --pairs`` does a
        batch), else the calibration set's mean (as :meth:`score`); or embeddings ``[M, dim]`` to
        centre on, ``"pair"``, or None (the training mean).
        Files of fewer than ``min_speech`` seconds of voiced speech are refused, as in :meth:`verify`."""
        if isinstance(items, np.ndarray):
            e = np.atleast_2d(np.asarray(items, dtype=np.float64))
        else:
            e, speech = self._embed_files(list(items))
            for name, sec in speech.items():
                _check_speech(name, sec, min_speech)
        n = len(e)
        if n == 0:
            raise ValueError("score_matrix needs at least one recording")
        if isinstance(domain, str):
            if domain != "auto":
                raise ValueError(f"domain must be 'auto', None or embeddings [M, {self.dim}], got {domain!r}")
            domain = e if (n >= MIN_DOMAIN and self.scoring.centres) else PAIR
        ia, ib = np.triu_indices(n)
        v = self.score(e[ia], e[ib], domain=domain)
        scoring, batch = self.scoring.on_batch(v.norm_score[ia != ib], n, calibration)
        if batch is not None and batch.used:
            log.info("score_matrix: %s", batch.reason)
            v = scoring.verdict(v.score, v.norm_score)

        def full(x: Any) -> Any:
            if x is None:
                return None
            m = np.zeros((n, n), dtype=np.asarray(x).dtype)
            m[ia, ib] = x
            m[ib, ia] = x
            return m

        return Verdict(full(v.score), full(v.norm_score), full(v.llr), full(v.same_speaker), v.threshold)

    def embed_batch(
        self,
        waves: Sequence[Any],
        sample_rates: int | Sequence[int],
        *,
        batch_size: int = 32,
        max_frames: int | None = None,
    ) -> np.ndarray:
        """Embeddings ``[N, dim]`` of ``N`` waveforms, in input order.  ``sample_rates``: one
        rate for all or one per waveform.  Run in batches of similar length, at most
        ``batch_size`` utterances and ``max_frames`` padded 10 ms frames each (default: as stage 5,
        :func:`spkflow.embed.base.default_max_frames`); each gets the embedding it gets alone."""
        n = len(waves)
        rates = [sample_rates] * n if isinstance(sample_rates, (int, np.integer)) else list(sample_rates)
        if len(rates) != n:
            raise ValueError(f"{n} waveforms but {len(rates)} sample rates")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        bound = max_frames or default_max_frames(self._backend, self.device)
        feats = []
        for i, (w, r) in enumerate(zip(waves, rates, strict=True)):
            try:
                feats.append(self.features(w, r))
            except ValueError as exc:
                raise ValueError(f"waveform {i}: {exc}") from None
        b = self._backend
        out = np.zeros((n, self.dim), dtype=np.float32)
        for group in _groups([b.frames(x) for x in feats], batch_size, bound):
            out[group] = b.embed([feats[i] for i in group])
        return out

    # ------------------------------------------------------------------ verification
    def verify(
        self, a: Any, b: Any, *, sample_rate: int | None = None, domain: Any = PAIR, min_speech: float = MIN_SPEECH
    ) -> Verdict:
        """Same speaker or not: ``a`` and ``b`` audio files (paths, as :meth:`embed_file`) or waveforms
        at ``sample_rate``.  Returns a :class:`~spkflow.score.model_scoring.Verdict` with ``score``
        (plain cosine), ``norm_score``, ``llr`` and ``same_speaker`` (see :meth:`score`).  A
        recording of fewer than ``min_speech`` seconds of voiced speech (the energy VAD,
        :mod:`spkflow.features.speech`) is refused with :class:`UtteranceError` naming it (0: off)."""
        ea, eb = (self._embed_one(x, sample_rate, min_speech) for x in (a, b))
        return self.score(ea, eb, domain=domain)

    def score(self, emb_a: Any, emb_b: Any, *, domain: Any = PAIR) -> Verdict:
        """The model's scoring of embeddings: one pair (``[dim]`` each: floats) or row by row
        (``[N, dim]`` each: arrays).  ``domain``: embeddings ``[M, dim]`` of unlabelled recordings
        like these to centre on (``python -m spkflow.bin.verify`` takes the recordings its pairs
        name, when there are 10 or more); default (``"pair"``): the mean of the recordings the
        calibration was fitted on (the training mean for a scoring without one); None: the
        training mean (stage 6's default)."""
        a, b = np.asarray(emb_a), np.asarray(emb_b)
        if a.shape[-1:] != (self.dim,) or b.shape[-1:] != (self.dim,):
            raise ValueError(f"embeddings must be [{self.dim}] or [N, {self.dim}], got {a.shape} and {b.shape}")
        if (
            domain is not None
            and not isinstance(domain, str)
            and self.scoring.centres
            and len(np.atleast_2d(np.asarray(domain))) < MIN_DOMAIN
        ):
            # two recordings centred on their own mean become opposite vectors: any pair scores as two speakers
            raise ValueError(
                f"domain of {len(np.atleast_2d(np.asarray(domain)))} recordings: centring needs at least {MIN_DOMAIN} "
                "(fewer are pushed apart by their own mean); leave domain=None for the model's own centring"
            )
        return self.scoring.score(a, b, domain=domain)

    def _embed_one(self, x: Any, sample_rate: int | None, min_speech: float = 0.0) -> np.ndarray:
        if isinstance(x, (str, os.PathLike)):
            name = os.fspath(x)
            wave, rate = read_audio(name, utt=name)
        elif sample_rate is None:
            raise ValueError("a waveform needs its sample_rate (verify(wave_a, wave_b, sample_rate=16000))")
        else:
            name, wave, rate = "<waveform>", x, sample_rate
        if min_speech > 0:
            _check_speech(name, speech_seconds(_mono(wave), _rate(rate)), min_speech)
        try:
            return self.embed(wave, rate)
        except ValueError as exc:
            raise UtteranceError(name, name, str(exc)) from None

    def __repr__(self) -> str:
        model = self.config.get("model") if self.toolkit == "spkflow" else None
        name = model.get("name") if isinstance(model, dict) else type(self.model).__name__
        return (
            f"Embedder({self.source}, toolkit={self.toolkit}, model={name}, dim={self.dim}, "
            f"sample_rate={self.sample_rate}, device={self.device})"
        )

    # ------------------------------------------------------------------ diarization
    def diarize(
        self,
        path: str | os.PathLike[str],
        *,
        speech: str | Sequence[tuple[float, float]] | None = None,
        num_speakers: int | None = None,
        max_speakers: int = 8,
        method: str | None = None,
        window: float = 1.5,
        shift: float = 0.75,
        domain: Any = None,
        threshold: float | None = None,
        gallery: Any = None,
        progress: bool = False,
    ) -> Diarization:
        """Who spoke when in one audio file (a path, as :meth:`embed_file`): a
        :class:`spkflow.diar.result.Diarization` (its ``turns``, ``Turn(recording, start, end,
        speaker)`` on 10 ms frames; ``speakers``;
        ``to_rttm(path)``; ``to_annotation()``, a ``pyannote.core.Annotation``; iterating over it
        gives the turns), the recording id being the file's stem (whitespace made ``_``).
        ``speech``: a detector (``silero``, ``energy``; None: the default,
        :data:`spkflow.diar.speech.DEFAULT_DETECTOR`), the speech regions ``[(start, end), ...]``
        in seconds (oracle speech), or an RTTM file or folder of them; windows of ``window`` s
        every ``shift`` s embedded by this model, clustered in its scoring's space (``method``:
        ``ahc`` stopped at the calibrated LLR, the default when the model has a calibration; else
        ``gmm``: stopped where a two-component fit of the recording's own window-pair scores puts
        the change of speaker, no calibration needed; or ``spectral``), resegmented when the count
        is forced or the file long (600 windows).  ``domain``: recordings like this one to centre
        on (raw embeddings ``[M, dim]``, or a data dir, an embedding scp or a gallery saved by ``identify
        --save``), as the recipe centres on the windows of its set; None: the file's own windows when
        they are :data:`~spkflow.diar.pipeline.CENTRE_FROM` or more, else the training mean, which
        merges speakers of corpora unlike the training data's (egs/speechocean762/diar1/RESULTS.md).
        ``threshold``: where ``ahc`` stops (an LLR; a score without calibration), tuned on
        held-out recordings; None: the calibrated decision.  ``num_speakers`` forces the count (a
        warning when the windows cannot give it); ``max_speakers`` bounds an estimated one.
        ``gallery``: a saved enrolment (``identify --save``: its file, or a
        :class:`~spkflow.deploy.gallery.Gallery`) to name the speakers by: each the enrolled
        speaker the calibrated LLR says it is, two never one name, ``unknown_<k>`` otherwise
        (:mod:`spkflow.diar.naming`).  ``progress``: bars on standard error for a long file.  The
        work and the defaults are :func:`spkflow.diar.file_list.diarize_file`'s (the command's,
        the recipe's code)."""
        from spkflow.diar.file_list import diarize_file
        from spkflow.diar.pipeline import Settings
        from spkflow.diar.speech import DEFAULT_DETECTOR

        settings = Settings(method, num_speakers, max_speakers, threshold, window, shift)  # its field order
        return diarize_file(
            self,
            path,
            speech=DEFAULT_DETECTOR if speech is None else speech,
            settings=settings,
            domain=domain,
            gallery=gallery,
            progress=progress,
        )


def _groups(frames: Sequence[int], batch_size: int, max_frames: int) -> list[list[int]]:
    """Indices grouped longest first: at most ``batch_size`` per group and ``len(group) *
    frames(longest) <= max_frames`` unless a single item is longer."""
    order = sorted(range(len(frames)), key=lambda i: (-frames[i], i))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) >= batch_size or (len(cur) + 1) * frames[cur[0]] > max_frames):
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def _check_speech(name: str, seconds: float, min_speech: float) -> None:
    if seconds < min_speech:
        raise UtteranceError(
            name,
            name,
            f"too little speech: {seconds:.2f} s voiced (energy VAD), fewer than {min_speech:g} s: no decision "
            "(min_speech=0 scores it anyway)",
        )


def _mono(wave: Any) -> np.ndarray:

    if hasattr(wave, "detach"):  # a torch tensor
        wave = wave.detach().cpu().numpy()
    x = np.asarray(wave)
    if x.ndim not in (1, 2) or x.size == 0 or x.dtype.kind not in "fiu":
        raise ValueError(f"expected a non-empty waveform [T] or [T, channels] of numbers, got {x.dtype} {x.shape}")
    if x.dtype.kind == "u":
        raise ValueError(f"unsigned {x.dtype} samples are ambiguous: give float in [-1, 1] or signed PCM")
    try:
        return to_mono_float(x, "<waveform>", "<array>")
    except UtteranceError as exc:
        raise ValueError(exc.message) from None


def _rate(sample_rate: Any) -> int:
    if isinstance(sample_rate, bool) or not float(sample_rate).is_integer() or int(sample_rate) <= 0:
        raise ValueError(f"sample_rate must be a positive whole number of Hz, got {sample_rate!r}")
    return int(sample_rate)
