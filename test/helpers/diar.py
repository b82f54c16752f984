"""Conversations made here for the diarization tests: synthetic voices laid out by the simulator,
written as a recording dir (wav.scp, rttm, reco2dur)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from helpers.audio import make_speakers
from spkflow.data.audio import load_audio
from spkflow.data.tables import read_kv
from spkflow.diar.recordings import write_recordings
from spkflow.sim.conversations import Histogram, TurnStatistics, simulate_conversation

#: simple turn-taking: changes of speaker half the time, a fifth of them overlapping
STATS = TurnStatistics(
    same_speaker=0.3,
    overlap=0.2,
    pause_same=Histogram((0.1, 0.4), (1.0,)),
    pause_other=Histogram((0.2, 0.8), (1.0,)),
    overlap_length=Histogram((0.1, 0.5), (1.0,)),
    turn_length=Histogram((1.0, 3.0), (1.0,)),
)


def make_conversations(
    root: Path,
    counts=(2, 3),
    duration: float = 20.0,
    seed: int = 0,
    stats: TurnStatistics = STATS,
    num_spk: int = 6,
) -> Path:
    """Recording dir ``root/recs`` of one simulated conversation per entry of ``counts`` (its
    speaker count), from ``num_spk`` synthetic speakers x 4 utterances of 1-2.5 s."""
    data = make_speakers(root / "pool", num_spk=num_spk, num_utt=4, seed=seed, min_sec=1.0, max_sec=2.5)
    wav = read_kv(data / "wav.scp")
    pool: dict[str, list[str]] = {}
    for u, s in read_kv(data / "utt2spk").items():
        pool.setdefault(s, []).append(u)
    recs, durs, turns = {}, {}, []
    for i, k in enumerate(counts):
        rec = f"conv{i}"
        c = simulate_conversation(
            rec, pool, lambda u: load_audio(wav[u], 16000), stats, num_speakers=k, duration=duration, seed=seed, index=i
        )
        path = root / f"{rec}.wav"
        sf.write(path, c.wave, 16000, subtype="PCM_16")
        recs[rec], durs[rec] = str(path), len(c.wave) / 16000
        turns += c.turns
    return write_recordings(root / "recs", recs, durs, turns)


def write_tone_speech(path: Path, seconds: float, silent: bool = False, seed: int = 0) -> Path:
    """One synthetic voice (or digital near-silence) of ``seconds`` at 16 kHz."""
    from helpers.audio import synth_voice

    rng = np.random.default_rng(seed)
    if silent:
        sig = np.zeros(int(seconds * 16000), dtype=np.float32)
    else:
        sig = synth_voice(rng, 120.0, (500.0, 1500.0, 2500.0), seconds, silence=0.05)
    sf.write(path, sig, 16000, subtype="PCM_16")
    return path


def embed_windows(model: Path, windows_dir: Path, scp: Path) -> None:
    """The windows of a ``windows/`` dir embedded by ``model`` in this process, written as
    ``scp`` (+ its ark): what stage 3 gives the clustering step."""
    import kaldiio

    from spkflow import Embedder
    from spkflow.data.audio import AudioReader

    emb = Embedder.from_pretrained(model)
    reader = AudioReader(windows_dir, sample_rate=16000)
    keys = list(read_kv(windows_dir / "utt2spk"))
    vecs = emb.embed_batch([reader.read(k) for k in keys], 16000)
    with kaldiio.WriteHelper(f"ark,scp:{scp.with_suffix('.ark')},{scp}") as w:
        for k, v in zip(keys, vecs, strict=True):
            w(k, v)
