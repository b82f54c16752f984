"""spkflow's own models in stage 5: a stage-4 model dir run through the :class:`~spkflow.embed.base.Embedder` interface.

Inputs are computed in DataLoader workers (audio -> Kaldi fbank -> energy VAD -> the config's
frontend) or read from stage 2's ``feats.scp``; batches are padded and masked, so a batch gives
every utterance the embedding it gets alone (``test/embed/test_embed*.py``).

Where the frontend runs (``fbank_on``, stage 5's ``--fbank-on``): ``workers`` computes it per
utterance with numpy in the DataLoader workers (the CPU default); ``device`` has the workers only
decode, resample and pad waveforms, and computes fbank, VAD and frontend batched on the model's
device (:class:`spkflow.features.torch_fbank.BatchFrontend`, within 1e-5 of the numpy numbers):
on a GPU the CPU cores then feed ~4x more utterances per second (decoding is ~4,000x real time
per core, decoding + numpy fbank ~875x).  ``auto`` picks ``device`` when the model runs on CUDA
and reads audio (no ``feats_dir``), else ``workers``.  The choice is not part of the model stamp:
the two give the same embeddings up to float rounding, as thread counts do.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.core.errors import UtteranceError
from spkflow.data.audio import AudioReader, OpenSamples
from spkflow.data.tables import read_kv
from spkflow.embed.base import (
    FRAME_RATE,
    ModelError,
    PadCollate,
    PendingEmbeddings,
    autocast,
    autocast_dtype,
    check_model_dir,
    model_files,
    model_stamp,
    pad,
    resolve_device,
)
from spkflow.features.fbank import (
    FbankOptions,
    VadOptions,
    apply_frontend,
    compute_fbank,
    compute_vad,
    num_frames,
    wave_frontend,
)

__all__ = ["SpkflowEmbedder", "FBANK_ON"]

#: ``fbank_on`` choices (see the module doc)
FBANK_ON = ("auto", "workers", "device")


class _FrameCount:
    """Picklable ``frames`` of a spkflow model: 10 ms frames of a feature matrix [T, F], or of
    the fbank of a waveform [S] (``fbank_on`` device)."""

    def __init__(self, per_frame: float, fbank: FbankOptions) -> None:
        self.per_frame, self.fbank = per_frame, fbank

    def __call__(self, x: np.ndarray) -> int:
        n = x.shape[0] if x.ndim == 2 else num_frames(x.shape[0], self.fbank)
        return max(1, int(math.ceil(n * self.per_frame)))


class _WavePreparer:
    """Audio at the fbank's rate, in a worker (``fbank_on`` device: the frontend runs on the
    model's device).  An utterance shorter than one frame fails here, named."""

    finite = True  # the reader's samples: a NaN or an infinity fails the utterance there, named

    def __init__(self, data_dir: str, fbank: FbankOptions) -> None:
        self.data_dir, self.fbank = data_dir, fbank
        self._reader: Any = None

    def _open_reader(self) -> AudioReader:
        if self._reader is None:
            self._reader = AudioReader(self.data_dir, sample_rate=int(self.fbank.sample_frequency))
        return self._reader

    def open(self, utt: str) -> OpenSamples | None:
        """The utterance's samples still in their open file, for the batch to read in place
        (:meth:`spkflow.data.audio.AudioReader.open_samples`), or None: call the preparer."""
        x = self._open_reader().open_samples(utt)
        if x is not None and num_frames(x.shape[0], self.fbank) <= 0:
            x.close()  # the preparer says it
            return None
        return x

    def __call__(self, utt: str) -> np.ndarray:
        wave = self._open_reader().read(utt)
        if num_frames(len(wave), self.fbank) <= 0:
            raise UtteranceError(
                utt,
                self._reader.source(utt),
                f"{len(wave)} samples at {int(self.fbank.sample_frequency)} Hz is shorter than one frame "
                f"({self.fbank.window_size} samples)",
            )
        return wave


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
            vad = compute_vad(feats, self.vad)
        return feats, vad

    def __call__(self, utt: str) -> np.ndarray:

        if self.feats_dir is not None:
            feats, vad = self._from_feats(utt)
        else:
            if self._reader is None:
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
    """A stage-4 model dir (``config.yaml`` + ``model.pth``) run by :mod:`spkflow.nnet.models`.

    Inputs are whole utterances through the config's ``frontend`` (Kaldi fbank, energy VAD,
    optional mean normalisation), computed from the audio in workers or on the model's device
    (``fbank_on``, see the module doc), or read from a stage-2 ``feats.scp`` (+ ``vad.scp``) when
    ``feats_dir`` is given.  :meth:`embed` and :meth:`embed_padded` take features ``[T, F]`` or,
    whatever ``fbank_on``, waveforms ``[S]`` at the fbank's rate (the frontend then runs on the device).
    """

    name = "spkflow"

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        device: str = "cpu",
        feats_dir: str | os.PathLike[str] | None = None,
        dtype: str = "float32",
        fbank_on: str = "workers",
    ) -> None:
        import torch

        # function-level: these import torch, and `import spkflow` (the API) must stay torch-free
        from spkflow.features.torch_fbank import BatchFrontend
        from spkflow.nnet.models import load_model_dir

        if fbank_on not in FBANK_ON:
            raise ValueError(f"--fbank-on must be one of {', '.join(FBANK_ON)}, got {fbank_on!r}")
        if fbank_on == "device" and feats_dir is not None:
            raise ValueError("--fbank-on device computes fbank from the audio; --feats-dir reads stage 2's features")

        d = check_model_dir(model_dir)
        if not (d / "model.pth").is_file():
            raise ModelError(d / "model.pth", None, "not found: the model directory has no weights")
        self.device = resolve_device(device)
        self.dtype = dtype
        self._autocast = autocast_dtype(dtype, self.device)
        # a truncated or code-holding model.pth: spkflow.nnet.checkpoint's CheckpointError names it
        self.model, self.config = load_model_dir(d, self.device)
        self.stamp = model_stamp(self.name, *model_files(self.name, d), dtype=dtype)
        fe = dict(self.config.get("frontend") or {})
        self.fbank = FbankOptions.from_dict(dict(fe.get("fbank") or {}))
        self.use_vad = bool(fe.get("vad", False))
        vad_conf = fe.get("vad_conf")
        self.vad = VadOptions(**dict(vad_conf)) if isinstance(vad_conf, Mapping) else VadOptions()
        self.mean_norm = bool(fe.get("mean_norm", False))
        self.feats_dir = None if feats_dir is None else os.fspath(feats_dir)
        if fbank_on == "device" and self.fbank.dither != 0.0:
            raise ValueError("--fbank-on device needs the model's fbank dither to be 0 (use --fbank-on workers)")
        exact = self.fbank.dither == 0.0  # dithered fbank is the numpy path's (seeded per utterance)
        auto = fbank_on == "auto" and self.device.startswith("cuda") and self.feats_dir is None and exact
        self.fbank_on = "device" if fbank_on == "device" or auto else "workers"
        # also serves waveforms given to embed() / embed_padded() in workers mode
        self._frontend = BatchFrontend(self.fbank, self.vad, self.use_vad, self.mean_norm) if exact else None
        self.dim = int(self.model.embed_dim)
        self.sample_rate = int(self.fbank.sample_frequency)
        self._count = _FrameCount(FRAME_RATE / (1000.0 / float(self.fbank.frame_shift)), self.fbank)
        self._torch = torch

    def preparer(self, data_dir: str | os.PathLike[str]) -> Callable[[str], np.ndarray]:
        if self.fbank_on == "device":
            return _WavePreparer(os.fspath(data_dir), self.fbank)
        return _FbankPreparer(os.fspath(data_dir), self.fbank, self.vad, self.use_vad, self.mean_norm, self.feats_dir)

    def prepare_wave(self, wave: np.ndarray) -> np.ndarray:
        """The model's input of a mono waveform at :attr:`sample_rate`: fbank, VAD and mean
        normalisation as the config says (what the workers compute from a data dir's audio)."""
        return wave_frontend(
            wave, self.sample_rate, self.fbank, self.vad, use_vad=self.use_vad, mean_norm=self.mean_norm
        )

    def frames(self, x: np.ndarray) -> int:
        return self._count(x)

    def collater(self, max_frames: int) -> PadCollate:
        """Worker-side batch assembly for :func:`spkflow.embed.run.run_job` (see :class:`PadCollate`)."""
        # input elements per counted frame: a frame shift of samples, or a row of features
        shift = self.sample_rate * float(self.fbank.frame_shift) / 1000.0
        per_frame = (shift if self.fbank_on == "device" else self.fbank.num_mel_bins) / self._count.per_frame
        return PadCollate(self._count, max_frames, per_frame)

    def embed_padded(self, feats: Any, lengths: Any) -> np.ndarray:
        """Embeddings (float32) of a padded batch from :class:`PadCollate`: features ``[B, T, F]``
        or waveforms ``[B, S]`` (then the frontend runs on the device, in float32/float64 whatever
        the dtype)."""
        return self.launch_padded(feats, lengths).result()

    def launch_padded(self, feats: Any, lengths: Any) -> PendingEmbeddings:
        """:meth:`embed_padded` queued on the device: the copies there and back are ``non_blocking``
        (they overlap when the batch is in page-locked memory), and the embeddings are ready at
        :meth:`PendingEmbeddings.result`, so the caller can write the batch before while the device
        computes this one.  On CPU the work is done on return."""
        torch = self._torch
        nb = self.device.startswith("cuda")
        x, n = feats.to(self.device, non_blocking=nb), lengths.to(self.device, non_blocking=nb)
        cudnn = torch.backends.cudnn
        with (
            torch.inference_mode(),
            # float32 is float32 on a GPU too: cuDNN's TF32 convolutions (torch's default) would
            # round inputs to 10 bits and break batched = alone; bfloat16/float16 are for speed
            cudnn.flags(
                enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic, allow_tf32=False
            ),
        ):
            if x.ndim == 2:
                if self._frontend is None:
                    raise ValueError("waveform input needs the model's fbank dither to be 0 (give features instead)")
                x, n = self._frontend(x, n)
            with autocast(self.device, self._autocast):
                out = self.model(x, n)
            out = out.float()
            if not nb:
                return PendingEmbeddings(out)
            back = out.to("cpu", non_blocking=True)  # into pinned memory, ready at the event
            done = torch.cuda.Event()
            done.record()
        return PendingEmbeddings(back, done)

    def embed(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        feats, lengths = pad(xs)
        return self.embed_padded(self._torch.from_numpy(feats), self._torch.from_numpy(lengths))
