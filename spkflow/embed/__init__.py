"""Stage 5: speaker embeddings of a data dir from any supported model, in parallel batched jobs.

``open`` is the front door: :func:`inspect_model` says what a model path is (toolkit, our dir,
pack or ONNX export, where its files are) and :func:`open_embedder` runs it; everything that
opens a model goes through them.  ``base`` holds the interface every model runs through
(:class:`~spkflow.embed.base.Embedder`), the model files and stamp, and the length-bounded batch
planning; ``masking`` makes encoders that take no lengths blind to a batch's padding; one module
per kind of model: ``native`` spkflow's own, ``packed`` our packs (verified, unpacked once into
a cache), ``exported`` our ONNX exports (onnxruntime, no torch), ``espnet`` ESPnet's speaker
models, ``speechbrain`` SpeechBrain's pretrained folders, ``wespeaker`` WeSpeaker's ONNX exports,
``resemblyzer`` Resemblyzer's pretrained GE2E encoder;
``run`` is one job of stage 5 (resumable, sorted, aligned outputs) and the merge.

May import: ``core``, ``data``, ``features``, ``nnet``, ``score``.
"""

from __future__ import annotations

from spkflow.embed.base import TOOLKITS
from spkflow.embed.open import ModelInfo, detect_toolkit, inspect_model, open_embedder

__all__ = ["ModelInfo", "TOOLKITS", "detect_toolkit", "inspect_model", "open_embedder"]
