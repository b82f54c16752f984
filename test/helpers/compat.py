"""Work-arounds for third-party behaviour that breaks the test run itself (not spkflow).

SpeechBrain 1.1.2's ``import speechbrain`` puts redirects of its deprecated module paths into
``sys.modules`` (``speechbrain.k2_integration`` -> ``speechbrain.integrations.k2_fsa`` ...).  They
are lazy: reading any attribute imports the target, and for k2 (not installed) that raises
ImportError.  Hypothesis scans every module in ``sys.modules`` for its ``__file__`` (at collection
and before each property-test input), so once SpeechBrain is imported every property test after it
errors.  :func:`settle_speechbrain_redirects` gives the unloaded redirects ``__file__ = None``
(what a built-in module has): nothing imports through them, and hypothesis skips them.
"""

from __future__ import annotations

import sys

__all__ = ["settle_speechbrain_redirects"]


def settle_speechbrain_redirects() -> int:
    """Mark SpeechBrain's unloaded lazy modules in ``sys.modules`` as file-less; returns how many."""
    if "speechbrain" not in sys.modules:
        return 0
    from speechbrain.utils.importutils import LazyModule

    n = 0
    for module in list(sys.modules.values()):
        if isinstance(module, LazyModule) and module.lazy_module is None and "__file__" not in vars(module):
            module.__file__ = None  # type: ignore[assignment]
            n += 1
    return n
