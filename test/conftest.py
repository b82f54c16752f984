"""Shared fixtures: small real audio made on the fly, and the real corpora from db.sh.

Unit tests make their own audio (``make_speakers``) so they run anywhere.  Tests on the
shipped corpora ask ``corpus(NAME)``: the path comes from the recipe's ``db.sh``; when the
directory is missing the test is skipped, except under CI (``CI=true``) where it fails.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

# The real Slurm / Grid Engine fixtures, once per session for every test module (a module that
# imported them itself would start a second cluster beside the first).
from schedulers import sge_cluster, slurm_cluster  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "egs" / "TEMPLATE" / "spk1"


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


def perturb_batchnorm(model, seed: int) -> None:
    """Non-trivial BatchNorm running statistics, so that a padding leak would show."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.normal_(0.0, 0.5, generator=g)
                mod.running_var.uniform_(0.5, 2.0, generator=g)


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


@pytest.fixture
def speakers(tmp_path: Path) -> Path:
    """A small synthetic data dir: 4 speakers x 3 utterances, 16 kHz wav."""
    return make_speakers(tmp_path)


def db_var(name: str) -> str:
    """The value of ``name`` after sourcing the TEMPLATE recipe's db.sh."""
    out = subprocess.run(
        ["bash", "-c", f'. "{TEMPLATE}/db.sh"; printf %s "${name}"'], check=True, capture_output=True, text=True
    )
    return out.stdout


@pytest.fixture
def corpus():
    """``corpus("SPEECHOCEAN762")`` -> Path from db.sh; skip if absent (fail under CI=true)."""

    def get(name: str) -> Path:
        path = Path(db_var(name))
        if not path.is_dir():
            msg = f"corpus {name} not found at {path} (set {name} or see db.sh)"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(msg)
            pytest.skip(msg)
        return path

    return get
