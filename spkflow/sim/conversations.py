"""Simulated conversations: single-speaker utterances laid out in time with the turn-taking of real
meetings, after Landini et al. 2022 ("From simulated mixtures to simulated conversations as
training data for end-to-end neural diarization").

Turn-taking statistics (:func:`turn_statistics`, from reference RTTMs of real meetings, each
speaker's turns joined where they overlap): turn by turn in start order, the speaker whose turn
ends last holds the floor; a turn starting after the floor's end is a pause (same speaker or
another), one starting before it by another speaker an overlap (a turn inside the floor holder's
own is neither).  Measured: the probability that the next turn is the same speaker's, the
probability that a change of speaker overlaps, and histograms (quantile bins) of the two pauses
(up to their 95th percentile: a meeting's long silences would otherwise set the pace), the
overlap and the turn length.  They are
stored as JSON (:func:`save_statistics`), not the RTTMs they came from.

A conversation (:func:`simulate_conversation`): ``K`` speakers drawn from the pool; turn after
turn the next speaker is the same with the measured probability (else another, uniformly); each
turn is a piece of one utterance of that speaker (utterances drawn without replacement until the
speaker's run out, then again): consecutive speech regions of it from a random one on, as long as
a turn length drawn from the measured histogram (read speech has no turns of its own: a whole
LibriSpeech utterance would make every turn 6-20 s long); it starts after a pause drawn from the
same-speaker or the other-speaker histogram, or, at a change of speaker with the measured overlap
probability, that much *before* the previous turn ends (at most half of the previous turn, so that
turns do not swallow each other), and never before the same speaker's previous turn ends.  Each
speaker gets a gain drawn in +-``gain_db``; the mix is scaled to a peak of 0.9.
The reference turns are the utterance's own speech regions (energy VAD, gaps under 0.5 s filled),
so that silence inside and around an utterance is not counted as speech.

What it guarantees: the same pool, statistics, speaker count, length and seed give the same audio
and RTTM, bit for bit (one ``numpy.random.Generator`` per conversation, seeded by ``(seed,
index)``); no turn of a reference lies outside its recording.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spkflow.core.atomic import write_text_atomic
from spkflow.diar.regions import union
from spkflow.diar.rttm import Turn
from spkflow.diar.speech import energy_speech

__all__ = [
    "Conversation",
    "Histogram",
    "TurnStatistics",
    "load_statistics",
    "save_statistics",
    "simulate_conversation",
    "simulate_set",
    "turn_statistics",
]


@dataclass(frozen=True)
class Histogram:
    """Quantile-binned histogram: ``edges`` (``B + 1``), ``probs`` (``B``, summing to 1)."""

    edges: tuple[float, ...]
    probs: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float], bins: int = 20) -> Histogram:
        v = np.asarray(values, dtype=np.float64)
        if len(v) == 0:
            return cls((0.0, 0.0), (1.0,))
        edges = np.unique(np.quantile(v, np.linspace(0, 1, bins + 1)))
        if len(edges) < 2:
            return cls((float(edges[0]), float(edges[0])), (1.0,))
        counts, _ = np.histogram(v, edges)
        return cls(tuple(round(float(e), 4) for e in edges), tuple(float(c) / counts.sum() for c in counts))

    def sample(self, rng: np.random.Generator) -> float:
        i = rng.choice(len(self.probs), p=np.asarray(self.probs) / sum(self.probs))
        return float(rng.uniform(self.edges[i], self.edges[i + 1]))

    def mean(self) -> float:
        return float(sum(p * 0.5 * (a + b) for p, a, b in zip(self.probs, self.edges, self.edges[1:], strict=False)))


@dataclass(frozen=True)
class TurnStatistics:
    """See the module doc; ``source`` says which RTTMs they were measured on."""

    same_speaker: float
    overlap: float
    pause_same: Histogram
    pause_other: Histogram
    overlap_length: Histogram
    turn_length: Histogram
    source: str = ""


#: pauses above this quantile (a meeting's long silences: up to two minutes in AMI) are left out
PAUSE_QUANTILE = 0.95


def _below(values: list[float], q: float) -> list[float]:
    if not values:
        return values
    top = float(np.quantile(values, q))
    return [v for v in values if v <= top]


def turn_statistics(
    turns_by_recording: Mapping[str, Sequence[Turn]], source: str = "", bins: int = 20
) -> TurnStatistics:
    """Measure :class:`TurnStatistics` on reference turns (each speaker's overlapping turns joined)."""
    same = other = overlapped = 0
    p_same: list[float] = []
    p_other: list[float] = []
    ovl: list[float] = []
    lengths: list[float] = []
    for turns in turns_by_recording.values():
        by_spk: dict[str, list[tuple[float, float]]] = {}
        for t in turns:
            by_spk.setdefault(t.speaker, []).append((t.start, t.end))
        merged = sorted((s, e, spk) for spk, v in by_spk.items() for s, e in union(v))
        lengths += [e - s for s, e, _ in merged]
        if not merged:
            continue
        floor_end, floor_spk = merged[0][1], merged[0][2]  # who holds the floor, until when
        for s, e, spk in merged[1:]:
            if s >= floor_end:
                if spk == floor_spk:
                    same += 1
                    p_same.append(s - floor_end)
                else:
                    other += 1
                    p_other.append(s - floor_end)
            elif spk != floor_spk:
                other += 1
                overlapped += 1
                ovl.append(min(floor_end, e) - s)
            if e > floor_end:
                floor_end, floor_spk = e, spk
    n = max(same + other, 1)
    return TurnStatistics(
        same / n,
        overlapped / max(other, 1),
        Histogram.of(_below(p_same, PAUSE_QUANTILE), bins),
        Histogram.of(_below(p_other, PAUSE_QUANTILE), bins),
        Histogram.of(ovl, bins),
        Histogram.of(lengths, bins),
        source,
    )


def save_statistics(path: str | os.PathLike[str], stats: TurnStatistics) -> None:
    def h(x: Histogram) -> dict[str, Any]:
        return {"edges": list(x.edges), "probs": list(x.probs)}

    doc = {
        "source": stats.source,
        "same_speaker": stats.same_speaker,
        "overlap": stats.overlap,
        "pause_same": h(stats.pause_same),
        "pause_other": h(stats.pause_other),
        "overlap_length": h(stats.overlap_length),
        "turn_length": h(stats.turn_length),
    }
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")


def load_statistics(path: str | os.PathLike[str]) -> TurnStatistics:
    from spkflow.core.errors import InputError

    try:
        doc = json.loads(open(path, encoding="utf-8").read())

        def h(k: str) -> Histogram:
            x = doc[k]
            if len(x["edges"]) != len(x["probs"]) + 1 or not x["probs"]:
                raise ValueError(f"{k}: {len(x['edges'])} edges for {len(x['probs'])} bins")
            return Histogram(tuple(map(float, x["edges"])), tuple(map(float, x["probs"])))

        return TurnStatistics(
            float(doc["same_speaker"]),
            float(doc["overlap"]),
            h("pause_same"),
            h("pause_other"),
            h("overlap_length"),
            h("turn_length"),
            str(doc.get("source", "")),
        )
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(path, None, f"not a turn-statistics file: {exc}") from None


def _turn_piece(w: np.ndarray, sample_rate: int, stats: TurnStatistics, rng: np.random.Generator) -> np.ndarray:
    """A turn cut from utterance ``w``: consecutive speech regions from a random one on, until
    they span a length drawn from the turn-length histogram (the whole utterance at most), with
    50 ms of context either side."""
    regions = energy_speech(w, sample_rate, min_gap=0.3, min_len=0.1)
    target = max(0.5, stats.turn_length.sample(rng))
    if len(regions) <= 1:
        return w
    i = int(rng.integers(len(regions)))
    j = i
    while j + 1 < len(regions) and regions[j][1] - regions[i][0] < target:
        j += 1
    a = max(0, int((regions[i][0] - 0.05) * sample_rate))
    b = min(len(w), int((regions[j][1] + 0.05) * sample_rate))
    return w[a:b]


@dataclass
class Conversation:
    """A simulated recording: ``wave`` (float32 at ``sample_rate``), ``turns`` (the reference),
    ``speakers`` and ``utterances`` used, in order."""

    wave: np.ndarray
    sample_rate: int
    turns: list[Turn]
    speakers: list[str]
    utterances: list[str]


def simulate_conversation(
    recording: str,
    pool: Mapping[str, Sequence[str]],
    load: Callable[[str], np.ndarray],
    stats: TurnStatistics,
    *,
    num_speakers: int,
    duration: float,
    seed: int,
    index: int = 0,
    sample_rate: int = 16000,
    gain_db: float = 3.0,
) -> Conversation:
    """One conversation of at least ``duration`` seconds (see the module doc).  ``pool``: speaker ->
    utterance ids; ``load(utt)``: its mono float waveform at ``sample_rate``."""
    speakers_all = sorted(pool)
    if num_speakers > len(speakers_all):
        raise ValueError(f"{num_speakers} speakers asked, the pool has {len(speakers_all)}")
    rng = np.random.default_rng([seed, index])
    speakers = [speakers_all[i] for i in rng.choice(len(speakers_all), num_speakers, replace=False)]
    gains = {s: 10 ** (rng.uniform(-gain_db, gain_db) / 20) for s in speakers}
    queues: dict[str, list[str]] = {s: [] for s in speakers}
    placed: list[tuple[int, np.ndarray, str, str]] = []  # (start sample, wave, speaker, utt)
    spk_end: dict[str, int] = {}
    spk = speakers[int(rng.integers(num_speakers))]
    prev_start = prev_end = 0
    t_end = 0
    first = True
    while t_end < duration * sample_rate:
        if not queues[spk]:
            queues[spk] = [pool[spk][i] for i in rng.permutation(len(pool[spk]))]
        utt = queues[spk].pop()
        w = _turn_piece(np.asarray(load(utt), dtype=np.float32), sample_rate, stats, rng) * gains[spk]
        if first:
            start = int(rng.uniform(0.0, 0.5) * sample_rate)
            first = False
        elif placed[-1][2] == spk:
            start = prev_end + int(max(0.0, stats.pause_same.sample(rng)) * sample_rate)
        elif rng.random() < stats.overlap:
            ov = int(stats.overlap_length.sample(rng) * sample_rate)
            start = max(prev_end - ov, prev_start + (prev_end - prev_start) // 2)
        else:
            start = prev_end + int(max(0.0, stats.pause_other.sample(rng)) * sample_rate)
        start = max(start, spk_end.get(spk, 0))  # a speaker never overlaps themself
        spk_end[spk] = start + len(w)
        placed.append((start, w, spk, utt))
        prev_start, prev_end = start, start + len(w)
        t_end = max(t_end, prev_end)
        if num_speakers > 1 and rng.random() >= stats.same_speaker:
            others = [s for s in speakers if s != spk]
            spk = others[int(rng.integers(len(others)))]
    total = t_end + int(rng.uniform(0.2, 0.5) * sample_rate)
    mix = np.zeros(total, dtype=np.float64)
    turns: list[Turn] = []
    for start, w, s, _ in placed:
        mix[start : start + len(w)] += w
        for a, b in energy_speech(w, sample_rate, min_gap=0.5, min_len=0.1):
            turns.append(Turn(recording, start / sample_rate + a, start / sample_rate + b, s))
    peak = float(np.abs(mix).max()) if total else 0.0
    if peak > 0:
        mix *= 0.9 / peak
    return Conversation(mix.astype(np.float32), sample_rate, turns, speakers, [u for _, _, _, u in placed])


def simulate_set(
    pool_dir: str | os.PathLike[str],
    stats: TurnStatistics,
    out_dir: str | os.PathLike[str],
    audio_dir: str | os.PathLike[str],
    *,
    num_recordings: int,
    min_speakers: int = 2,
    max_speakers: int = 6,
    duration: float = 60.0,
    seed: int = 0,
    prefix: str = "sim",
) -> dict[str, int]:
    """``num_recordings`` conversations from the speakers of the data dir ``pool_dir`` (``wav.scp``,
    ``utt2spk``), speaker counts cycling through ``min_speakers..max_speakers`` (bounded by the
    pool); FLAC audio into ``audio_dir``, the recording dir (``wav.scp``, ``rttm``, ``reco2dur``,
    ``uem``) into ``out_dir``.  Returns ``recording -> speakers``."""
    import soundfile as sf

    from spkflow.data.audio import AudioReader
    from spkflow.data.tables import read_kv
    from spkflow.diar.recordings import write_recordings

    reader = AudioReader(pool_dir, sample_rate=16000)
    pool: dict[str, list[str]] = {}
    for utt, spk in read_kv(os.path.join(pool_dir, "utt2spk")).items():
        pool.setdefault(spk, []).append(utt)
    hi = min(max_speakers, len(pool))
    if hi < min_speakers:
        raise ValueError(f"{pool_dir}: {len(pool)} speakers, fewer than --min-speakers {min_speakers}")
    os.makedirs(audio_dir, exist_ok=True)
    wav: dict[str, str] = {}
    durs: dict[str, float] = {}
    turns: list[Turn] = []
    counts: dict[str, int] = {}
    for i in range(num_recordings):
        k = min_speakers + i % (hi - min_speakers + 1)
        rec = f"{prefix}{i:03d}-{k}spk"
        conv = simulate_conversation(
            rec, pool, reader.read, stats, num_speakers=k, duration=duration, seed=seed, index=i
        )
        path = os.path.abspath(os.path.join(audio_dir, f"{rec}.flac"))
        tmp = path + ".tmp.flac"
        sf.write(tmp, conv.wave, conv.sample_rate, subtype="PCM_16")
        os.replace(tmp, path)
        wav[rec], durs[rec], counts[rec] = path, len(conv.wave) / conv.sample_rate, k
        turns += conv.turns
    write_recordings(out_dir, wav, durs, turns, {r: [(0.0, d)] for r, d in durs.items()})
    return counts
