"""What stage 5 runs: models behind one interface, and batches planned by length.

:class:`Embedder` is what :func:`spkflow.embed.run_job` needs from a model: a picklable
per-utterance input maker run in DataLoader workers, a length in 10 ms frames and a batched
forward.  :class:`SpkflowEmbedder` runs a stage-4 model dir; the ESPnet adapter is
:class:`spkflow.espnet_embedder.EspnetEmbedder`; :func:`load_embedder` picks one.

What it guarantees
------------------
* **Batched = alone.**  A padded batch gives every utterance the embedding it gets alone
  (spkflow models take ``lengths`` and :mod:`spkflow.models` masks padding;
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
  truncated or code-holding weights file: :class:`spkflow.checkpoint.CheckpointError`) are
  refused naming the file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from spkflow.errors import InputError, UtteranceError
from spkflow.jobs import file_sha256

__all__ = [
    "FRAME_RATE",
    "Embedder",
    "ModelError",
    "SpkflowEmbedder",
    "load_embedder",
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
    """What :func:`spkflow.embed.run_job` needs from a model: a picklable per-utterance input maker that runs
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


class _FrameCount:
    """Picklable ``frames`` of a spkflow model (10 ms frames of a feature matrix)."""

    def __init__(self, per_frame: float) -> None:
        self.per_frame = per_frame

    def __call__(self, x: np.ndarray) -> int:
        return max(1, int(math.ceil(x.shape[0] * self.per_frame)))


class _FbankPreparer:
    """Audio -> fbank -> (VAD) -> frontend, in a worker.  Picklable: the reader opens lazily."""

    def __init__(
        self, data_dir: str, fbank: Any, vad: Any | None, use_vad: bool, mean_norm: bool, feats_dir: str | None = None
    ) -> None:
        self.data_dir, self.fbank, self.vad = data_dir, fbank, vad
        self.use_vad, self.mean_norm, self.feats_dir = use_vad, mean_norm, feats_dir
        self._reader: Any = None
        self._feats: dict[str, str] | None = None
        self._vads: dict[str, str] | None = None

    def _from_feats(self, utt: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Stage-2 features and VAD of ``utt`` (VAD computed when vad.scp lacks it)."""
        import kaldiio

        from spkflow.datadir import read_kv

        assert self.feats_dir is not None
        if self._feats is None:
            self._feats = read_kv(Path(self.feats_dir) / "feats.scp")
            vad_scp = Path(self.feats_dir) / "vad.scp"
            self._vads = read_kv(vad_scp) if self.use_vad and vad_scp.is_file() else {}
        spec = self._feats.get(utt)
        if spec is None:
            raise UtteranceError(utt, f"{self.feats_dir}/feats.scp", "utterance not in feats.scp")
        try:
            feats = np.asarray(kaldiio.load_mat(spec), dtype=np.float32)
            vad = np.asarray(kaldiio.load_mat(self._vads[utt]), dtype=np.float32) if utt in (self._vads or {}) else None
        except Exception as exc:
            raise UtteranceError(utt, spec, f"cannot read features: {exc}") from exc
        if vad is None and self.use_vad and self.vad is not None:
            from spkflow.features import compute_vad

            vad = compute_vad(feats, self.vad)
        return feats, vad

    def __call__(self, utt: str) -> np.ndarray:
        from spkflow.features import apply_frontend, compute_fbank, compute_vad

        if self.feats_dir is not None:
            feats, vad = self._from_feats(utt)
        else:
            if self._reader is None:
                from spkflow.audio import AudioReader

                self._reader = AudioReader(self.data_dir, sample_rate=int(self.fbank.sample_frequency))
            wave = self._reader.read(utt)
            try:
                feats = compute_fbank(wave, int(self.fbank.sample_frequency), self.fbank)
            except ValueError as exc:
                raise UtteranceError(utt, self._reader.source(utt), str(exc)) from None
            vad = compute_vad(feats, self.vad) if (self.use_vad and self.vad is not None) else None
        out = apply_frontend(feats, vad, use_vad=self.use_vad, mean_norm=self.mean_norm)
        if out.shape[0] == 0:
            raise UtteranceError(utt, self.data_dir, "no frames left after the frontend")
        return out


class SpkflowEmbedder:
    """A stage-4 model dir (``config.yaml`` + ``model.pth``) run by :mod:`spkflow.models`.

    Inputs are whole utterances through the config's ``frontend`` (Kaldi fbank, energy VAD,
    optional mean normalisation), computed in workers from the audio, or read from a stage-2
    ``feats.scp`` (+ ``vad.scp``) when ``feats_dir`` is given.
    """

    name = "spkflow"

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        device: str = "cpu",
        feats_dir: str | os.PathLike[str] | None = None,
        dtype: str = "float32",
    ) -> None:
        import torch

        from spkflow.features import FbankOptions, VadOptions
        from spkflow.models import load_model_dir

        d = check_model_dir(model_dir)
        if not (d / "model.pth").is_file():
            raise ModelError(d / "model.pth", None, "not found: the model directory has no weights")
        self.device = resolve_device(device)
        self.dtype = dtype
        self._autocast = autocast_dtype(dtype, self.device)
        # a truncated or code-holding model.pth: spkflow.checkpoint's CheckpointError names it
        self.model, self.config = load_model_dir(d, self.device)
        self.stamp = model_stamp(self.name, d / "config.yaml", d / "model.pth", dtype)
        fe = dict(self.config.get("frontend") or {})
        self.fbank = FbankOptions.from_dict(dict(fe.get("fbank") or {}))
        self.use_vad = bool(fe.get("vad", False))
        vad_conf = fe.get("vad_conf")
        self.vad = VadOptions(**dict(vad_conf)) if isinstance(vad_conf, Mapping) else VadOptions()
        self.mean_norm = bool(fe.get("mean_norm", False))
        self.feats_dir = None if feats_dir is None else os.fspath(feats_dir)
        self.dim = int(self.model.embed_dim)
        self._frames_per_frame = FRAME_RATE / (1000.0 / float(self.fbank.frame_shift))
        self._torch = torch

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]:
        return _FbankPreparer(os.fspath(data_dir), self.fbank, self.vad, self.use_vad, self.mean_norm, self.feats_dir)

    def frames(self, x: np.ndarray) -> int:
        return max(1, int(math.ceil(x.shape[0] * self._frames_per_frame)))

    def collater(self, max_frames: int) -> PadCollate:
        """Worker-side batch assembly for :func:`spkflow.embed.run_job` (see :class:`PadCollate`)."""
        return PadCollate(_FrameCount(self._frames_per_frame), max_frames)

    def embed_padded(self, feats: Any, lengths: Any) -> np.ndarray:
        """Embeddings (float32) of a padded batch from :class:`PadCollate`; the copy to the device
        is ``non_blocking`` (it overlaps only when the DataLoader pinned the batch)."""
        torch = self._torch
        nb = self.device.startswith("cuda")
        with (
            torch.inference_mode(),
            torch.autocast(
                device_type=self.device.split(":")[0],
                dtype=self._autocast or torch.float32,
                enabled=self._autocast is not None,
            ),
        ):
            out = self.model(feats.to(self.device, non_blocking=nb), lengths.to(self.device, non_blocking=nb))
        return out.float().cpu().numpy()

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        feats, lengths = pad(xs)
        return self.embed_padded(self._torch.from_numpy(feats), self._torch.from_numpy(lengths))


def load_embedder(
    toolkit: str,
    model_dir: str | os.PathLike[str],
    device: str = "cpu",
    model_file: str | os.PathLike[str] | None = None,
    feats_dir: str | os.PathLike[str] | None = None,
    dtype: str = "float32",
) -> Embedder:
    """``toolkit``: ``spkflow`` (a stage-4 model dir) or ``espnet`` (an ESPnet speaker model dir)."""
    if toolkit == "spkflow":
        if model_file is not None:
            raise ValueError("--model-file is for --toolkit espnet; a spkflow model dir has model.pth")
        return SpkflowEmbedder(model_dir, device, feats_dir=feats_dir, dtype=dtype)
    if toolkit == "espnet":
        if feats_dir is not None:
            raise ValueError("--feats-dir is for --toolkit spkflow; ESPnet models read audio")
        if dtype != "float32":
            raise ValueError("--dtype other than float32 is for --toolkit spkflow (not implemented for ESPnet models)")
        from spkflow.espnet_embedder import EspnetEmbedder

        return EspnetEmbedder(model_dir, device, model_file=model_file)
    raise ValueError(f"--toolkit must be spkflow or espnet, got {toolkit!r}")
