"""Export a trained spkflow embedder to ONNX: ``feats [B, T, F]`` + ``lengths [B]`` -> ``embedding [B, D]``.

The graph starts at the frontend's output (Kaldi fbank after VAD and mean normalisation,
:meth:`spkflow.api.Embedder.features`); batch and time axes are dynamic, and padded utterances
get the embedding they get alone, as in PyTorch.  The frontend's options (the config's
``frontend`` section) are stored in the ONNX file's metadata (``spkflow.frontend``, JSON), so a
runtime without spkflow knows what features to compute.

What it guarantees
------------------
* **Parity, checked at export.**  :func:`export_onnx` runs the written file with onnxruntime on
  a padded batch and on single utterances of several lengths and refuses to keep it (nothing is
  written) when any embedding differs from PyTorch's by more than ``tol`` = 1e-5 relative to its
  norm (max |onnx - torch| / ||torch||, and the same after L2 normalisation: the measure of the
  API's equality checks).  An absolute bound failed on the demo model whose embeddings have norms
  of 60-80: 1e-4 was passed or not depending on the thread count; the relative error measured
  over torch and onnxruntime thread counts is about 1.2e-6 (docs/benchmarks.md, with its command).
  ``test/deploy/test_export.py`` checks parity on real speech of 0.5-20 s.
* **Both model families.**  ``ecapa_tdnn`` is traced as it runs in PyTorch (espnet2's modules
  with spkflow's frame masks: masks, masked means and the attentive pooling's length mask are
  ordinary tensor ops).  ``dvector_lstm`` cannot be traced as is: ONNX's ``LSTM`` operator has no
  output projection (torch's exporter refuses ``proj_size``), and the sliding-window inference
  picks windows with Python loops over the lengths.  :class:`DVectorOnnx` computes the same
  function with tensor ops: the projected LSTM recurrence is a TorchScript loop that the
  exporter turns into an ONNX ``Loop`` over the (dynamic) time axis, and the windows of every
  utterance are gathered at once with a weight per window, so the graph is pure ONNX (no
  TorchScript is needed at run time).
* The file appears atomically; the exporter is torch's TorchScript-based one (``dynamo=False``):
  it needs no ``onnxscript`` and handles the scripted loop.

Anchors: ESPnet has no ONNX export for speaker models (``espnet_onnx`` covers ASR/TTS).
WeSpeaker's ``wespeaker/bin/export_onnx.py`` exports ``feats [B, T, F] -> embs`` with dynamic
batch and time axes but no lengths input (a padded batch gives padded utterances other
embeddings, so batch 1 is the safe use), keeps the fbank options out of the file, and does not
compare the result with PyTorch.  SpeechBrain has no export script.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spkflow.core.atomic import umask
from spkflow.core.extras import install_hint
from spkflow.nnet.models import DVectorLSTM, EcapaTdnn, SpeakerEmbedder, lengths_to_mask

__all__ = ["DVectorOnnx", "ExportError", "check_inputs", "exportable", "export_onnx", "max_diff", "OPSET", "TOL"]

#: ONNX opset: 17 is read by every onnxruntime since 1.11 and has all the operators used
OPSET = 17
#: largest accepted |onnxruntime - torch| / ||torch|| per embedding (docs/benchmarks.md: measured 1.2e-6)
TOL = 1e-5
INPUTS = ("feats", "lengths")
OUTPUT = "embedding"


class ExportError(RuntimeError):
    """The model cannot be exported, or the exported graph does not reproduce PyTorch."""


def _lstm_layer_eager(x: Tensor, w_ih: Tensor, w_hh: Tensor, bias: Tensor, w_hr: Tensor) -> Tensor:
    """One LSTM layer (torch's gate order i, f, g, o; optional projection ``w_hr``) over all
    frames: ``[B, T, I] -> [B, T, P]``.  Causal, so the outputs at valid frames do not depend
    on padding after them."""
    gx = torch.matmul(x, w_ih.t()) + bias
    hsz = w_ih.size(0) // 4
    h = torch.zeros(x.size(0), w_hr.size(0), dtype=x.dtype, device=x.device)
    c = torch.zeros(x.size(0), hsz, dtype=x.dtype, device=x.device)
    outs: list[Tensor] = []
    for t in range(x.size(1)):
        g = gx[:, t] + torch.matmul(h, w_hh.t())
        i = torch.sigmoid(g[:, :hsz])
        f = torch.sigmoid(g[:, hsz : 2 * hsz])
        gg = torch.tanh(g[:, 2 * hsz : 3 * hsz])
        o = torch.sigmoid(g[:, 3 * hsz :])
        c = f * c + i * gg
        h = torch.matmul(o * torch.tanh(c), w_hr.t())
        outs.append(h)
    return torch.stack(outs, 1)


@functools.cache
def _lstm_layer() -> Any:
    """:func:`_lstm_layer_eager` scripted (once, on first use), so that the exporter writes its
    time loop as an ONNX ``Loop``.  torch 2.12 calls ``torch.jit.script`` deprecated; it is the
    way the TorchScript-based exporter takes a loop, and the ONNX file does not depend on it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(_lstm_layer_eager)


class _Forward(nn.Module):
    """``model(feats, lengths)`` as the exported function (ECAPA: traced as it is)."""

    def __init__(self, model: SpeakerEmbedder) -> None:
        super().__init__()
        self.model = model

    def forward(self, feats: Tensor, lengths: Tensor) -> Tensor:
        return self.model(feats, lengths)


class DVectorOnnx(nn.Module):
    """:class:`~spkflow.nnet.models.DVectorLSTM` in eval mode, with tensor ops only (see the module doc).

    Windows: utterance ``b`` of ``n`` frames has windows of ``w = min(n, win)`` frames at
    ``0, hop, 2 hop, ...`` up to ``n - w`` and one more ending at the last frame when
    ``(n - w) % hop != 0``; all are gathered into a ``[B, K + 1, w_max]`` block with weight 1
    for real windows and 0 for filler, and the embedding is the weighted mean of their
    L2-normalised last outputs: the model's own rule, without Python loops.
    """

    def __init__(self, model: DVectorLSTM) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("eye", torch.eye(model.lstm.hidden_size))

    def _last(self, x: Tensor, lengths: Tensor) -> Tensor:
        lstm = self.model.lstm
        for k in range(lstm.num_layers):
            w_hr = getattr(lstm, f"weight_hr_l{k}") if lstm.proj_size else self.eye
            bias = getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}")
            x = _lstm_layer()(x, getattr(lstm, f"weight_ih_l{k}"), getattr(lstm, f"weight_hh_l{k}"), bias, w_hr)
        return x[torch.arange(x.size(0), device=x.device), (lengths - 1).clamp(min=0)]

    def forward(self, feats: Tensor, lengths: Tensor) -> Tensor:
        m = self.model
        x = (feats - m.input_mean) / m.input_std if m.input_norm == "global" else feats
        t = x.shape[1]
        x = x * lengths_to_mask(lengths, t)[:, :, None].to(x.dtype)
        if m.infer_window <= 0:
            return self._last(x, lengths)
        win, hop = m.infer_window, m.infer_hop
        w = lengths.clamp(max=win)
        count = torch.div(lengths - w, hop, rounding_mode="floor") + 1
        extra = ((lengths - w) % hop != 0).to(x.dtype)
        ks = torch.arange(count.max(), device=x.device)
        starts = torch.cat([ks[None, :] * hop + torch.zeros_like(lengths)[:, None], (lengths - w)[:, None]], 1)
        weights = torch.cat([(ks[None, :] < count[:, None]).to(x.dtype), extra[:, None]], 1)
        idx = (starts[:, :, None] + torch.arange(w.max(), device=x.device)[None, None, :]).clamp(max=t - 1)
        b, nk = x.shape[0], starts.shape[1]
        windows = x[torch.arange(b, device=x.device)[:, None, None], idx].reshape(b * nk, -1, x.shape[2])
        d = F.normalize(self._last(windows, w[:, None].expand(b, nk).reshape(-1)), dim=-1).reshape(b, nk, -1)
        return (d * weights[:, :, None]).sum(1) / weights.sum(1)[:, None]


def exportable(model: SpeakerEmbedder) -> nn.Module:
    """The module to trace for ``model`` (eval mode, CPU)."""
    if isinstance(model, DVectorLSTM):
        return DVectorOnnx(model).eval()
    if isinstance(model, EcapaTdnn):
        return _Forward(model).eval()
    raise ExportError(f"no ONNX export for {type(model).__name__}")


def _check_lengths(model: SpeakerEmbedder) -> list[int]:
    """Test lengths: short, around the d-vector window, long."""
    lens = [7, 150, 401, 1000]
    win = int(getattr(model, "infer_window", 0) or 0)
    if win > 0:
        lens += [win, win + 1, win + int(model.infer_hop) + 3]  # type: ignore[attr-defined]
    return sorted(set(lens))


def check_inputs(
    model: SpeakerEmbedder, seed: int = 0
) -> tuple[tuple[Tensor, Tensor], list[tuple[np.ndarray, np.ndarray]]]:
    """The export's inputs, drawn from ``seed``: the tracing input, and the ``(feats [B, T, F],
    lengths [B])`` batches the written file is checked on (each test length alone, then all of
    them in one padded batch)."""
    rng = np.random.default_rng(seed)
    dim = int(model.input_dim)
    trace_in = (torch.from_numpy(rng.standard_normal((2, 50, dim)).astype(np.float32)), torch.tensor([50, 31]))
    lens = _check_lengths(model)
    batches = [(rng.standard_normal((1, n, dim)).astype(np.float32), np.array([n], dtype=np.int64)) for n in lens]
    padded = rng.standard_normal((len(lens), max(lens), dim)).astype(np.float32)
    batches.append((padded, np.array(lens[::-1], dtype=np.int64)))
    return trace_in, batches


def _run_torch(model: SpeakerEmbedder, feats: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(feats), torch.from_numpy(lengths)).numpy()


def max_diff(
    session: Any, model: SpeakerEmbedder, batches: Sequence[tuple[np.ndarray, np.ndarray]]
) -> tuple[float, float]:
    """(relative, absolute) largest difference between onnxruntime and torch over ``(feats [B, T, F],
    lengths [B])`` batches.  Relative: per embedding, max |onnx - torch| / ||torch||, or the max
    difference after L2 normalisation when larger."""
    rel = absolute = 0.0
    for feats, lengths in batches:
        got = session.run([OUTPUT], {"feats": feats.astype(np.float32), "lengths": lengths.astype(np.int64)})[0]
        want = _run_torch(model, feats, lengths).astype(np.float64)
        got = got.astype(np.float64)
        diff = np.abs(got - want)
        norm = np.maximum(np.linalg.norm(want, axis=-1), 1e-12)
        unit = np.abs(got / np.maximum(np.linalg.norm(got, axis=-1, keepdims=True), 1e-12) - want / norm[:, None])
        absolute = max(absolute, float(diff.max()))
        rel = max(rel, float((diff.max(axis=-1) / norm).max()), float(unit.max()))
    return rel, absolute


def _session(path: str | os.PathLike[str]) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(os.fspath(path), opts, providers=["CPUExecutionProvider"])


def export_onnx(
    model: SpeakerEmbedder,
    out: str | os.PathLike[str],
    *,
    config: dict[str, Any] | None = None,
    opset: int = OPSET,
    tol: float = TOL,
    seed: int = 0,
) -> tuple[float, float]:
    """Write ``model`` (eval, moved to CPU) to the ONNX file ``out`` and check it (see the module
    doc).  ``config``: the model's ``config.yaml``, whose ``frontend`` and ``model`` sections go
    into the metadata.  Returns the largest (relative, absolute) difference seen (:func:`max_diff`).
    Raises :class:`ExportError` (and leaves no file) when the relative one exceeds ``tol``."""
    try:
        import onnx
    except ImportError as exc:
        raise ExportError(f"ONNX export needs onnx and onnxruntime: {install_hint('export')} ({exc})") from None
    model = model.cpu().eval()
    module = exportable(model)
    trace_in, batches = check_inputs(model, seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # TracerWarnings about shape checks that are constant per trace
            torch.onnx.export(
                module,
                trace_in,
                tmp,
                dynamo=False,
                input_names=list(INPUTS),
                output_names=[OUTPUT],
                dynamic_axes={"feats": {0: "batch", 1: "time"}, "lengths": {0: "batch"}, OUTPUT: {0: "batch"}},
                opset_version=opset,
            )
        proto = onnx.load(tmp)
        meta = {
            "spkflow.model": json.dumps((config or {}).get("model") or {}),
            "spkflow.frontend": json.dumps((config or {}).get("frontend") or {}),
            "spkflow.embed_dim": str(int(model.embed_dim)),
            "spkflow.inputs": "feats: float32 [batch, time, feat_dim] frontend output (fbank, VAD, mean norm); "
            "lengths: int64 [batch] valid frames",
        }
        for k, v in meta.items():
            proto.metadata_props.add(key=k, value=v)
        onnx.checker.check_model(proto)
        onnx.save(proto, tmp)
        session = _session(tmp)
        worst, absolute = max_diff(session, model, batches)
        if not worst <= tol:
            raise ExportError(
                f"onnxruntime output differs from PyTorch by {worst:.3g} of the embedding's norm (> {tol:g}; "
                f"{absolute:.3g} absolute): not written"
            )
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return worst, absolute
