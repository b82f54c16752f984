"""spkflow: an ESPnet-style recipe toolkit for speaker embedders.

Modules do one thing each and import nothing heavy at package import time: ``from spkflow
import Embedder`` loads :mod:`spkflow.api` (numpy only) when first asked for, and torch is
imported only when a model is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Embedder", "__version__"]

if TYPE_CHECKING:
    from spkflow.api import Embedder


def __getattr__(name: str) -> Any:
    if name == "Embedder":
        from spkflow.api import Embedder

        return Embedder
    raise AttributeError(f"module 'spkflow' has no attribute {name!r}")
