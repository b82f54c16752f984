"""What stage 5 runs: the interface every model is run through, and batches planned by length.

:class:`Embedder` is what :func:`spkflow.embed.run.run_job` needs from a model: a picklable
per-utterance input maker run in DataLoader workers, a length in 10 ms frames and a batched
forward.  :class:`spkflow.embed.native.SpkflowEmbedder` runs a stage-4 model dir; the ESPnet
adapter is :class:`spkflow.embed.espnet.EspnetEmbedder`; :func:`spkflow.embed.load_embedder`
picks one.

What it guarantees
------------------
* **Batched = alone.**  A padded batch gives every utterance the embedding it gets alone
  (spkflow models take ``lengths`` and :mod:`spkflow.nnet.models` masks padding;
  ``test/test_embed*.py`` check mixed lengths within 1e-4).
* **Bounded batches.**  :func:`plan_batches` puts at most ``batch_size`` utterances and at most
  ``max_frames`` padded frames (batch size x longest utterance, 10 ms frames) in a batch,
  longest first, deterministically; :func:`split_by_frames` applies the bound again after
  loading, so one long utterance never multiplies memory.  The scripts' default bound is 3000
  frames on CPU, where bigger batches cost *more* CPU time (measured on speechocean762 with an
  ECAPA-512: 8000 frames +15 %, 60000 frames +30 %), and 60000 on GPU.
* **The model's identity.**  Every embedder carries :attr:`stamp` (toolkit and the SHA-256 of
  its config and weights, :func:`model_stamp`), recorded beside each job's embeddings so that
  the merge never mixes two models' vectors.
* **Precision.**  ``dtype`` float32 (default) or, through ``torch.autocast``, bfloat16 (CPU
  and CUDA) or float16 (CUDA only; a ValueError on CPU).  Vectors are returned float32 and
  the dtype is part of the stamp.  Batches are padded in DataLoader workers
  (:class:`PadCollate`) and copied with ``non_blocking`` from pinned memory on CUDA.
* **Bad model dirs** (no ``config.yaml``, no weights: :class:`ModelError`; an unreadable,
  truncated or code-holding weights file: :class:`spkflow.nnet.checkpoint.CheckpointError`) are
  refused naming the file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from spkflow.core.errors import InputError
from spkflow.data.jobs import file_sha256

__all__ = [
    "FRAME_RATE",
    "Embedder",
    "ModelError",
    "check_model_dir",
    "resolve_device",
    "model_stamp",
    "plan_batches",
    "split_by_frames",
    "pad",
    "PadCollate",
    "DTYPES",
    "autocast_dtype",
]

#: frames per second of the length bound (``max_frames``): 10 ms frames for every toolkit
FRAME_RATE = 100


class ModelError(InputError):
    """The model cannot be used (a missing, unreadable, truncated or code-holding file); re-running
    with the same model cannot help, so the stage script does not suggest resuming."""


#: ``--dtype`` choices: the precision the model runs in (outputs are always written float32)
DTYPES = ("float32", "bfloat16", "float16")


def model_stamp(
    toolkit: str, config: str | os.PathLike[str], weights: str | os.PathLike[str], dtype: str = "float32"
) -> str:
    """``toolkit=T <sha256 of config> <sha256 of weights>[ dtype=D]``: what the job dir's embeddings
    came from.  A reduced precision changes the numbers, so it is part of the stamp (a job dir is
    never half float32, half bfloat16); float32 adds nothing, so older stamps stay valid."""
    base = f"toolkit={toolkit} {file_sha256(config)} {file_sha256(weights)}"
    return base if dtype == "float32" else f"{base} dtype={dtype}"


def autocast_dtype(dtype: str, device: str) -> Any:
    """The torch dtype ``--dtype`` asks autocast for on ``device`` (None for float32).

    float16 is CUDA-only (CPU autocast to float16 is slow and unsupported by many kernels):
    a clear ValueError on CPU; bfloat16 runs on both."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "float32":
        return None
    if dtype == "float16" and not device.startswith("cuda"):
        raise ValueError("--dtype float16 needs --device cuda; on cpu use bfloat16 or float32")
    return getattr(torch, dtype)


# --------------------------------------------------------------------------- batches


def _frames(seconds: float) -> int:
    return max(1, int(math.ceil(seconds * FRAME_RATE)))


def plan_batches(
    utts: Sequence[str], durations: Mapping[str, float | None], batch_size: int, max_frames: int
) -> list[list[str]]:
    """Group utterances into batches by length, longest first.

    Every utterance appears in exactly one batch; a batch has at most ``batch_size`` utterances
    and ``len(batch) * frames(longest) <= max_frames`` unless it is a single utterance longer
    than the bound.  Utterances of unknown duration come last, ``batch_size`` at a time (the
    frame bound is applied to them after loading, by :func:`split_by_frames`).  Deterministic:
    ties are broken by key.
    """
    if batch_size < 1 or max_frames < 1:
        raise ValueError(f"batch_size and max_frames must be >= 1, got {batch_size}, {max_frames}")
    known = [u for u in utts if durations.get(u) is not None]
    unknown = [u for u in utts if durations.get(u) is None]
    known.sort(key=lambda u: (-float(durations[u]), u))  # type: ignore[arg-type]
    batches: list[list[str]] = []
    cur: list[str] = []
    cur_max = 0
    for u in known:
        f = _frames(float(durations[u]))  # type: ignore[arg-type]
        if cur and (len(cur) >= batch_size or (len(cur) + 1) * cur_max > max_frames):
            batches.append(cur)
            cur = []
        if not cur:
            cur_max = f
        cur.append(u)
    if cur:
        batches.append(cur)
    batches.extend(list(unknown[i : i + batch_size]) for i in range(0, len(unknown), batch_size))
    return batches


def split_by_frames(items: Sequence[Any], frames: Callable[[Any], int], max_frames: int) -> list[list[Any]]:
    """Split loaded items (longest first) so that ``len(part) * max(frames) <= max_frames``
    (a single longer item is a part of its own).  Order inside a part: longest first."""
    order = sorted(items, key=lambda it: -frames(it))
    parts: list[list[Any]] = []
    cur: list[Any] = []
    cur_max = 0
    for it in order:
        if cur and (len(cur) + 1) * cur_max > max_frames:
            parts.append(cur)
            cur = []
        if not cur:
            cur_max = frames(it)
        cur.append(it)
    if cur:
        parts.append(cur)
    return parts


# --------------------------------------------------------------------------- embedders


class Embedder(Protocol):
    """What :func:`spkflow.embed.run.run_job` needs from a model: a picklable per-utterance input maker that runs
    in DataLoader workers, a length in 10 ms frames, and a batched forward."""

    name: str
    dim: int
    stamp: str

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]: ...

    def frames(self, x: np.ndarray) -> int: ...

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray: ...


def check_model_dir(model_dir: str | os.PathLike[str]) -> Path:
    d = Path(model_dir)
    if not d.exists():
        raise ModelError(d, None, "model directory not found")
    if not d.is_dir():
        raise ModelError(d, None, "--model-dir must be a directory (with config.yaml and the model weights)")
    if not (d / "config.yaml").is_file():
        raise ModelError(
            d / "config.yaml",
            None,
            "not found: a model directory holds config.yaml and the weights (stage 4 writes config.yaml + model.pth)",
        )
    return d


def resolve_device(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"--device {device}: CUDA is not available here "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
            )
        return device  # "cuda" is the first visible device: run.pl/slurm.pl --gpu 1 set CUDA_VISIBLE_DEVICES
    if device != "cpu":
        raise ValueError(f"--device must be cpu or cuda[:N], got {device!r}")
    return device


def pad(xs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[T_i, ...] arrays -> zero-padded [B, T_max, ...] and lengths [B]."""
    lengths = np.array([x.shape[0] for x in xs], dtype=np.int64)
    out = np.zeros((len(xs), int(lengths.max()), *xs[0].shape[1:]), dtype=np.float32)
    for i, x in enumerate(xs):
        out[i, : x.shape[0]] = x
    return out, lengths


class PadCollate:
    """DataLoader ``collate_fn`` that assembles batches *in the workers*: it splits the loaded
    ``(utt, x, err)`` items by :func:`split_by_frames` and pads every part into a float32
    tensor + int64 lengths, so the job's main process only copies to the device (pinned memory,
    ``non_blocking``) and runs the model.  Picklable (no model inside).

    Returns ``(items, parts)``: ``items`` as loaded minus the inputs (``(utt, err)``, for error
    handling), ``parts`` a list of ``(utts, feats [B, T, D], lengths [B])``."""

    def __init__(self, frames: Callable[[np.ndarray], int], max_frames: int) -> None:
        self.frames, self.max_frames = frames, max_frames

    def __call__(self, items: list[Any]) -> tuple[list[tuple[str, Any]], list[tuple[list[str], Any, Any]]]:
        import torch

        good = [(utt, x) for utt, x, err in items if err is None]
        parts = []
        for part in split_by_frames(good, lambda it: self.frames(it[1]), self.max_frames):
            feats, lengths = pad([x for _, x in part])
            parts.append(([u for u, _ in part], torch.from_numpy(feats), torch.from_numpy(lengths)))
        return [(utt, err) for utt, _, err in items], parts
