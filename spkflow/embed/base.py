"""What stage 5 runs: the interface every model is run through, and batches planned by length.

:class:`Embedder` is what :func:`spkflow.embed.run.run_job` needs from a model: a picklable
per-utterance input maker run in DataLoader workers, a length in 10 ms frames and a batched
forward.  :class:`spkflow.embed.native.SpkflowEmbedder` runs a stage-4 model dir; the other
toolkits' adapters are :class:`~spkflow.embed.espnet.EspnetEmbedder`,
:class:`~spkflow.embed.speechbrain.SpeechbrainEmbedder`,
:class:`~spkflow.embed.wespeaker.WespeakerEmbedder` and
:class:`~spkflow.embed.resemblyzer.ResemblyzerEmbedder`; :func:`spkflow.embed.open_embedder` picks
one.  :func:`model_files` names the files that make a model's embeddings (what its stamp
hashes), :class:`WavePreparer` reads a data dir's audio at the model's rate in the workers.

What it guarantees
------------------
* **Batched = alone.**  A padded batch gives every utterance the embedding it gets alone
  (spkflow models take ``lengths`` and :mod:`spkflow.nnet.models` masks padding;
  ``test/embed/test_embed*.py`` check mixed lengths within 1e-4; other toolkits' encoders run
  under :mod:`spkflow.embed.masking` or in equal-length groups).
* **Bounded batches.**  :func:`plan_batches` puts at most ``batch_size`` utterances and at most
  ``max_frames`` padded frames (batch size x longest utterance, 10 ms frames) in a batch,
  longest first, deterministically; :func:`split_by_frames` applies the bound again after
  loading, so one long utterance never multiplies memory.  The default bound
  (:func:`default_max_frames`) is 3000 frames on CPU, where bigger batches cost *more* CPU time
  (measured on speechocean762 with an ECAPA-512: 8000 frames +15 %, 60000 frames +30 %), and
  60000 on GPU, divided by the encoder's frames per 10 ms (RawNet3: 10).
* **The model's identity.**  Every embedder carries :attr:`stamp` (toolkit and the SHA-256 of
  each of :func:`model_files`: config and weights, :func:`model_stamp`), recorded beside each
  job's embeddings so that the merge never mixes two models' vectors.
* **Precision.**  ``dtype`` float32 (default) or, through ``torch.autocast``, bfloat16 (CPU
  and CUDA) or float16 (CUDA only; a ValueError on CPU).  Vectors are returned float32 and
  the dtype is part of the stamp.  Batches are padded in DataLoader workers
  (:class:`PadCollate`) and copied with ``non_blocking`` from page-locked memory on CUDA; a
  batch's embeddings come back as :class:`PendingEmbeddings`, so the job writes one batch while
  the device computes the next.
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

from spkflow.core.errors import InputError, UtteranceError
from spkflow.core.extras import install_hint
from spkflow.core.shared_batches import HeldBuffers, shared_empty
from spkflow.data.audio import AudioReader
from spkflow.data.jobs import file_sha256

__all__ = [
    "FRAME_RATE",
    "Embedder",
    "ModelError",
    "PendingEmbeddings",
    "check_model_dir",
    "resolve_device",
    "model_stamp",
    "model_files",
    "default_max_frames",
    "CPU_MAX_FRAMES",
    "GPU_MAX_FRAMES",
    "TOOLKITS",
    "WavePreparer",
    "equal_length_groups",
    "onnx_session",
    "plan_batches",
    "split_by_frames",
    "pad",
    "PadCollate",
    "DTYPES",
    "autocast",
    "autocast_dtype",
]

#: frames per second of the length bound (``max_frames``): 10 ms frames for every toolkit
FRAME_RATE = 100
#: the default bound on padded 10 ms frames per batch, for a model whose encoder reads 10 ms frames
#: (scaled down for one that reads more, :func:`default_max_frames`): on CPU bigger batches cost
#: *more* CPU time (caches), on GPU they are what makes it fast
CPU_MAX_FRAMES, GPU_MAX_FRAMES = 3000, 60000


class ModelError(InputError):
    """The model cannot be used (a missing, unreadable, truncated or code-holding file); re-running
    with the same model cannot help, so the stage script does not suggest resuming."""


#: ``--toolkit`` choices: the model formats stage 5 and the API run
TOOLKITS = ("spkflow", "espnet", "speechbrain", "wespeaker", "resemblyzer")

#: ``--dtype`` choices: the precision the model runs in (outputs are always written float32)
DTYPES = ("float32", "bfloat16", "float16")


def model_stamp(toolkit: str, *files: str | os.PathLike[str], dtype: str = "float32") -> str:
    """``toolkit=T <sha256 of each file>...[ dtype=D]``: what the job dir's embeddings came from
    (``files``: :func:`model_files`, config first).  A reduced precision changes the numbers, so
    it is part of the stamp (a job dir is never half float32, half bfloat16); float32 adds
    nothing, so older stamps stay valid."""
    base = " ".join([f"toolkit={toolkit}", *(file_sha256(f) for f in files)])
    return base if dtype == "float32" else f"{base} dtype={dtype}"


def model_files(
    toolkit: str, model_dir: str | os.PathLike[str], model_file: str | os.PathLike[str] | None = None
) -> list[Path]:
    """The files whose bytes make a model's embeddings, config first: what :func:`model_stamp`
    hashes, for the stage script (``python -m spkflow.bin.model_stamp``) and the jobs alike.

    * ``spkflow``: ``config.yaml``, ``model.pth``;
    * ``espnet``: ``config.yaml`` and ``model_file``, else ``model.pth``, else the only ``*.pth``
      (a ``checkpoint.pth`` aside);
    * ``speechbrain``: ``hyperparams.yaml`` and every ``*.ckpt`` beside it (the files its
      ``Pretrainer`` loads; label and example files do not change an embedding);
    * ``wespeaker``: ``config.yaml`` when there is one (the frontend's settings), then
      ``model_file``, else the only ``*.onnx``; ``model_dir`` may be the ``.onnx`` file itself;
    * ``resemblyzer``: the only ``*.pt`` (the installed package's folder holds ``pretrained.pt``);
      ``model_dir`` may be the ``.pt`` file itself.

    Raises :class:`ModelError` naming what is missing or ambiguous.  Reads no file.
    """
    d = Path(model_dir)
    if toolkit in ("wespeaker", "resemblyzer") and d.is_file():
        return [d]
    if not d.is_dir():
        raise ModelError(d, None, "model directory not found" if not d.exists() else "not a directory")
    if model_file is not None and toolkit in ("spkflow", "speechbrain", "resemblyzer"):
        raise ModelError(Path(model_file), None, f"--model-file is for --toolkit espnet or wespeaker, not {toolkit}")
    chosen = Path(model_file) if model_file is not None else None
    if chosen is not None and not chosen.is_file():
        raise ModelError(chosen, None, "model file not found")

    def need(p: Path, what: str) -> Path:
        if not p.is_file():
            raise ModelError(p, None, f"not found: {what}")
        return p

    def only(pattern: str, skip: tuple[str, ...] = ()) -> Path:
        cands = sorted(p for p in d.glob(pattern) if p.name not in skip)
        if len(cands) == 1:
            return cands[0]
        what = f"no {pattern} file" if not cands else f"several: {' '.join(p.name for p in cands)}"
        raise ModelError(d, None, f"cannot tell which weights to use ({what}); give --model-file")

    if toolkit == "spkflow":
        cfg = need(d / "config.yaml", "a model directory holds config.yaml and the weights (stage 4 writes both)")
        return [cfg, need(d / "model.pth", "the model directory has no weights")]
    if toolkit == "espnet":
        cfg = need(d / "config.yaml", "an ESPnet speaker model directory holds config.yaml and the weights")
        if chosen is None:
            chosen = d / "model.pth" if (d / "model.pth").is_file() else only("*.pth", ("checkpoint.pth",))
        return [cfg, chosen]
    if toolkit == "speechbrain":
        hp = need(d / "hyperparams.yaml", "a SpeechBrain pretrained folder holds hyperparams.yaml and its *.ckpt files")
        return [hp, *sorted(d.glob("*.ckpt"))]
    if toolkit == "wespeaker":
        side = [d / "config.yaml"] if (d / "config.yaml").is_file() else []
        return [*side, chosen if chosen is not None else only("*.onnx")]
    if toolkit == "resemblyzer":
        pts = sorted(d.glob("*.pt"))
        if len(pts) != 1:
            what = "no *.pt file" if not pts else f"several: {' '.join(p.name for p in pts)}"
            raise ModelError(d, None, f"cannot tell which weights to use ({what}); give the .pt file as the model")
        return pts
    raise ValueError(f"--toolkit must be one of {', '.join(TOOLKITS)}, got {toolkit!r}")


def default_max_frames(embedder: Any, device: str) -> int:
    """The bound on padded 10 ms frames per batch when ``--max-frames`` is not given: 3000 on CPU,
    60000 on GPU, divided by the model's encoder frames per 10 ms (``embedder.frames_per_10ms``,
    1 by default): the bound is on what the encoder holds in memory.  RawNet3's encoder reads
    raw-waveform frames at 1 ms (10 per 10 ms): 300 on CPU, where its batch of 16 padded
    utterances ran at 0.55x the speed of one at a time (docs/benchmarks.md)."""
    rate = float(getattr(embedder, "frames_per_10ms", 1.0) or 1.0)
    base = GPU_MAX_FRAMES if str(device).startswith("cuda") else CPU_MAX_FRAMES
    return max(1, int(base / max(rate, 1.0)))


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


def autocast(device: str, dtype: Any) -> Any:
    """``torch.autocast`` on ``device``'s type to ``dtype`` (from :func:`autocast_dtype`); off
    for None (float32): the one place every toolkit's ``--dtype`` takes effect."""
    import torch

    return torch.autocast(device_type=device.split(":")[0], dtype=dtype or torch.float32, enabled=dtype is not None)


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


def planned_frames(batches: Sequence[Sequence[str]], durations: Mapping[str, float | None]) -> int | None:
    """Padded frames of the largest of ``batches`` (:func:`plan_batches`'), which may be far below
    the bound they were planned under; None when a duration is unknown (only the bound holds)."""
    most = 0
    for batch in batches:
        secs = [durations.get(u) for u in batch]
        if any(d is None for d in secs):
            return None
        most = max(most, len(batch) * _frames(max(float(d) for d in secs if d is not None)))
    return most


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


def equal_length_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Indices grouped by equal length (first-seen order): the batches a model that cannot be
    masked may run at once, with no padding at all."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(int(n), []).append(i)
    return list(groups.values())


class WavePreparer:
    """A data dir's utterance -> the model's input, in a DataLoader worker: the audio at the
    model's rate (:class:`spkflow.data.audio.AudioReader`: mono, float32 in [-1, 1], resampled),
    then ``transform`` (e.g. a toolkit's fbank; None: the waveform).  Picklable: the reader
    opens lazily in the worker.  A ``transform`` ValueError fails the utterance, named."""

    def __init__(
        self, data_dir: str, sample_rate: int, transform: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> None:
        self.data_dir, self.sample_rate, self.transform = data_dir, sample_rate, transform
        self._reader: Any = None

    def __call__(self, utt: str) -> np.ndarray:
        if self._reader is None:
            self._reader = AudioReader(self.data_dir, sample_rate=self.sample_rate)
        wave = self._reader.read(utt)
        if self.transform is None:
            return wave
        try:
            return self.transform(wave)
        except ValueError as exc:
            raise UtteranceError(utt, self._reader.source(utt), str(exc)) from None


# --------------------------------------------------------------------------- embedders


def onnx_session(path: str | os.PathLike[str], device: str = "cpu", num_threads: int | None = None) -> Any:
    """An onnxruntime session on ``device`` (``cpu``, ``cuda``, ``cuda:N``) with ``num_threads``
    intra-op threads (None: onnxruntime's default), for spkflow's exports and WeSpeaker's models.
    A missing onnxruntime, a missing CUDA provider and an unreadable file are named."""
    p = Path(path)
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelError(
            p, None, f"running an ONNX model needs onnxruntime: {install_hint('export')} ({exc})"
        ) from None
    if device == "cpu":
        providers: list[Any] = ["CPUExecutionProvider"]
    elif device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(f"--device {device}: this onnxruntime has no CUDAExecutionProvider")
        providers = [("CUDAExecutionProvider", {"device_id": int(device.partition(":")[2] or 0)})]
    else:
        raise ValueError(f"device must be cpu or cuda[:N], got {device!r}")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if num_threads is not None:
        opts.intra_op_num_threads = num_threads
        opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(os.fspath(p), opts, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ModelError(p, None, f"cannot load the ONNX model: {type(exc).__name__}: {exc}") from None


class Embedder(Protocol):
    """What :func:`spkflow.embed.run.run_job` needs from a model: a picklable per-utterance input maker that runs
    in DataLoader workers, a length in 10 ms frames, and a batched forward; and what the API needs:
    the rate the model's inputs are computed at and the input of a waveform at that rate."""

    name: str
    dim: int
    stamp: str
    device: str
    sample_rate: int

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]: ...

    def prepare_wave(self, wave: np.ndarray) -> np.ndarray: ...

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


def padded_shape(xs: Sequence[np.ndarray]) -> tuple[int, ...]:
    """The shape :func:`pad` gives ``xs``: [B, T_max, ...]."""
    return (len(xs), max(x.shape[0] for x in xs), *xs[0].shape[1:])


def pad_into(xs: Sequence[Any], out: np.ndarray) -> np.ndarray:
    """Write [T_i, ...] arrays zero-padded into ``out`` (float32, :func:`padded_shape`; its old
    contents need not be zero); returns the lengths [B] (int64).  An input still in its file
    (:class:`spkflow.data.audio.OpenSamples`) reads itself into its row."""
    lengths = np.array([x.shape[0] for x in xs], dtype=np.int64)
    for i, x in enumerate(xs):
        if isinstance(x, np.ndarray):
            out[i, : x.shape[0]] = x
        else:
            x.read_into(out[i, : x.shape[0]])
        out[i, x.shape[0] :] = 0
    return lengths


def pad(xs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[T_i, ...] arrays -> zero-padded [B, T_max, ...] and lengths [B]."""
    out = np.empty(padded_shape(xs), dtype=np.float32)
    return out, pad_into(xs, out)


class PadCollate:
    """DataLoader ``collate_fn`` that assembles batches *in the workers*: it splits the loaded
    ``(utt, x, err)`` items by :func:`split_by_frames` and pads every part into a float32
    tensor + int64 lengths, so the job's main process only copies to the device (pinned memory,
    ``non_blocking``) and runs the model.  Picklable (no model inside).

    Returns ``(items, parts)``: ``items`` as loaded minus the inputs (``(utt, err)``, for error
    handling), ``parts`` a list of ``(utts, feats [B, T, D], lengths [B])``."""

    def __init__(self, frames: Callable[[np.ndarray], int], max_frames: int, per_frame: float = 0.0) -> None:
        self.frames, self.max_frames, self.per_frame = frames, max_frames, per_frame
        self.held = HeldBuffers()
        self.bound = self.elements(max_frames)

    def elements(self, frames: int) -> int:
        """Input elements of a batch of ``frames`` padded frames, a quarter over (the last frame's
        window of each utterance); 0: unknown (an input's elements per frame were not given)."""
        return int(1.25 * frames * self.per_frame)

    def __call__(
        self, items: list[Any], into: Any = None
    ) -> tuple[list[tuple[str, Any]], list[tuple[list[str], Any, Any]]]:
        """``into``: a flat float32 buffer (a :class:`~spkflow.core.shared_batches.BufferPool`'s)
        the parts are written into one after the other when they fit in it; else, in a worker,
        each is made in a fresh shared segment (handed over uncopied)."""
        import torch

        good = [(utt, x) for utt, x, err in items if err is None]
        split = split_by_frames(good, lambda it: self.frames(it[1]), self.max_frames)
        shapes = [padded_shape([x for _, x in part]) for part in split]
        if into is not None and sum(math.prod(s) for s in shapes) <= into.numel():
            into, at = self.held.hold(into), 0
        else:
            into = None
        worker = torch.utils.data.get_worker_info() is not None
        parts = []
        for part, shape in zip(split, shapes, strict=True):
            xs = [x for _, x in part]
            if into is not None:
                feats, at = into[at : at + math.prod(shape)].view(shape), at + math.prod(shape)
            else:
                feats = shared_empty(shape) if worker else torch.empty(shape)
            lengths = pad_into(xs, feats.numpy())
            parts.append(([u for u, _ in part], feats, torch.from_numpy(lengths)))
        return [(utt, err) for utt, _, err in items], parts


class PendingEmbeddings:
    """A batch's embeddings on their way back from the device: :meth:`result` waits for them.
    ``done``: a CUDA event recorded after the copy back (None: ``out`` is ready)."""

    __slots__ = ("_out", "_done")

    def __init__(self, out: Any, done: Any = None) -> None:
        self._out, self._done = out, done

    def result(self) -> np.ndarray:
        """The embeddings, float32 ``[B, D]``."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None
        return self._out.numpy()


def batch_elements(batch: tuple[Any, list[tuple[list[str], Any, Any]]]) -> int:
    """The float32 elements a :class:`PadCollate` batch holds (what its buffer must take)."""
    return sum(int(feats.numel()) for _, feats, _ in batch[1])
