"""Audio made here and the Kaldi data dirs that list it: synthetic voices, speakers, mixed rates;
the fbank option changes the fbank implementations are compared on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

#: Kaldi fbank options away from the defaults, one change each (``dataclasses.replace(FbankOptions(),
#: **change)``): the options every fbank implementation of ours is compared on.
FBANK_CHANGES = [
    dict(snip_edges=False),
    dict(num_mel_bins=40, low_freq=60.0, high_freq=-400.0),
    dict(window_type="hamming", preemphasis_coefficient=0.0, remove_dc_offset=False),
    dict(window_type="hanning", frame_length=20.0, frame_shift=8.0),
    dict(window_type="blackman", round_to_power_of_two=False, frame_length=25.0),
    dict(use_energy=True, energy_floor=1.0),
    dict(use_energy=True, raw_energy=False, htk_compat=True),
    dict(use_power=False),
    dict(sample_frequency=8000.0, num_mel_bins=23),
]


def synth_voice(
    rng: np.random.Generator,
    f0: float,
    formants: tuple[float, ...],
    seconds: float,
    sample_rate: int = 16000,
    silence: float = 0.2,
) -> np.ndarray:
    """A crude voiced signal: a glottal-like pulse train at ``f0`` shaped by resonances,
    with random amplitude syllables and leading/trailing silence (so VAD has work to do).
    Float32 in [-1, 1]."""
    n = int(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    jitter = 1.0 + 0.02 * np.sin(2 * np.pi * rng.uniform(2, 5) * t)
    phase = 2 * np.pi * np.cumsum(f0 * jitter) / sample_rate
    src = np.zeros(n)
    for h in range(1, 25):
        if h * f0 >= sample_rate / 2:
            break
        gain = sum(1.0 / (1.0 + ((h * f0 - fm) / 120.0) ** 2) for fm in formants)
        src += gain / h * np.sin(h * phase)
    env = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(2.5, 4.5) * t + rng.uniform(0, 2 * np.pi))
    sig = src * env
    sig += 0.003 * rng.standard_normal(n)
    pad = int(silence * sample_rate)
    sig = np.concatenate([0.001 * rng.standard_normal(pad), sig, 0.001 * rng.standard_normal(pad)])
    sig = 0.5 * sig / (np.abs(sig).max() + 1e-9)
    return sig.astype(np.float32)


def write_data_dir(data: Path, wav: dict[str, str], utt2spk: dict[str, str]) -> Path:
    """wav.scp, utt2spk and spk2utt for ``utt -> wav.scp entry`` / ``utt -> speaker``, all
    LC_ALL=C sorted.  Returns ``data``."""
    data.mkdir(parents=True, exist_ok=True)
    utts = sorted(wav, key=str.encode)
    (data / "wav.scp").write_text("".join(f"{u} {wav[u]}\n" for u in utts))
    (data / "utt2spk").write_text("".join(f"{u} {utt2spk[u]}\n" for u in utts))
    spk2utt: dict[str, list[str]] = {}
    for u in utts:
        spk2utt.setdefault(utt2spk[u], []).append(u)
    (data / "spk2utt").write_text(
        "".join(f"{s} {' '.join(v)}\n" for s, v in sorted(spk2utt.items(), key=lambda kv: kv[0].encode()))
    )
    return data


def write_data_dir_by_prefix(data: Path, entries: dict[str, str]) -> Path:
    """wav.scp / utt2spk / spk2utt for ``utt -> wav.scp entry`` (speaker = id prefix)."""
    return write_data_dir(data, entries, {u: u.split("-")[0] for u in entries})


def make_speakers(
    root: Path,
    num_spk: int = 4,
    num_utt: int = 3,
    sample_rate: int = 16000,
    fmt: str = "wav",
    seed: int = 0,
    min_sec: float = 0.6,
    max_sec: float = 1.6,
) -> Path:
    """Write ``num_spk`` x ``num_utt`` synthetic utterances and a sorted Kaldi data dir.

    Audio goes to ``root/audio/<spk>/<utt>.<fmt>``, the data dir to ``root/data``
    (wav.scp, utt2spk, spk2utt, all LC_ALL=C sorted, utterance ids prefixed by speaker).
    Returns the data dir.
    """
    rng = np.random.default_rng(seed)
    wav, u2s = {}, {}
    for s in range(num_spk):
        spk = f"spk{s:03d}"
        f0 = 90 + 25 * s + rng.uniform(-5, 5)
        formants = tuple(rng.uniform(300, 3000, size=3))
        (root / "audio" / spk).mkdir(parents=True, exist_ok=True)
        for u in range(num_utt):
            utt = f"{spk}-utt{u:02d}"
            sig = synth_voice(rng, f0, formants, rng.uniform(min_sec, max_sec), sample_rate)
            path = root / "audio" / spk / f"{utt}.{fmt}"
            sf.write(path, sig, sample_rate, subtype="PCM_16")
            wav[utt], u2s[utt] = str(path), spk
    return write_data_dir(root / "data", wav, u2s)


def make_mixed_data(root: Path, num_spk: int = 3, num_utt: int = 4, seed: int = 1) -> Path:
    """Speakers recorded at 8, 16 and 22.05 kHz (wav and flac), 0.3-3.5 s long: held-out audio
    of mixed rates and lengths.  Returns a sorted data dir."""
    rng = np.random.default_rng(seed)
    rates = [8000, 16000, 22050]
    wav, u2s = {}, {}
    for s in range(num_spk):
        spk = f"s{s}"
        f0 = 100 + 35 * s
        formants = tuple(rng.uniform(300, 3000, size=3))
        for u in range(num_utt):
            utt = f"{spk}-u{u}"
            rate = rates[(s + u) % len(rates)]
            fmt = "flac" if u % 2 else "wav"
            sig = synth_voice(rng, f0, formants, float(rng.uniform(0.3, 3.5)), rate, silence=0.1)
            path = root / "audio" / f"{utt}.{fmt}"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, sig, rate, subtype="PCM_16")
            wav[utt], u2s[utt] = str(path), spk
    return write_data_dir(root / "data", wav, u2s)


def decaying_rirs(out: Path, count: int = 2, rate: int = 16000) -> Path:
    """``count`` rooms for the benches' reverberation, ``out/rir<i>.flac`` listed in ``out/wav.scp``:
    decaying noise impulses of 800 samples, which stand in for simulated rooms (pyroomacoustics is
    slow, and not on a GPU machine)."""
    out.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        h = np.exp(-np.arange(800) / 100.0) * np.random.default_rng(i).standard_normal(800)
        sf.write(out / f"rir{i}.flac", (0.5 * h / np.abs(h).max()).astype(np.float32), rate)
    (out / "wav.scp").write_text("".join(f"rir{i} {out / f'rir{i}.flac'}\n" for i in range(count)))
    return out
