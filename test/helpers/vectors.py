"""Embeddings made here: speakers as points with noise (and a shared nuisance direction), written
as real kaldiio arks, and every pair of them as a trials list."""

from __future__ import annotations

from pathlib import Path

import kaldiio
import numpy as np


def write_vectors(path_base: Path, vectors: dict[str, np.ndarray]) -> Path:
    """Write a real kaldiio ark + scp of float32 vectors; returns the scp."""
    path_base.parent.mkdir(parents=True, exist_ok=True)
    spec = f"ark,scp:{path_base}.ark,{path_base}.scp"
    with kaldiio.WriteHelper(spec) as w:
        for k in sorted(vectors):
            w(k, np.asarray(vectors[k], dtype=np.float32))
    return Path(f"{path_base}.scp")


def speaker_set(
    seed: int,
    num_spk: int,
    num_utt: int,
    dim: int = 24,
    noise: float = 0.25,
    nuisance: float = 0.0,
    prefix: str = "spk",
) -> dict[str, np.ndarray]:
    """Utterance embeddings = speaker centre + noise (+ a random amount of one shared
    nuisance direction, which inflates cosine scores the way channel effects do)."""
    rng = np.random.default_rng(seed)
    nuis = np.random.default_rng(1234).normal(size=dim)
    nuis /= np.linalg.norm(nuis)
    out = {}
    for s in range(num_spk):
        centre = rng.normal(size=dim) / np.sqrt(dim)
        for u in range(num_utt):
            out[f"{prefix}{s:03d}-u{u:02d}"] = (
                centre + noise * rng.normal(size=dim) / np.sqrt(dim) + nuisance * abs(rng.normal()) * nuis
            )
    return out


def all_trials(keys: list[str], path: Path | None = None) -> list[str]:
    lines = []
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            lines.append(f"{a} {b} {'target' if a.split('-')[0] == b.split('-')[0] else 'nontarget'}\n")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(lines))
    return lines
