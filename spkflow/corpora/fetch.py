"""Find a corpus folder, or fetch its public git release: the first step of corpus preparation.

Guarantees of :func:`ensure_corpus`:

* a folder that holds the corpus's marker (e.g. ``recordings/`` for FSDD) is used as it is;
* a folder that exists, is not empty and lacks the marker is an error (a wrong copy is never
  "repaired" by downloading over it);
* a missing folder is cloned from the public release only when asked (``download``), bounded in
  time: a reachability probe limited to ``timeout`` seconds first (a machine without network
  fails in seconds), the clone goes to ``<dir>.download.<pid>`` and is renamed only when
  complete, so an interrupted download leaves nothing that looks like a corpus;
* every failure says which db.sh variable to point at a copy (``export VAR=/path``).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)


class CorpusNotFound(FileNotFoundError):
    """The corpus folder is missing or is not a copy of the corpus; the message says what to set."""


def _hint(var: str, path: Path, url: str | None) -> str:
    msg = (
        f"corpus not found at {var}={path}. Point {var} at a copy of the corpus: export {var}=/path/to/copy "
        "before running, or edit db.sh (egs/TEMPLATE/spk1/db.sh)"
    )
    return msg + (f"; the public release is {url}" if url else "")


def ensure_corpus(
    corpus_dir: str | os.PathLike[str],
    marker: str,
    var: str,
    url: str | None = None,
    download: bool = False,
    timeout: float = 30.0,
) -> Path:
    """Return ``corpus_dir`` once ``corpus_dir/marker`` exists (see the module docstring)."""
    root = Path(corpus_dir)
    if (root / marker).exists():
        return root
    if root.is_dir() and any(root.iterdir()):
        raise CorpusNotFound(f"{var}={root} exists but has no {marker}: is it a copy of the corpus?")
    if download and url:
        tmp = root.with_name(f"{root.name}.download.{os.getpid()}")
        log.info("%s=%s not found: trying to download %s (connect timeout %ss)", var, root, url, timeout)
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        try:
            if shutil.which("git") is None:
                raise OSError("git not found")
            subprocess.run(["git", "ls-remote", url, "HEAD"], env=env, timeout=timeout, check=True, capture_output=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["git", "-c", "http.lowSpeedLimit=1000", "-c", f"http.lowSpeedTime={int(timeout)}", "clone"]
                + ["--depth", "1", "--quiet", url, str(tmp)],
                env=env,
                check=True,
                capture_output=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("download of %s failed (no network, or the host is unreachable): %s", url, exc)
        else:
            if root.is_dir():
                root.rmdir()
            os.replace(tmp, root)
            if (root / marker).exists():
                log.info("downloaded %s to %s", url, root)
                return root
            raise CorpusNotFound(f"the download of {url} in {root} has no {marker}")
    raise CorpusNotFound(_hint(var, root, url))
