"""Speaker-embedding extraction (stage 5): batched, parallel, resumable, exact.

One extraction = ``--nj`` independent jobs (processes started by ``run.pl`` / ``queue.pl`` /
``slurm.pl``, one GPU each with ``--gpu 1``), then one merge.  Inside a job
(:func:`run_job`): DataLoader worker *processes* read and resample the audio (and compute
features for spkflow models), batches are formed by length under a bound on padded frames,
the model runs with lengths, and every batch is committed to the job's ark + scp before the
next one starts.  :func:`merge_embeddings` checks the union of the jobs' outputs against the
data dir and writes ``xvector.{ark,scp}`` and ``spk_xvector.{ark,scp}`` (float32 Kaldi
vectors, read by ``kaldiio`` and by ESPnet's ``ESPnetDataset`` type ``kaldi_ark``).

What it guarantees
------------------
* **Batched = alone.**  An utterance gets the embedding it gets in a batch of one (max abs
  difference of L2-normalised vectors <= 1e-4; ``test/test_embed*.py`` check mixed lengths).
  spkflow models take ``lengths`` (:mod:`spkflow.models` masks padding).  ESPnet models do not
  (see below); :class:`EspnetEmbedder` runs ESPnet's frontend one utterance at a time and the
  encoder under :class:`PaddingMask`, or one utterance at a time when the encoder has a layer
  whose padding behaviour we cannot control.
* **Bounded batches.**  A batch holds at most ``batch_size`` utterances and at most
  ``max_frames`` padded frames (batch size x longest utterance, 10 ms frames).  Lengths are
  planned from ``utt2dur`` / ``utt2num_frames`` / file headers and checked again after loading
  (a batch that turns out longer is split), so one long utterance never multiplies memory.
  The scripts' default bound is 3000 frames on CPU, where bigger batches cost *more* CPU time
  (measured on speechocean762 with an ECAPA-512: 8000 frames +15 %, 60000 frames +30 %; the
  convolutions are compute bound and large activations leave the caches), and 60000 on GPU.
* **Keys in data-dir order.**  Outputs are written in ``utt2spk`` order, which must be
  ``LC_ALL=C`` sorted (checked).  The merge fails, listing them, when a data-dir utterance has
  no embedding or an embedding has no utterance.
* **Resumable, never complete-looking when incomplete.**  A job appends each batch to its own
  ark (a new ark per attempt) and only then appends the batch's keys to its commit log
  ``xvector.JOB.scp`` (both fsync'ed).  A killed job leaves at most an unreferenced tail; the
  next run reads every commit log, computes only the missing utterances, and the merge writes
  exactly one embedding per utterance.  Final files appear atomically, ``xvector.scp`` last.
* **Bad input.**  An unreadable utterance fails its job with an error naming it and its source
  (or, with ``skip_bad``, is listed in ``OUT_DIR/bad_utts`` with the reason and left out); a
  speaker all of whose utterances failed is reported in ``OUT_DIR/bad_spks`` and gets no mean,
  never a mean over nothing.  A model dir without ``config.yaml`` or without weights is refused
  by name.
* **Speaker means** (``spk_xvector.scp``) average the *raw* utterance vectors, as ESPnet's
  ``extract_xvectors.py`` / ``extract_spk_embed.py`` do (``np.mean`` of the embeddings); ESPnet's
  TTS models L2-normalise ``spembs`` on input (``F.normalize`` in Tacotron2, FastSpeech2, ...),
  so the files are drop-in replacements.  ``spk_mean="l2"`` averages L2-normalised vectors
  instead (each utterance weighs the same whatever its norm).

What ESPnet does with lengths (espnet 202511, read for this module)
-------------------------------------------------------------------
``ESPnetSpeakerModel.forward(speech, speech_lengths)`` passes the lengths to the frontend and
from the frontend to the pooling, never to the encoder.  ``DefaultFrontend`` (STFT) masks
padded frames and returns true frame counts; ``MelSpectrogramTorch`` (the frontend of ESPnet's
ECAPA/x-vector speaker recipes) ignores the lengths, returns the *padded* length for every row
and its ``normalize: mn`` subtracts a mean taken over the padding too.  The encoders
(``ecapa_tdnn``, ``xvector``, ``rawnet3``, ...) take no lengths: their convolutions read padded
frames and the SE / AFMS blocks average over them.  So a zero-padded batch changes every
embedding but the longest one's (``test/test_embed_espnet.py``: L2-normalised differences above
0.01 for a tiny ECAPA).  The pooling gets the *frontend's* frame count even when the encoder
shortens the time axis (``xvector``: 6 frames fewer), so ESPnet's statistics divide by a count
a little larger than the frames summed; :class:`EspnetEmbedder` reproduces ESPnet's
single-utterance numbers (identical in the tests), it does not correct them.

Anchors and what we do better
-----------------------------
ESPnet's ``egs2/TEMPLATE/asr1/pyscripts/utils/extract_spk_embed.py`` (sequential, and since
2025 with a thread pool) and ``extract_spk_embed_parallel.py``, with
``egs2/TEMPLATE/tts1/scripts/utils/sort_spk_embed_scp.sh``.  Those use *threads* in one process
on one device (the GIL and one model bound them; no ``--nj``, no cluster); they zero-pad a
batch and call the model without ``speech_lengths`` (padded utterances get other embeddings);
they write keys in completion order (``as_completed``), hence the separate sort script, which
hard-codes set names (``train``/``val`` under ``raw/org``), needs a ``text`` file, sorts the
data dir's files in place, and replaces the scp *before* checking it; their test uses
equal-length utterances, so the padding bug cannot show.  They cannot resume (one unreadable
file aborts the run and everything is recomputed), write the ark non-atomically, silently fall
back to CPU when CUDA is missing, and load weights with ``torch.load(weights_only=False)``
and ``strict=False`` (a checkpoint that does not fit the config loads without a word).
Here: parallel processes through ``$cmd`` (nj x GPUs), lengths honoured, keys in data-dir
order with a missing/extra check, resume, atomic outputs, no hard-coded set names, weights
loaded with ``weights_only=True`` and every non-loss key checked.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from spkflow.atomic import atomic_write, write_text_atomic
from spkflow.audio import known_durations
from spkflow.errors import InputError, UtteranceError

__all__ = [
    "FRAME_RATE",
    "Embedder",
    "SpkflowEmbedder",
    "EspnetEmbedder",
    "PaddingMask",
    "load_embedder",
    "data_dir_keys",
    "plan_batches",
    "split_by_frames",
    "read_commit_log",
    "committed_entries",
    "JobWriter",
    "JobSummary",
    "run_job",
    "MergeError",
    "MergeReport",
    "merge_embeddings",
    "read_vectors",
    "write_vectors",
    "align_scp",
]

log = logging.getLogger("spkflow.embed")

#: frames per second of the length bound (``max_frames``): 10 ms frames for every toolkit
FRAME_RATE = 100
#: commit logs and arks of the jobs inside the job dir
_COMMIT_GLOB = "xvector.*.scp"
_BAD_GLOB = "bad_utts.*"
_SCP_RE = re.compile(r"^(\S+)[ \t]+(.+):(\d+)$")
_SHOW = 20  # keys shown in an error message


# =============================================================================== data dir


def _show_keys(keys: Sequence[str], limit: int = _SHOW) -> str:
    shown = " ".join(keys[:limit])
    return shown + (f" ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def data_dir_keys(data_dir: str | os.PathLike[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Utterances (``utt2spk`` order) and ``spk -> [utts]`` of a data dir.

    ``utt2spk`` must be sorted and unique in ``LC_ALL=C`` order (InputError at the first bad
    line); ``spk2utt`` is read when present (else derived from ``utt2spk``) and must list the
    same utterances.
    """
    from spkflow.datadir import DataDir, check_sorted_unique

    d = DataDir(data_dir)
    utt2spk_path = d.file("utt2spk")
    if not utt2spk_path.is_file():
        raise InputError(utt2spk_path, None, "no utt2spk: not a Kaldi data directory")
    check_sorted_unique(utt2spk_path)
    utt2spk = d.utt2spk()
    spk2utt = d.spk2utt()
    listed = {u for us in spk2utt.values() for u in us}
    if listed != set(utt2spk):
        only = sorted(set(utt2spk) ^ listed)
        raise InputError(
            d.file("spk2utt"),
            None,
            f"spk2utt and utt2spk list different utterances: {_show_keys(only)} (run utils/fix_data_dir.sh)",
        )
    return list(utt2spk), spk2utt


# =============================================================================== batches


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


# =============================================================================== embedders


class Embedder(Protocol):
    """What :func:`run_job` needs from a model: a picklable per-utterance input maker that runs
    in DataLoader workers, a length in 10 ms frames, and a batched forward."""

    name: str
    dim: int

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]: ...

    def frames(self, x: np.ndarray) -> int: ...

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray: ...


def _check_model_dir(model_dir: str | os.PathLike[str]) -> Path:
    d = Path(model_dir)
    if not d.exists():
        raise InputError(d, None, "model directory not found")
    if not d.is_dir():
        raise InputError(d, None, "--model-dir must be a directory (with config.yaml and the model weights)")
    if not (d / "config.yaml").is_file():
        raise InputError(
            d / "config.yaml",
            None,
            "not found: a model directory holds config.yaml and the weights (stage 4 writes config.yaml + model.pth)",
        )
    return d


def _resolve_device(device: str) -> str:
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


def _pad(xs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[T_i, ...] arrays -> zero-padded [B, T_max, ...] and lengths [B]."""
    lengths = np.array([x.shape[0] for x in xs], dtype=np.int64)
    out = np.zeros((len(xs), int(lengths.max()), *xs[0].shape[1:]), dtype=np.float32)
    for i, x in enumerate(xs):
        out[i, : x.shape[0]] = x
    return out, lengths


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
        self, model_dir: str | os.PathLike[str], device: str = "cpu", feats_dir: str | os.PathLike[str] | None = None
    ) -> None:
        import torch

        from spkflow.features import FbankOptions, VadOptions
        from spkflow.models import load_model_dir

        d = _check_model_dir(model_dir)
        if not (d / "model.pth").is_file():
            raise InputError(d / "model.pth", None, "not found: the model directory has no weights")
        self.device = _resolve_device(device)
        self.model, self.config = load_model_dir(d, self.device)
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

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        torch = self._torch
        feats, lengths = _pad(xs)
        with torch.inference_mode():
            out = self.model(torch.from_numpy(feats).to(self.device), torch.from_numpy(lengths).to(self.device))
        return out.float().cpu().numpy()


class _WavePreparer:
    """Audio at the model's rate, in a worker (ESPnet models take waveforms)."""

    def __init__(self, data_dir: str, sample_rate: int) -> None:
        self.data_dir, self.sample_rate = data_dir, sample_rate
        self._reader: Any = None

    def __call__(self, utt: str) -> np.ndarray:
        if self._reader is None:
            from spkflow.audio import AudioReader

            self._reader = AudioReader(self.data_dir, sample_rate=self.sample_rate)
        return self._reader.read(utt)


class _Untracked(RuntimeError):
    """A layer saw a time axis whose valid lengths are unknown (or ambiguous)."""


class PaddingMask:
    """Forward hooks that make a convolutional ESPnet encoder blind to padding.

    While :meth:`active` is in force with the valid lengths of a zero-padded batch, every
    ``Conv1d`` sees its padded frames set to zero (what its own zero padding gives an utterance
    alone), every ``MaxPool1d`` sees ``-inf`` there, and every ``AdaptiveAvgPool1d(1)`` (the SE
    squeeze) averages valid frames only.  Valid lengths are followed through the layers by
    the size of the time axis (a strided or unpadded convolution shortens it), so after the
    encoder :meth:`lengths` gives the valid frames of its output for the pooling.

    Only encoders made of layers listed in :data:`SAFE_LAYERS` and of ESPnet blocks whose
    ``forward`` combines sub-layer outputs frame by frame (:data:`SAFE_BLOCKS`: ECAPA-TDNN and
    x-vector) are accepted (:meth:`supports`); others (RawNet3 calls ``F.adaptive_avg_pool1d``
    directly, conformers and ResNets mix time otherwise) are run one utterance at a time by
    :class:`EspnetEmbedder`.  Outside :meth:`active` the hooks do nothing.
    """

    SAFE_BLOCKS = frozenset(
        {
            "espnet2.spk.encoder.ecapa_tdnn_encoder.EcapaTdnnEncoder",
            "espnet2.spk.layers.ecapa_block.EcapaBlock",
            "espnet2.spk.layers.ecapa_block.SEModule",
            "espnet2.spk.encoder.xvector_encoder.XvectorEncoder",
        }
    )

    def __init__(self, encoder: Any) -> None:
        import torch

        self._torch = torch
        self._lengths: dict[int, Any] | None = None
        ok, why = self.supports(encoder)
        if not ok:
            raise ValueError(why)
        nn = torch.nn
        for mod in encoder.modules():
            if isinstance(mod, (nn.Conv1d, nn.MaxPool1d)):
                mod.register_forward_pre_hook(self._mask_before)
                mod.register_forward_hook(self._track_after)
            elif isinstance(mod, nn.AdaptiveAvgPool1d):
                mod.register_forward_hook(self._masked_mean)

    @classmethod
    def safe_layers(cls) -> tuple[type, ...]:
        import torch.nn as nn

        return (
            nn.Conv1d,
            nn.BatchNorm1d,
            nn.ReLU,
            nn.LeakyReLU,
            nn.PReLU,
            nn.SiLU,
            nn.GELU,
            nn.ELU,
            nn.Sigmoid,
            nn.Tanh,
            nn.Identity,
            nn.Dropout,
            nn.Sequential,
            nn.ModuleList,
            nn.AdaptiveAvgPool1d,
            nn.MaxPool1d,
        )

    @classmethod
    def supports(cls, encoder: Any) -> tuple[bool, str]:
        """(True, "") when every sub-module is understood; else (False, the first that is not)."""
        import torch.nn as nn

        safe = cls.safe_layers()
        for name, mod in encoder.named_modules():
            qual = f"{type(mod).__module__}.{type(mod).__qualname__}"
            if qual in cls.SAFE_BLOCKS:
                continue
            if type(mod) not in safe:
                return False, f"layer '{name or '<encoder>'}' ({qual}) may mix padded frames into valid ones"
            if isinstance(mod, nn.Conv1d) and mod.padding_mode != "zeros":
                return False, f"layer '{name}' pads with {mod.padding_mode!r}, not zeros"
            if isinstance(mod, nn.AdaptiveAvgPool1d) and mod.output_size not in (1, (1,)):
                return False, f"layer '{name}' pools to {mod.output_size} frames (only 1 is handled)"
        return True, ""

    @contextlib.contextmanager
    def active(self, lengths: Any, max_len: int) -> Iterator[PaddingMask]:
        """Hooks on for one forward of a batch padded to ``max_len`` with valid ``lengths``."""
        self._lengths = {int(max_len): lengths}
        try:
            yield self
        finally:
            self._lengths = None

    def lengths(self, time_size: int) -> Any:
        """Valid lengths of a tensor whose time axis has ``time_size`` frames."""
        assert self._lengths is not None
        if time_size not in self._lengths:
            raise _Untracked(f"no lengths known for a time axis of {time_size} frames")
        return self._lengths[time_size]

    def _put(self, time_size: int, lengths: Any) -> None:
        assert self._lengths is not None
        prev = self._lengths.get(time_size)
        if prev is not None and not bool(self._torch.equal(prev, lengths)):
            raise _Untracked(f"two different length sets for a time axis of {time_size} frames")
        self._lengths[time_size] = lengths

    def _mask_before(self, mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if self._lengths is None:
            return None
        x = args[0]
        t = x.shape[-1]
        lens = self.lengths(t)
        if bool((lens >= t).all()):
            return None
        valid = self._torch.arange(t, device=x.device)[None, None, :] < lens.to(x.device)[:, None, None]
        fill = 0.0 if isinstance(mod, self._torch.nn.Conv1d) else float("-inf")
        return (x.masked_fill(~valid, fill), *args[1:])

    def _track_after(self, mod: Any, args: tuple[Any, ...], out: Any) -> None:
        if self._lengths is None:
            return
        lens = self.lengths(args[0].shape[-1])
        nn = self._torch.nn

        def one(v: Any) -> int:
            return int(v[0]) if isinstance(v, (tuple, list)) else int(v)

        k, s, d = one(mod.kernel_size), one(mod.stride), one(mod.dilation)
        if isinstance(mod, nn.Conv1d) and isinstance(mod.padding, str):
            p = (d * (k - 1)) // 2 if mod.padding == "same" else 0
            new = lens.clone() if mod.padding == "same" else (lens - d * (k - 1) - 1) // s + 1
        else:
            p = one(mod.padding)
            span = lens + 2 * p - d * (k - 1) - 1
            if isinstance(mod, nn.MaxPool1d) and mod.ceil_mode:
                new = -((-span) // s) + 1
            else:
                new = span // s + 1
        self._put(out.shape[-1], new.clamp(min=0, max=out.shape[-1]))

    def _masked_mean(self, mod: Any, args: tuple[Any, ...], out: Any) -> Any:
        if self._lengths is None:
            return None
        x = args[0]
        t = x.shape[-1]
        lens = self.lengths(t).to(x.device)
        self._put(1, self._torch.ones_like(lens))
        if bool((lens >= t).all()):
            return None
        valid = (self._torch.arange(t, device=x.device)[None, None, :] < lens[:, None, None]).to(x.dtype)
        return (x * valid).sum(dim=-1, keepdim=True) / lens.clamp(min=1).to(x.dtype)[:, None, None]


class EspnetEmbedder:
    """An ESPnet speaker model (``config.yaml`` + ``*.pth`` of ``espnet2/bin/spk_train.py``).

    Built with ``espnet2.tasks.spk.SpeakerTask.build_model`` from the config (so every ESPnet
    frontend/encoder/pooling/projector works), weights loaded with ``weights_only=True``; keys
    other than the training loss's must all match.  Inputs are waveforms at the frontend's
    ``fs`` (16 kHz unless the config says otherwise).  A batch runs ESPnet's frontend and
    normalisation one utterance at a time (they are cheap, and ``MelSpectrogramTorch`` ignores
    lengths), pads the features, runs the encoder under :class:`PaddingMask` and pools with the
    valid lengths.  Encoders :class:`PaddingMask` does not support run one utterance at a time.
    """

    name = "espnet"

    def __init__(
        self, model_dir: str | os.PathLike[str], device: str = "cpu", model_file: str | os.PathLike[str] | None = None
    ) -> None:
        import torch
        import yaml

        d = _check_model_dir(model_dir)
        self.config_path = d / "config.yaml"
        self.model_path = self._model_file(d, model_file)
        self.device = _resolve_device(device)
        with open(self.config_path, encoding="utf-8") as f:
            args = yaml.safe_load(f)
        if not isinstance(args, dict) or "encoder" not in args:
            raise InputError(self.config_path, None, "not an ESPnet speaker config (no 'encoder')")
        from espnet2.tasks.spk import SpeakerTask

        from spkflow.checkpoint import load_checkpoint

        model = SpeakerTask.build_model(argparse.Namespace(**args))
        state = load_checkpoint(self.model_path, hint="copy the model file again")  # spkflow.checkpoint
        if isinstance(state, dict) and isinstance(state.get("model"), dict):
            state = state["model"]
        if not isinstance(state, Mapping):
            raise InputError(self.model_path, None, f"not a state dict (got {type(state).__name__})")
        own = model.state_dict()
        shapes = [
            f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
            for k, v in state.items()
            if k in own and not k.startswith("loss.") and hasattr(v, "shape") and v.shape != own[k].shape
        ]
        if shapes:
            raise InputError(
                self.model_path, None, f"weights do not fit {self.config_path}: size mismatch {_show_keys(shapes, 3)}"
            )
        state = {k: v for k, v in state.items() if not (k in own and hasattr(v, "shape") and v.shape != own[k].shape)}
        missing, unexpected = model.load_state_dict(state, strict=False)
        bad = [f"missing {k}" for k in missing if not k.startswith("loss.")]
        bad += [f"unexpected {k}" for k in unexpected if not k.startswith("loss.")]
        if bad:
            raise InputError(self.model_path, None, f"weights do not fit {self.config_path}: {_show_keys(bad, 8)}")
        if model.frontend is None:
            raise InputError(
                self.config_path,
                None,
                "frontend: null (a model on precomputed features); only waveform-input ESPnet models are supported",
            )
        self.model = model.to(self.device).eval()
        fs = (args.get("frontend_conf") or {}).get("fs", 16000)
        if isinstance(fs, str):
            import humanfriendly

            fs = humanfriendly.parse_size(fs)
        self.sample_rate = int(fs)
        ok, why = PaddingMask.supports(model.encoder)
        self.mask = PaddingMask(model.encoder) if ok else None
        if not ok:
            log.warning(
                "ESPnet encoder %s: %s; utterances run one at a time so that each gets its own embedding",
                type(model.encoder).__name__,
                why,
            )
        self.dim = int(model.projector.output_size()) if model.projector is not None else -1
        self._torch = torch

    @staticmethod
    def _model_file(d: Path, model_file: str | os.PathLike[str] | None) -> Path:
        if model_file is not None:
            p = Path(model_file)
            if not p.is_file():
                raise InputError(p, None, "model file not found")
            return p
        if (d / "model.pth").is_file():
            return d / "model.pth"
        cands = sorted(p for p in d.glob("*.pth") if p.name != "checkpoint.pth")
        if len(cands) == 1:
            return cands[0]
        what = "no *.pth file" if not cands else f"several: {' '.join(p.name for p in cands)}"
        raise InputError(d, None, f"cannot tell which weights to use ({what}); give --model-file")

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]:
        return _WavePreparer(os.fspath(data_dir), self.sample_rate)

    def frames(self, x: np.ndarray) -> int:
        return max(1, int(math.ceil(x.shape[0] * FRAME_RATE / self.sample_rate)))

    def _features(self, x: np.ndarray) -> tuple[Any, Any]:
        """ESPnet's frontend (+ normalize) on one unpadded utterance -> ([T, F], the frame count
        the frontend reports, which is what ESPnet hands to its pooling)."""
        torch = self._torch
        m = self.model
        wav = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None].to(self.device)
        feats, flens = m.frontend(wav, torch.tensor([wav.shape[1]], device=self.device))
        if m.normalize is not None:
            feats, _ = m.normalize(feats, torch.tensor([feats.shape[1]], device=self.device))
        return feats[0], torch.as_tensor(flens).reshape(-1)[:1].to(self.device)

    def _pool_each(self, frames: Any, valid: Sequence[int], flens: Sequence[Any]) -> Any:
        """ESPnet's pooling one utterance at a time, on its valid frames, with the lengths ESPnet
        itself passes (the frontend's count: for an encoder that shortens the time axis, e.g.
        ``xvector``, ESPnet divides by that count; we reproduce it, not correct it)."""
        pooled = [
            self.model.pooling(frames[i : i + 1, :, : int(valid[i])], feat_lengths=flens[i])
            for i in range(frames.shape[0])
        ]
        return self._torch.cat(pooled, dim=0)

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            feats, flens = zip(*(self._features(x) for x in xs))
            pooled = None
            if self.mask is not None:
                lens = torch.tensor([f.shape[0] for f in feats], device=self.device)
                padded = torch.nn.utils.rnn.pad_sequence(list(feats), batch_first=True)
                try:
                    with self.mask.active(lens, padded.shape[1]) as mask:
                        frames = self.model.encode_frame(padded)
                        valid = mask.lengths(frames.shape[-1])
                    same = all(int(v) == int(f.round()) for v, f in zip(valid.tolist(), flens))
                    if same:  # the usual case (ECAPA keeps the time axis): pool the batch at once
                        pooled = self.model.pooling(frames, feat_lengths=torch.cat(flens))
                    else:
                        pooled = self._pool_each(frames, valid.tolist(), flens)
                except _Untracked as exc:
                    log.debug("batch of %d run one by one: %s", len(xs), exc)
                    pooled = None
            if pooled is None:  # one at a time, exactly as ESPnet's model.forward does it
                pooled = torch.cat(
                    [
                        self.model.pooling(self.model.encode_frame(f[None]), feat_lengths=n)
                        for f, n in zip(feats, flens)
                    ],
                    dim=0,
                )
            out = self.model.project_spk_embd(pooled)
        return out.float().cpu().numpy()


def load_embedder(
    toolkit: str,
    model_dir: str | os.PathLike[str],
    device: str = "cpu",
    model_file: str | os.PathLike[str] | None = None,
    feats_dir: str | os.PathLike[str] | None = None,
) -> Embedder:
    """``toolkit``: ``spkflow`` (a stage-4 model dir) or ``espnet`` (an ESPnet speaker model dir)."""
    if toolkit == "spkflow":
        if model_file is not None:
            raise ValueError("--model-file is for --toolkit espnet; a spkflow model dir has model.pth")
        return SpkflowEmbedder(model_dir, device, feats_dir=feats_dir)
    if toolkit == "espnet":
        if feats_dir is not None:
            raise ValueError("--feats-dir is for --toolkit spkflow; ESPnet models read audio")
        return EspnetEmbedder(model_dir, device, model_file=model_file)
    raise ValueError(f"--toolkit must be spkflow or espnet, got {toolkit!r}")


# =============================================================================== job outputs


def read_commit_log(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``(utt, "ark:offset")`` of every complete line of a job's commit log.

    A last line without its newline (the job was killed while appending) is ignored, as is a
    line whose ark is missing; both utterances count as not done.
    """
    raw = Path(path).read_bytes().decode("utf-8", "surrogateescape")
    lines = raw.split("\n")[:-1]  # the part after the last newline is incomplete (or empty)
    out = []
    for n, line in enumerate(lines, 1):
        m = _SCP_RE.match(line)
        if m is None:
            log.warning("%s:%d: ignoring malformed commit line %r", path, n, line[:80])
            continue
        if not os.path.isfile(m.group(2)):
            log.warning("%s:%d: ark %s is gone; %s will be recomputed", path, n, m.group(2), m.group(1))
            continue
        out.append((m.group(1), f"{m.group(2)}:{m.group(3)}"))
    return out


def committed_entries(job_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Every committed ``utt -> ark:offset`` in ``job_dir`` (all jobs, all attempts; first wins)."""
    out: dict[str, str] = {}
    for p in sorted(glob.glob(os.path.join(os.fspath(job_dir), _COMMIT_GLOB))):
        for utt, spec in read_commit_log(p):
            out.setdefault(utt, spec)
    return out


class JobWriter:
    """Append-only outputs of one job: ``xvector.JOB.ATTEMPT.ark`` (a new file per attempt, so a
    killed attempt's tail never sits in front of new records) and the commit log
    ``xvector.JOB.scp``.  :meth:`write` makes the vectors durable before it commits their keys."""

    def __init__(self, job_dir: str | os.PathLike[str], job_id: int | str) -> None:
        self.job_dir = os.fspath(job_dir)
        os.makedirs(self.job_dir, exist_ok=True)
        attempts = [
            int(m.group(1))
            for p in glob.glob(os.path.join(self.job_dir, f"xvector.{job_id}.*.ark"))
            if (m := re.search(r"\.(\d+)\.ark$", p))
        ]
        self.attempt = max(attempts, default=0) + 1
        self.ark_path = os.path.join(self.job_dir, f"xvector.{job_id}.{self.attempt}.ark")
        self.scp_path = os.path.join(self.job_dir, f"xvector.{job_id}.scp")
        if os.path.exists(self.scp_path):  # cut a torn last line, or the next commit would extend it
            with open(self.scp_path, "rb+") as f:
                data = f.read()
                cut = data.rfind(b"\n") + 1
                if cut != len(data):
                    log.warning("%s: dropping an incomplete last line (an earlier run was killed)", self.scp_path)
                    f.truncate(cut)
        self._ark = open(self.ark_path, "ab")
        self._scp = open(self.scp_path, "ab")
        self.written = 0

    def write(self, items: Sequence[tuple[str, np.ndarray]]) -> None:
        from kaldiio.matio import write_array

        lines = []
        for utt, vec in items:
            self._ark.write(f"{utt} ".encode("utf-8", "surrogateescape"))
            offset = self._ark.tell()
            write_array(self._ark, np.ascontiguousarray(vec, dtype=np.float32).reshape(-1))
            lines.append(f"{utt} {self.ark_path}:{offset}\n")
        self._ark.flush()
        os.fsync(self._ark.fileno())
        self._scp.write("".join(lines).encode("utf-8", "surrogateescape"))
        self._scp.flush()
        os.fsync(self._scp.fileno())
        self.written += len(items)

    def close(self) -> None:
        self._ark.close()
        self._scp.close()

    def __enter__(self) -> JobWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass
class JobSummary:
    total: int
    resumed: int
    computed: int
    bad: dict[str, str]


class _Inputs:
    """Map-style dataset: index -> ``(utt, input or None, (source, message) or None)``.

    Errors travel as data so the job, not the worker, decides (fail naming the utterance, or
    skip it)."""

    def __init__(self, utts: Sequence[str], prepare: Callable[[str], np.ndarray]) -> None:
        self.utts, self.prepare = list(utts), prepare

    def __len__(self) -> int:
        return len(self.utts)

    def __getitem__(self, i: int) -> tuple[str, np.ndarray | None, tuple[str, str] | None]:
        utt = self.utts[i]
        try:
            x = np.asarray(self.prepare(utt), dtype=np.float32)
        except UtteranceError as exc:
            return utt, None, (exc.source, exc.message)
        except Exception as exc:  # anything else is still this utterance's failure
            return utt, None, ("", f"{type(exc).__name__}: {exc}")
        if not np.all(np.isfinite(x)):
            return utt, None, ("", "input contains NaN or infinite values")
        return utt, x, None


def _collate(items: list[Any]) -> list[Any]:
    return items


def _worker_init(_: int) -> None:
    import torch

    torch.set_num_threads(1)


def run_job(
    embedder: Embedder,
    data_dir: str | os.PathLike[str],
    utts: Sequence[str],
    job_dir: str | os.PathLike[str],
    job_id: int | str = 1,
    *,
    batch_size: int = 32,
    max_frames: int = 60000,
    num_workers: int = 1,
    skip_bad: bool = False,
    progress: bool = True,
) -> JobSummary:
    """Embed ``utts`` of ``data_dir`` into ``job_dir`` (see :class:`JobWriter`), skipping those
    already committed by any job.  Raises :class:`UtteranceError` for an unreadable utterance
    unless ``skip_bad`` (then it is listed in ``job_dir/bad_utts.JOB`` with its reason)."""
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    job_dir = os.fspath(job_dir)
    os.makedirs(job_dir, exist_ok=True)
    done = committed_entries(job_dir)
    todo = [u for u in utts if u not in done]
    resumed = len(utts) - len(todo)
    log.info(
        "job %s: %d utterances; %d already done by an earlier run, %d to compute", job_id, len(utts), resumed, len(todo)
    )
    bad: dict[str, str] = {}
    bad_path = os.path.join(job_dir, f"bad_utts.{job_id}")
    if not todo:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bad_path)
        return JobSummary(len(utts), resumed, 0, bad)
    durations = known_durations(data_dir, todo)
    batches = plan_batches(todo, durations, batch_size, max_frames)
    index = {u: i for i, u in enumerate(todo)}
    log.info(
        "job %s: %d batches (at most %d utterances, %d padded frames each); %d DataLoader workers",
        job_id,
        len(batches),
        batch_size,
        max_frames,
        num_workers,
    )
    loader = DataLoader(
        _Inputs(todo, embedder.preparer(data_dir)),
        batch_sampler=[[index[u] for u in b] for b in batches],
        num_workers=num_workers,
        collate_fn=_collate,
        worker_init_fn=_worker_init if num_workers > 0 else None,
        prefetch_factor=4 if num_workers > 0 else None,
    )
    tty = sys.stderr.isatty()
    computed = 0
    with (
        JobWriter(job_dir, job_id) as writer,
        tqdm(
            total=len(todo),
            desc=f"job {job_id}",
            unit="utt",
            file=sys.stderr,
            disable=not progress,
            mininterval=0.5 if tty else 10.0,
            ascii=not tty,
        ) as bar,
    ):
        for items in loader:
            good = []
            for utt, x, err in items:
                if err is None:
                    good.append((utt, x))
                    continue
                if not skip_bad:
                    raise UtteranceError(utt, err[0], err[1])
                bad[utt] = f"{err[0]}: {err[1]}" if err[0] else err[1]
                log.warning("skipping utterance '%s': %s", utt, bad[utt])
            for part in split_by_frames(good, lambda it: embedder.frames(it[1]), max_frames):
                vecs = embedder.embed([x for _, x in part])
                keep = []
                for (utt, _), v in zip(part, vecs):
                    if np.all(np.isfinite(v)):
                        keep.append((utt, v))
                    elif skip_bad:
                        bad[utt] = "the model produced NaN or infinite values"
                        log.warning("skipping utterance '%s': %s", utt, bad[utt])
                    else:
                        raise UtteranceError(utt, os.fspath(data_dir), "the model produced NaN or infinite values")
                writer.write(keep)
                computed += len(keep)
            if bad:
                write_text_atomic(bad_path, "".join(f"{u} {r}\n" for u, r in sorted(bad.items())))
            bar.update(len(items))
    if not bad:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bad_path)
    log.info(
        "job %s: computed %d embeddings (attempt %d), %d bad utterances", job_id, computed, writer.attempt, len(bad)
    )
    return JobSummary(len(utts), resumed, computed, bad)


# =============================================================================== merge


class MergeError(RuntimeError):
    """The jobs' outputs do not cover the data dir exactly (message lists the keys)."""


@dataclasses.dataclass
class MergeReport:
    num_utts: int
    num_spks: int
    dim: int
    bad_utts: dict[str, str]
    empty_spks: list[str]
    xvector_scp: str
    spk_xvector_scp: str


def read_vectors(entries: Sequence[tuple[str, str]]) -> list[np.ndarray]:
    """Vectors of ``(key, "ark:offset")`` entries, opening each ark once (order kept)."""
    from kaldiio.matio import read_kaldi

    out: list[np.ndarray | None] = [None] * len(entries)
    by_ark: dict[str, list[tuple[int, int]]] = {}
    for i, (_, spec) in enumerate(entries):
        path, _, off = spec.rpartition(":")
        by_ark.setdefault(path, []).append((int(off), i))
    for path, offs in by_ark.items():
        with open(path, "rb") as f:
            for off, i in sorted(offs):
                f.seek(off)
                try:
                    v = read_kaldi(f)
                except Exception as exc:
                    raise MergeError(f"{path}:{off}: cannot read the vector of '{entries[i][0]}': {exc}") from exc
                out[i] = np.asarray(v, dtype=np.float32).reshape(-1)
    return out  # type: ignore[return-value]


def write_vectors(
    ark: str | os.PathLike[str], scp: str | os.PathLike[str], items: Sequence[tuple[str, np.ndarray]]
) -> None:
    """Write float32 vectors to ``ark`` and ``scp`` atomically, in the given order.

    The old scp is removed first and the new one appears last, so a crash leaves either no
    scp or one that matches its ark."""
    from kaldiio.matio import write_array

    ark, scp = os.fspath(ark), os.fspath(scp)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(scp)
    lines = []
    with atomic_write(ark, "wb", encoding=None) as f:
        for key, vec in items:
            f.write(f"{key} ".encode("utf-8", "surrogateescape"))
            lines.append(f"{key} {ark}:{f.tell()}\n")
            write_array(f, np.ascontiguousarray(vec, dtype=np.float32).reshape(-1))
    with atomic_write(scp, "wb", encoding=None) as f:
        f.write("".join(lines).encode("utf-8", "surrogateescape"))


def _read_bad(job_dir: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in sorted(glob.glob(os.path.join(job_dir, _BAD_GLOB))):
        for line in Path(p).read_text(encoding="utf-8", errors="surrogateescape").splitlines():
            if line.strip():
                utt, _, reason = line.partition(" ")
                out.setdefault(utt, reason)
    return out


def merge_embeddings(
    data_dir: str | os.PathLike[str],
    job_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    skip_bad: bool = False,
    spk_mean: str = "raw",
) -> MergeReport:
    """Check the jobs' outputs against the data dir and write the final files.

    Writes ``out_dir/xvector.{ark,scp}`` (one vector per utterance, ``utt2spk`` order),
    ``out_dir/spk_xvector.{ark,scp}`` (mean per speaker, ``spk2utt`` order), and, when there
    are any, ``out_dir/bad_utts`` (``utt reason``, only with ``skip_bad``) and
    ``out_dir/bad_spks`` (speakers left without an embedding).  Raises :class:`MergeError`
    listing the missing and the extra keys when the outputs do not match the data dir.
    """
    if spk_mean not in ("raw", "l2"):
        raise ValueError(f"spk_mean must be raw or l2, got {spk_mean!r}")
    job_dir, out_dir = os.fspath(job_dir), os.path.normpath(os.fspath(out_dir))
    utts, spk2utt = data_dir_keys(data_dir)
    have = committed_entries(job_dir)
    bad = {u: r for u, r in _read_bad(job_dir).items() if u not in have}
    uset = set(utts)
    extra = sorted(set(have) - uset)
    missing = [u for u in utts if u not in have and not (skip_bad and u in bad)]
    if missing or extra:
        msg = [f"embeddings in {job_dir} do not match {os.fspath(data_dir)}/utt2spk:"]
        if missing:
            msg.append(f"  {len(missing)} utterance(s) without an embedding: {_show_keys(missing)}")
            failed = [u for u in missing if u in bad]
            if failed:
                msg.append(
                    f"  of which {len(failed)} failed (see {job_dir}/bad_utts.*), e.g. {failed[0]}: {bad[failed[0]]}"
                )
        if extra:
            msg.append(
                f"  {len(extra)} embedding(s) of utterances not in the data dir: {_show_keys(extra)} "
                f"(the data dir changed since they were computed? remove {job_dir} to start over)"
            )
        raise MergeError("\n".join(msg))
    present = [u for u in utts if u in have]
    vecs = read_vectors([(u, have[u]) for u in present])
    dims = {v.shape[0] for v in vecs}
    if len(dims) > 1:
        raise MergeError(
            f"embeddings in {job_dir} have different sizes {sorted(dims)}: were they made by "
            f"different models? remove {job_dir} to start over"
        )
    for u, v in zip(present, vecs):
        if not np.all(np.isfinite(v)):
            raise MergeError(f"{have[u]}: embedding of '{u}' has NaN or infinite values")
    os.makedirs(out_dir, exist_ok=True)
    xv_ark, xv_scp = os.path.join(out_dir, "xvector.ark"), os.path.join(out_dir, "xvector.scp")
    sp_ark, sp_scp = os.path.join(out_dir, "spk_xvector.ark"), os.path.join(out_dir, "spk_xvector.scp")
    # spk_xvector.scp goes first: xvector.scp is the last file to appear
    with contextlib.suppress(FileNotFoundError):
        os.unlink(xv_scp)
    by_utt = dict(zip(present, vecs))
    means, empty = [], []
    for spk, members in spk2utt.items():
        vs = [by_utt[u] for u in members if u in by_utt]
        if not vs:
            empty.append(spk)
            continue
        m = np.stack(vs).astype(np.float64)
        if spk_mean == "l2":
            m = m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
        means.append((spk, m.mean(axis=0).astype(np.float32)))
    write_vectors(sp_ark, sp_scp, means)
    for name, table in (
        ("bad_utts", {u: bad[u] for u in utts if u in bad} if skip_bad else {}),
        ("bad_spks", {s: "all its utterances failed" for s in empty}),
    ):
        path = os.path.join(out_dir, name)
        if table:
            write_text_atomic(path, "".join(f"{k} {v}\n" for k, v in table.items()))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    if empty:
        log.warning(
            "%d speaker(s) have no embedded utterance and get no mean (listed in %s/bad_spks): %s",
            len(empty),
            out_dir,
            _show_keys(empty),
        )
    write_vectors(xv_ark, xv_scp, [(u, by_utt[u]) for u in present])
    return MergeReport(
        len(present), len(means), dims.pop() if dims else 0, bad if skip_bad else {}, empty, xv_scp, sp_scp
    )


# =============================================================================== alignment


def align_scp(data_dir: str | os.PathLike[str], scp: str | os.PathLike[str], *, write: bool = True) -> str:
    """Filter ``scp`` to the data dir's keys, sort it in the data dir's order and verify it.

    The keys are the data dir's utterances (``utt2spk``) or, when the scp holds more speaker
    ids than utterance ids, its speakers (``spk2utt``, for ``spk_xvector.scp``).  Lines whose
    key the data dir lacks are dropped (counted in the returned summary).  Then the scp must
    list exactly the data dir's keys: otherwise :class:`InputError` names the first line where
    they differ and how many keys are missing, and the file is left as it was.  With ``write``
    the filtered, sorted scp replaces the original atomically.
    """
    from spkflow.datadir import read_kv_lines

    scp = os.fspath(scp)
    utts, spk2utt = data_dir_keys(data_dir)
    entries = read_kv_lines(scp)
    seen: dict[str, int] = {}
    for n, (k, _) in enumerate(entries, 1):
        if k in seen:
            raise InputError(scp, n, f"duplicate key {k!r} (first on line {seen[k]})")
        seen[k] = n
    keys_u, keys_s = set(utts), set(spk2utt)
    n_u, n_s = sum(k in keys_u for k in seen), sum(k in keys_s for k in seen)
    ref, what = (list(spk2utt), "spk2utt") if n_s > n_u else (utts, "utt2spk")
    refset = set(ref)
    table = dict(entries)
    kept = [k for k in ref if k in table]
    dropped = len(entries) - len(kept)
    for i, k in enumerate(ref):
        got = kept[i] if i < len(kept) else None
        if got != k:
            nmiss = len(ref) - len(kept)
            found = f"'{got}'" if got is not None else "end of file"
            raise InputError(
                scp,
                None,
                f"after filtering and sorting, line {i + 1} should be '{k}' "
                f"(line {i + 1} of {os.fspath(data_dir)}/{what}) but is {found}; "
                f"{nmiss} key(s) of the data dir have no entry",
            )
    assert len(kept) == len(ref) and refset == set(kept)
    if write:
        with atomic_write(scp, "wb", encoding=None) as f:
            f.write("".join(f"{k} {table[k]}\n" for k in kept).encode("utf-8", "surrogateescape"))
    return f"{scp}: {len(kept)} keys aligned with {what}" + (f", {dropped} dropped" if dropped else "")
