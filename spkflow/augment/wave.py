"""Waveform augmentation of training crops: speed, reverberation, noise / music / babble, band, gain.

What it guarantees
------------------
* The ``augment:`` section of a training config is checked here (:func:`normalize_augment_config`):
  an unknown key, a probability outside [0, 1], an SNR or gain range with low > high, a
  probability > 0 without a source, or a noise kind without an SNR range is a
  :class:`~spkflow.core.checks.ConfigError` naming the file and the dotted key.  Defaults are filled in,
  so the ``config.yaml`` written beside a model records exactly what was applied.
* Every random choice (whether an augmentation fires, which source, which segment of it, the
  SNR, the gain) is drawn from the ``numpy.random.Generator`` passed in: the loader gives each
  crop a generator seeded by (seed, epoch, batch, crop index), so an augmented batch is a pure
  function of the files and those numbers, with any number of workers and after a resume.
* Sources are Kaldi data dirs (``wav.scp``, optional ``segments``, ``utt2spk``, ``utt2dur``), read
  with :class:`spkflow.data.audio.AudioReader`, so MUSAN / RIRS_NOISES data dirs plug in as they are.
  A segment of a plain audio file is read by seeking (a 2 s piece of a 3-minute MUSAN track costs
  2 s of decoding); whole decoded sources are kept in a per-process cache of bounded size.
* Reverberation keeps the direct-path alignment: the crop is convolved (FFT) with the RIR
  normalised to unit energy, the output is taken from the RIR's direct-path peak on (Kaldi's
  ``wav-reverberate --shift-output``), with the length of the input, and rescaled to the input's
  power (ESPnet and Kaldi keep the power; WeSpeaker rescales to the peak).
* Additive sources are scaled to the drawn SNR against the power of the crop they are added to;
  babble is the sum of several utterances of *other* speakers (the target's speaker, known from the
  sources' ``utt2spk``, is excluded), each at unit power before the sum.
* Order (as Kaldi's ``reverberate_data_dir.py`` and ESPnet's preprocessor): reverberation, then
  additive noise, then band-limiting (a channel), then gain; each with its own probability, or,
  with ``reverb_noise: exclusive``, reverberation *or* noise from one draw (WeSpeaker's rule:
  with probability 0.6 one of the two).  The kind of an additive source is drawn uniformly over
  the kinds (ESPnet) or, with ``noise.kind_draw: files``, in proportion to their files
  (WeSpeaker draws one file from all of MUSAN).
  Speed perturbation changes the crop length and the speaker identity, so the loader applies it
  (:mod:`spkflow.train.raw_loader`): one factor per speaker of a batch, perturbed speakers are new voices.
* What was applied is countable: :class:`WaveAugment` adds one to ``counts[op]`` for each operation
  it applies to a crop (``noise.<kind>`` besides ``noise``); the loader returns a batch's counts,
  the trainer writes their per-epoch sum to ``train.log`` (:func:`format_counts`).

Design reasoning, measurements and the comparison with WeSpeaker / ESPnet / SpeechBrain:
``docs/augmentation.md``.
"""

from __future__ import annotations

import collections
import copy
import functools
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.core.checks import ConfigError, check_choice, check_factors, check_keys, check_range, check_value
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.audio import AudioReader, FileSpan
from spkflow.data.resample import resample
from spkflow.data.tables import read_kv

__all__ = [
    "AUGMENT_DEFAULTS",
    "DEFAULT_SNR",
    "AUDIO_CACHE",
    "AudioBank",
    "DecodedAudioCache",
    "WaveAugment",
    "add_at_snr",
    "band_limit",
    "format_counts",
    "normalize_augment_config",
    "reverberate",
    "speed_perturb",
]

#: the ``augment:`` section with its defaults (everything off)
AUGMENT_DEFAULTS: dict[str, Any] = {
    "speed": {
        "factors": None,  # e.g. [0.9, 1.0, 1.1]: one factor per speaker of a batch (new voices)
        "perturb": True,  # false: the classes stay speaker x factor, every crop at factor 1.0 (WeSpeaker's
        # large-margin fine-tuning keeps the base model's classifier and feeds unperturbed audio)
    },
    "reverb": {"prob": 0.0, "data_dir": None},  # RIR data dir (wav.scp)
    # independent: reverb and noise each with its own probability (ESPnet, Kaldi) | exclusive: one
    # draw gives reverb (reverb.prob), noise (noise.prob) or neither, never both (WeSpeaker: 0.3 + 0.3)
    "reverb_noise": "independent",
    "noise": {
        "prob": 0.0,  # probability that a crop gets one additive source
        "kind_draw": "uniform",  # uniform: a kind uniformly, then a file of it (ESPnet) | files: a file
        # uniformly among all kinds' files, kinds in proportion to their sizes (WeSpeaker's one MUSAN pool)
        "data_dirs": {},  # kind -> data dir, e.g. {noise: data/musan_noise, music: ..., babble: data/train}
        "snr": {},  # kind -> [low, high] dB (defaults in DEFAULT_SNR)
        "num_sources": {},  # kind -> [low, high] utterances summed (default [3, 7] for babble/speech, else [1, 1])
    },
    "band": {"prob": 0.0, "mode": "telephone"},  # telephone: to 8 kHz and back | bandpass: 300-3400 Hz
    "gain": {"prob": 0.0, "db": [-6.0, 6.0]},  # level change, clipped to [-1, 1] like a recording
}
#: SNR ranges (dB) for well-known kinds (WeSpeaker / ESPnet MUSAN settings)
DEFAULT_SNR: dict[str, list[float]] = {"noise": [0.0, 15.0], "music": [5.0, 15.0], "babble": [13.0, 20.0]}
_BABBLE_KINDS = ("babble", "speech")
BAND_MODES = ("telephone", "bandpass")


def _config_error(source: str, key: str, message: str) -> Exception:

    return ConfigError(f"{source}: augment.{key}: {message}")


def _data_dir(value: Any, key: str, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise _config_error(source, key, f"must be a data dir path, got {value!r}")
    return value


def normalize_augment_config(cfg: Mapping[str, Any] | None, source: str = "config") -> dict[str, Any]:
    """Check the ``augment:`` section and fill its defaults (see :data:`AUGMENT_DEFAULTS`)."""

    def prob(key: str, value: Any) -> float:
        check_value(source, f"augment.{key}", value, "number", 0.0, 1.0)
        return float(value)

    cfg = {} if cfg is None else cfg
    check_keys("augment", cfg, AUGMENT_DEFAULTS, source)
    out = copy.deepcopy(AUGMENT_DEFAULTS)
    for name, defaults in AUGMENT_DEFAULTS.items():
        given = cfg.get(name)
        if given is None:
            continue
        if not isinstance(defaults, dict):
            out[name] = given
            continue
        check_keys(f"augment.{name}", given, defaults, source)
        out[name].update(copy.deepcopy(dict(given)))
    sp = out["speed"]
    sp["factors"] = check_factors(source, "augment.speed.factors", sp["factors"])
    check_value(source, "augment.speed.perturb", sp["perturb"], "bool")
    if not sp["perturb"] and (not sp["factors"] or 1.0 not in sp["factors"]):
        raise _config_error(
            source, "speed.perturb", "false keeps the classes of speed.factors and feeds factor 1.0: list 1.0 there"
        )
    check_choice(source, "augment.reverb_noise", out["reverb_noise"], ("independent", "exclusive"))
    rv = out["reverb"]
    rv["prob"] = prob("reverb.prob", rv["prob"])
    if rv["data_dir"] is not None:
        rv["data_dir"] = _data_dir(rv["data_dir"], "reverb.data_dir", source)
    elif rv["prob"] > 0:
        raise _config_error(source, "reverb.data_dir", "reverb.prob > 0 needs an RIR data dir")
    nz = out["noise"]
    nz["prob"] = prob("noise.prob", nz["prob"])
    check_choice(source, "augment.noise.kind_draw", nz["kind_draw"], ("uniform", "files"))
    if out["reverb_noise"] == "exclusive" and rv["prob"] + nz["prob"] > 1.0:
        raise _config_error(
            source, "reverb_noise", f"exclusive needs reverb.prob + noise.prob <= 1, got {rv['prob']} + {nz['prob']}"
        )
    for sub in ("data_dirs", "snr", "num_sources"):
        if not isinstance(nz[sub], Mapping):
            raise _config_error(source, f"noise.{sub}", f"must be a mapping kind -> value, got {nz[sub]!r}")
        nz[sub] = dict(nz[sub])
    for kind, d in nz["data_dirs"].items():
        nz["data_dirs"][kind] = _data_dir(d, f"noise.data_dirs.{kind}", source)
    for sub in ("snr", "num_sources"):
        extra = sorted(set(nz[sub]) - set(nz["data_dirs"]))
        if extra:
            raise _config_error(source, f"noise.{sub}.{extra[0]}", f"kind has no entry in noise.data_dirs ({source})")
    for kind in nz["data_dirs"]:
        if kind not in nz["snr"]:
            default = DEFAULT_SNR.get("babble" if kind in _BABBLE_KINDS else kind)
            if default is None:
                raise _config_error(source, f"noise.snr.{kind}", "no default SNR range for this kind: give [low, high]")
            nz["snr"][kind] = list(default)
        nz["snr"][kind] = check_range(source, f"augment.noise.snr.{kind}", nz["snr"][kind])
        num = nz["num_sources"].get(kind, [3, 7] if kind in _BABBLE_KINDS else [1, 1])
        nz["num_sources"][kind] = check_range(source, f"augment.noise.num_sources.{kind}", num, 1, integer=True)
    if nz["prob"] > 0 and not nz["data_dirs"]:
        raise _config_error(source, "noise.data_dirs", "noise.prob > 0 needs at least one source data dir")
    bd = out["band"]
    bd["prob"] = prob("band.prob", bd["prob"])
    check_choice(source, "augment.band.mode", bd["mode"], BAND_MODES)
    gn = out["gain"]
    gn["prob"] = prob("gain.prob", gn["prob"])
    gn["db"] = check_range(source, "augment.gain.db", gn["db"])
    return out


def augment_enabled(cfg: Mapping[str, Any]) -> bool:
    """True when a normalised ``augment`` section changes anything."""
    return bool(
        cfg["speed"]["factors"]
        or cfg["reverb"]["prob"] > 0
        or cfg["noise"]["prob"] > 0
        or cfg["band"]["prob"] > 0
        or cfg["gain"]["prob"] > 0
    )


# --------------------------------------------------------------------------- operations


def _power(x: np.ndarray) -> float:
    return float(np.mean(np.square(x, dtype=np.float64))) if len(x) else 0.0


def speed_perturb(x: np.ndarray, factor: float) -> np.ndarray:
    """Kaldi's ``sox speed factor``: the signal played ``factor`` times faster (length / factor,
    every frequency x factor), by band-limited resampling (:func:`spkflow.data.resample.resample`) of
    ``x`` read as if sampled at ``factor`` times its rate; the factor is taken to 1/100."""
    if factor == 1.0:
        return x
    return resample(x, int(round(factor * 100)), 100)


def reverberate(x: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """``x`` convolved with ``rir`` (FFT), aligned on the RIR's direct path (its largest
    absolute sample), same length and power as ``x``."""
    from scipy.signal import fftconvolve

    h = np.asarray(rir, dtype=np.float64)
    energy = float(np.dot(h, h))
    if len(x) == 0 or energy <= 0.0:
        return x
    h = h / math.sqrt(energy)
    d = int(np.argmax(np.abs(h)))
    y = fftconvolve(np.asarray(x, dtype=np.float64), h)[d : d + len(x)]
    px, py = _power(x), _power(y)
    if py > 0.0:
        y *= math.sqrt(px / py)
    return y.astype(np.float32)


def add_at_snr(x: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """``x + a * noise`` with ``a`` such that power(x) / power(a * noise) is ``snr_db`` dB.
    ``noise`` has the length of ``x``; silent noise or a silent ``x`` leaves ``x`` unchanged."""
    px, pn = _power(x), _power(noise)
    if px <= 0.0 or pn <= 0.0:
        return x
    a = math.sqrt(px / (pn * 10.0 ** (snr_db / 10.0)))
    return (x + a * noise).astype(np.float32)


@functools.lru_cache(maxsize=8)
def _bandpass_sos(sample_rate: int) -> np.ndarray:
    from scipy.signal import butter

    return butter(4, [300.0, min(3400.0, 0.45 * sample_rate)], btype="bandpass", fs=sample_rate, output="sos")


def band_limit(x: np.ndarray, sample_rate: int, mode: str = "telephone") -> np.ndarray:
    """A telephone channel: ``telephone`` resamples to 8 kHz and back (nothing above 4 kHz);
    ``bandpass`` keeps 300-3400 Hz (4th-order Butterworth, forward-backward: no phase shift)."""
    if mode == "telephone":
        if sample_rate <= 8000:
            return x

        y = resample(resample(x, sample_rate, 8000), 8000, sample_rate)
        return (
            np.ascontiguousarray(y[: len(x)], dtype=np.float32) if len(y) >= len(x) else np.pad(y, (0, len(x) - len(y)))
        )
    if mode == "bandpass":
        from scipy.signal import sosfiltfilt

        if len(x) < 64:
            return x
        return sosfiltfilt(_bandpass_sos(int(sample_rate)), x).astype(np.float32)
    raise ValueError(f"band mode must be one of {BAND_MODES}, got {mode!r}")


# --------------------------------------------------------------------------- sources


class DecodedAudioCache:
    """Decoded audio kept in memory per process, least recently used first out, bounded by
    ``max_mb``; keyed by (wav.scp entry, rate), so every reader of the same recordings (the
    crops' own utterances and babble from the same training set) shares one copy.  16-bit audio
    is kept as int16 (exact: the float samples are k / 32768), anything else as float32."""

    def __init__(self, max_mb: float) -> None:
        self.max_bytes = int(max_mb * 2**20)
        self._items: collections.OrderedDict[tuple[str, int], np.ndarray] = collections.OrderedDict()
        self._bytes = 0
        self.hits = self.misses = 0

    def room(self) -> int:
        """Bytes that can still be kept before :meth:`read` drops anything."""
        return self.max_bytes - self._bytes

    def has_room_for(self, frames: int) -> bool:
        """Whether a file of ``frames`` samples, decoded (float32 at most), can be kept without
        dropping anything: the rule by which a reader decodes a file whole or reads its pieces."""
        return self.room() >= 4 * frames

    def get(self, reader: Any, utt: str) -> np.ndarray | None:
        """What :meth:`read` gives when ``utt`` is in memory (a hit), else None (nothing read)."""
        key = (reader.source(utt), int(reader.sample_rate or 0))
        got = self._items.get(key)
        if got is None:
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return got.astype(np.float32) * np.float32(1 / 32768) if got.dtype == np.int16 else got

    def read(self, reader: Any, utt: str) -> np.ndarray:
        """``reader.read(utt)`` (an :class:`spkflow.data.audio.AudioReader`), from memory when it is
        there, else decoded and kept (the least recently used dropped to make room)."""
        got = self.get(reader, utt)
        if got is not None:
            return got
        self.misses += 1
        key = (reader.source(utt), int(reader.sample_rate or 0))
        x = reader.read(utt)
        if x.size * 2 > self.max_bytes:  # cannot be kept even as int16 (the cache off): no quantising
            return x
        q = np.round(x * 32768.0)
        store = q.astype(np.int16) if np.abs(q).max(initial=0) < 32768 and np.array_equal(q / 32768.0, x) else x
        if store.nbytes <= self.max_bytes:
            self._items[key] = store
            self._bytes += store.nbytes
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes
        return x


#: the per-process cache (forked DataLoader workers each fill their own); 512 MiB holds the
#: speechocean762 demo's training audio (1.7 h as int16: 190 MiB) with room for the sources
AUDIO_CACHE = DecodedAudioCache(float(os.environ.get("SPKFLOW_AUDIO_CACHE_MB", "512")))


class AudioBank:
    """The recordings of a Kaldi data dir as augmentation sources (see the module docstring).

    :meth:`segment` returns ``n`` samples of a randomly drawn utterance at a random offset (an
    utterance shorter than ``n`` is repeated); :meth:`whole` a whole utterance (RIRs).  Picklable.
    A file more than 8 times longer than the piece asked for (MUSAN) is read by seeking; shorter
    ones are decoded whole once and kept in :data:`AUDIO_CACHE`, or, when the cache has no room to
    keep them (a full cache, or none), read by seeking too, with the draw and the samples the whole
    file would have given (an exact format at the bank's rate): whether a file was in memory
    never changes a piece.
    """

    def __init__(self, data_dir: str | os.PathLike[str], sample_rate: int) -> None:

        self.data_dir = str(data_dir)
        self.sample_rate = int(sample_rate)
        self.reader = AudioReader(data_dir, sample_rate=self.sample_rate)
        self.keys = self.reader.keys()
        if not self.keys:
            raise InputError(Path(data_dir) / "wav.scp", None, "no recordings: an augmentation source needs some")
        spk_path = Path(data_dir) / "utt2spk"
        u2s = read_kv(spk_path) if spk_path.is_file() else {}
        self.speaker = [u2s.get(k) for k in self.keys]
        self._by_speaker: dict[str, np.ndarray] = {}
        if u2s:
            groups: dict[str | None, list[int]] = collections.defaultdict(list)
            for i, s in enumerate(self.speaker):
                groups[s].append(i)
            self._by_speaker = {s: np.asarray(v) for s, v in groups.items() if s is not None}
        self._plain = not self.reader.has_segments
        self._info: dict[str, FileSpan] = {}  # key -> where a plain file's samples lie

    def __len__(self) -> int:
        return len(self.keys)

    def pick(self, rng: np.random.Generator, exclude_speaker: str | None = None) -> int:
        """Index of a random utterance, not of ``exclude_speaker`` when the bank knows speakers
        (and has others)."""
        if exclude_speaker is not None and exclude_speaker in self._by_speaker and len(self._by_speaker) > 1:
            own = self._by_speaker[exclude_speaker]
            i = int(rng.integers(len(self.keys) - len(own)))
            # the i-th index that is not the speaker's own (own is sorted)
            return i + int(np.searchsorted(own - np.arange(len(own)), i, side="right"))
        return int(rng.integers(len(self.keys)))

    def whole(self, i: int) -> np.ndarray:
        """Utterance ``i`` in full (through :data:`AUDIO_CACHE`)."""
        return AUDIO_CACHE.read(self.reader, self.keys[i])

    def _file_info(self, key: str) -> FileSpan | None:
        if not self._plain:
            return None
        got = self._info.get(key)
        if got is None:
            try:
                got = self.reader.file_span(key)
            except UtteranceError:  # read whole, where the reader names what is wrong
                return None
            if got is None:
                return None
            self._info[key] = got
        return got

    def _piece_only(self, info: FileSpan, n: int) -> bool:
        """Whether a piece of ``n`` samples of a file not in memory is read alone: the file holds
        its samples exactly at the bank's rate (:attr:`FileSpan.exact`), at least ``n`` of them,
        and the cache has no room to keep it whole (:meth:`DecodedAudioCache.has_room_for`)."""
        return (
            info.exact
            and info.rate == self.sample_rate
            and info.frames >= n
            and not AUDIO_CACHE.has_room_for(info.frames)
        )

    def segment(self, rng: np.random.Generator, n: int, exclude_speaker: str | None = None) -> np.ndarray:
        """``n`` samples (float32, at the bank's rate) of a random utterance at a random offset."""
        i = self.pick(rng, exclude_speaker)
        key = self.keys[i]
        info = self._file_info(key)
        if info is not None and info.frames > 8 * int(math.ceil(n * info.rate / self.sample_rate)):
            # a long file: read just the piece (with a margin for the resampling filter)
            need = int(math.ceil(n * info.rate / self.sample_rate)) + 64
            start = int(rng.integers(0, info.frames - need + 1))
            x = resample(self.reader.read_span(key, info, start, start + need), info.rate, self.sample_rate)[:n]
            if len(x) == n:
                return x
        got = AUDIO_CACHE.get(self.reader, key)
        if got is None and info is not None and self._piece_only(info, n):
            # not in memory and not to be kept there: only the piece is read, at the offset drawn
            # as from the whole file (the same draw, the same samples: an exact format at the rate)
            start = int(rng.integers(0, info.frames - n + 1))
            return self.reader.read_span(key, info, start, start + n)
        x = got if got is not None else self.whole(i)
        if len(x) >= n:
            start = int(rng.integers(0, len(x) - n + 1))
            return x[start : start + n]
        reps = -(-n // max(len(x), 1))
        start = int(rng.integers(0, len(x)))
        return np.tile(x, reps + 1)[start : start + n]


# --------------------------------------------------------------------------- the pipeline


class WaveAugment:
    """Reverberation, additive sources, band-limiting and gain of one crop (see the module doc).

    ``cfg`` is a normalised ``augment`` section; relative data dirs are resolved against
    ``base_dir`` (the recipe directory, where the trainer runs).  Sources are opened here (the
    file lists; audio is read on demand), so a missing data dir fails before training starts.
    """

    def __init__(self, cfg: Mapping[str, Any], sample_rate: int, base_dir: str | os.PathLike[str] = ".") -> None:
        self.cfg = copy.deepcopy(dict(cfg))
        self.sample_rate = int(sample_rate)

        def bank(d: str) -> AudioBank:
            return AudioBank(d if os.path.isabs(d) else os.path.join(base_dir, d), self.sample_rate)

        rv, nz = self.cfg["reverb"], self.cfg["noise"]
        self.rirs = bank(rv["data_dir"]) if rv["data_dir"] and rv["prob"] > 0 else None
        self.kinds = sorted(nz["data_dirs"]) if nz["prob"] > 0 else []
        self.noise = {k: bank(nz["data_dirs"][k]) for k in self.kinds}

    @property
    def speed_factors(self) -> list[float] | None:
        """The speed classes: a classification loss counts speaker x factor."""
        return self.cfg["speed"]["factors"]

    @property
    def speed_perturb(self) -> bool:
        """Whether crops are perturbed (false: every crop at factor 1.0, in its class)."""
        return bool(self.cfg["speed"]["perturb"])

    def _kind(self, rng: np.random.Generator) -> str:
        """The additive source's kind: uniform over kinds, or in proportion to their files."""
        if self.cfg["noise"]["kind_draw"] == "files":
            sizes = np.array([len(self.noise[k]) for k in self.kinds], dtype=np.float64)
            return self.kinds[int(rng.choice(len(self.kinds), p=sizes / sizes.sum()))]
        return self.kinds[int(rng.integers(len(self.kinds)))]

    def __call__(
        self,
        x: np.ndarray,
        rng: np.random.Generator,
        speaker: str | None = None,
        counts: collections.Counter[str] | None = None,
    ) -> np.ndarray:
        """The augmented crop (a new float32 array of the same length; ``x`` is not changed).
        ``speaker``: the crop's speaker, kept out of babble.  ``counts``: one is added for each
        operation applied (``reverb``, ``noise`` and ``noise.<kind>``, ``band``, ``gain``)."""
        c = self.cfg
        done: list[str] = []
        y = np.asarray(x, dtype=np.float32)
        # one child stream per stage: turning a stage on or off (an ablation) leaves the draws of
        # the others as they were
        r_rev, r_noise, r_band, r_gain = rng.spawn(4)
        p_rev = c["reverb"]["prob"] if self.rirs is not None else 0.0
        u = r_rev.random()
        if u < p_rev:
            y = reverberate(y, self.rirs.whole(self.rirs.pick(r_rev)))
            done.append("reverb")
        if c["reverb_noise"] == "exclusive":  # the same draw: reverb, noise or neither
            noisy = bool(self.kinds) and p_rev <= u < p_rev + c["noise"]["prob"]
        else:
            noisy = bool(self.kinds) and r_noise.random() < c["noise"]["prob"]
        if noisy:
            kind = self._kind(r_noise)
            lo, hi = c["noise"]["num_sources"][kind]
            count = int(r_noise.integers(lo, hi + 1))
            src = self.noise[kind]
            mix = np.zeros(len(y), dtype=np.float64)
            for _ in range(count):
                s = src.segment(r_noise, len(y), exclude_speaker=speaker).astype(np.float64)
                p = _power(s)
                if p > 0.0:
                    mix += s / math.sqrt(p)
            y = add_at_snr(y, mix, r_noise.uniform(*c["noise"]["snr"][kind]))
            done += ["noise", f"noise.{kind}"]
        if r_band.random() < c["band"]["prob"]:
            y = band_limit(y, self.sample_rate, c["band"]["mode"])
            done.append("band")
        if r_gain.random() < c["gain"]["prob"]:
            db = r_gain.uniform(*c["gain"]["db"])
            y = np.clip(y * np.float32(10.0 ** (db / 20.0)), -1.0, 1.0)
            done.append("gain")
        if counts is not None:
            counts.update(done)
        return y if y is not x else y.copy()


_COUNT_ORDER = ("speed", "reverb", "noise", "band", "gain")


def format_counts(counts: Mapping[str, int], crops: int) -> str:
    """One log line's worth: ``"<crops> crops: speed 3, reverb 12, noise 9 (babble 4, music 5), band 0,
    gain 0"`` (every operation named, zeros included, so a reader sees what was switched on)."""
    parts = []
    for op in _COUNT_ORDER:
        kinds = sorted(k for k in counts if k.startswith(op + "."))
        detail = ", ".join(f"{k[len(op) + 1 :]} {int(counts[k])}" for k in kinds)
        parts.append(f"{op} {int(counts.get(op, 0))}" + (f" ({detail})" if detail else ""))
    return f"{crops} crops: " + ", ".join(parts)
