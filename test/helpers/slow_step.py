"""A training step (or a validation) that is under way when a signal comes, whatever the load of the
machine: in the processes a test starts (the trainer under run.pl, train.sh, run.sh), a
``sitecustomize`` module on PYTHONPATH makes the K-th call of one method stop after it has run,
write a marker file and sleep for an hour.  Nothing in spkflow knows about it.

    env = slow_env(tmp_path, "spkflow.train.build", "Objective.forward", 3, marker)

``Objective.forward`` K: step K of that process (counted from 1) is in progress, its forward
pass done (the BatchNorm statistics updated, the weights not yet); ``Validator.eer`` (in
``spkflow.train.validation``) K: the K-th validation, after the epoch's last step.
"""

from __future__ import annotations

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

    _module, _method, _at, _marker = _spec.split(":", 3)
    _cls, _name = _method.split(".")

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != _module:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                cls = getattr(module, _cls)
                real = getattr(cls, _name)
                calls = [0]

                def slow(self, *args, **kwargs):
                    out = real(self, *args, **kwargs)
                    calls[0] += 1
                    if calls[0] == int(_at):
                        with open(_marker, "w") as f:
                            f.write(str(os.getpid()))
                        time.sleep(3600)
                    return out

                setattr(cls, _name, slow)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
"""


def slow_env(tmp: Path, module: str, method: str, at: int, marker: Path, env: dict[str, str] | None = None) -> dict:
    """``env`` (default: this process's) with the sitecustomize above on PYTHONPATH, set to stop the
    ``at``-th call of ``module``'s ``method`` (``Class.name``) and write ``marker``."""
    site = tmp / "slow_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [e.get("PYTHONPATH"), str(site)]))
    e["SPKFLOW_TEST_SLOW"] = f"{module}:{method}:{at}:{marker}"
    return e
