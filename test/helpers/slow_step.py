"""A training step (or a validation, or a checkpoint write) that is under way when a signal comes,
whatever the load of the machine: in the processes a test starts (the trainer under run.pl,
train.sh, run.sh), a ``sitecustomize`` module on PYTHONPATH makes the K-th call of a function or
method sleep, after it has run (``after``) or before (``before``), having written a marker file.
Nothing in spkflow knows about it.

    env = slow_env(tmp_path, [Slow("spkflow.train.build", "Objective.forward", 3, marker)])

``Objective.forward`` K: step K of that process (counted from 1) is in progress, its forward
pass done (the BatchNorm statistics updated, the weights not yet); ``Validator.eer`` (in
``spkflow.train.validation``) K: the K-th validation, after the epoch's last step;
``save_checkpoint`` (in ``spkflow.train.trainer``) K, ``before``: the K-th checkpoint write takes
``seconds`` longer.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

SITE = """
import os

_spec = os.environ.get("SPKFLOW_TEST_SLOW")
if _spec:
    import importlib.abc
    import importlib.util
    import sys
    import time

    _slow = {}
    for _one in _spec.split(";"):
        _module, _attr, _at, _marker, _seconds, _when = _one.split("|")
        _slow.setdefault(_module, []).append((_attr, int(_at), _marker, float(_seconds), _when))

    def _slowed(real, at, marker, seconds, when):
        calls = [0]

        def slow(*args, **kwargs):
            calls[0] += 1
            hit = calls[0] == at
            if hit and when == "before":
                with open(marker, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(seconds)
            out = real(*args, **kwargs)
            if hit and when == "after":
                with open(marker, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(seconds)
            return out

        return slow

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name not in _slow:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                for attr, at, marker, seconds, when in _slow[name]:
                    owner, _, fn = attr.rpartition(".")
                    obj = getattr(module, owner) if owner else module
                    setattr(obj, fn, _slowed(getattr(obj, fn), at, marker, seconds, when))

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
"""


@dataclasses.dataclass(frozen=True)
class Slow:
    """The ``at``-th call of ``module``'s ``attr`` (``Class.method`` or ``function``) writes
    ``marker`` and sleeps ``seconds``, ``after`` or ``before`` running."""

    module: str
    attr: str
    at: int
    marker: Path
    seconds: float = 3600.0
    when: str = "after"


def slow_env(tmp: Path, slow: list[Slow], env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the sitecustomize above on PYTHONPATH, set up for ``slow``."""
    site = tmp / "slow_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [e.get("PYTHONPATH"), str(site)]))
    e["SPKFLOW_TEST_SLOW"] = ";".join(f"{s.module}|{s.attr}|{s.at}|{s.marker}|{s.seconds}|{s.when}" for s in slow)
    return e
