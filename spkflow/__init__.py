"""spkflow: an ESPnet-style recipe toolkit for speaker embedders.

The package is grouped by stage, in layers: a module may import from its own package and from
the packages before it in :data:`LAYERS`, never from one after it (``test/test_layout.py``
checks this, with no import circle, on every import, lazy ones included).

========  ==========================================================================
core      errors, atomic writes, locks, processes, Kaldi option files, config checks
data      Kaldi data dirs (tables, checks, fix / subset / combine), audio, arks, jobs
corpora   corpus preparation (stage 1)
features  fbank, VAD and the feature jobs (stage 2)
augment   augmentation of fbank crops and audio crops, and its sources
nnet      models, losses, checkpoints
score     scoring, backends, metrics, evaluation, plots, speaker identification (stage 6)
embed     embedding extraction from spkflow and ESPnet models (stage 5)
train     batch plans (stage 3), config, loaders, trainer (stage 4)
deploy    pack, ONNX export and runtime (stage 7)
diar      diarization: RTTM, speech regions, windows, clustering, DER / JER; in memory, over the
          recipe's recording dirs, over a list of files
sim       tooling: simulated conversations, the test data of the diarization recipes and tests
api       :class:`Embedder`, the Python face
bin       the commands, ``python -m spkflow.bin.NAME``
========  ==========================================================================

A tooling package (:data:`TOOLING`) makes data for recipes, tests and benchmarks: only the
commands import it, never a library layer (``test/test_layout.py`` checks this too).

Nothing heavy is imported at package import time: ``from spkflow import Embedder`` loads
:mod:`spkflow.api` (numpy only) when first asked for, and torch is imported only when a model
is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spkflow.core.version import __version__

__all__ = ["Embedder", "LAYERS", "TOOLING", "__version__"]

#: The packages from the bottom up; a module imports only from its own layer and those below.
LAYERS = (
    "core",
    "data",
    "corpora",
    "features",
    "augment",
    "nnet",
    "score",
    "embed",
    "train",
    "deploy",
    "diar",
    "sim",
    "api",
    "bin",
)

#: The layers that are tooling, not library: imported by ``bin`` only.
TOOLING = ("sim",)

if TYPE_CHECKING:
    from spkflow.api import Embedder


def __getattr__(name: str) -> Any:
    if name == "Embedder":
        from spkflow.api import Embedder

        return Embedder
    raise AttributeError(f"module 'spkflow' has no attribute {name!r}")
