"""Checkpoint files (``checkpoint.pth``, ``epoch<E>.pth``, ``epoch<E>.loss.pth``, ``model.pth``,
``loss.pth``): write atomically, load safely.

What it guarantees
------------------
* :func:`save_checkpoint` writes with ``torch.save`` to a temporary file beside the target,
  fsyncs and renames it (:mod:`spkflow.core.atomic`): a killed or failed write (a full disk
  included) leaves the previous file, never a prefix of the new one; a failed write is one
  :class:`CheckpointError` line naming the file and why (torch's own error names none).
* :func:`load_checkpoint` loads with ``weights_only=True`` (tensors and plain containers;
  nothing in the file is executed) onto the CPU and returns the dict.  Every failure is a
  :class:`CheckpointError` (an :class:`~spkflow.core.errors.InputError`) whose message names the
  file, says what is wrong with it and what to do:

  - a truncated, empty or otherwise unreadable file (torch's "PytorchStreamReader failed ...",
    ``EOFError``, a bad magic number): ``<file>: unreadable or truncated checkpoint; ...``;
  - a file holding pickled Python objects (classes, functions: code that ``torch.load``
    would have to run): ``<file> holds pickled Python objects (code), refused; spkflow
    checkpoints hold tensors only``.  It never suggests ``weights_only=False``;
  - a file that loads but is not a dict (a bare tensor, a list).
* :func:`restore` puts a loaded checkpoint's entries into the model, loss, optimizer and
  scheduler; an entry that is missing or does not fit (the config changed since the
  checkpoint was written) is a :class:`CheckpointError` naming the file, the entry and the
  first mismatch.

Compared with the anchors (ESPnet's ``torch.load`` calls; WeSpeaker's
``wespeaker/utils/checkpoint.py``, which loads with ``strict=False``: missing or unexpected
weights only log a warning), which pass torch's traceback through (naming no
file, and, since PyTorch 2.6, inviting the reader to retry with ``weights_only=False``), the
error here is one line a stage script can print as it is.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "restore", "default_hint"]

#: What torch's weights-only unpickler says when the pickle names a global it does not allow
#: (a class or function of some module: loading it would import and run code).
_CODE_RE = re.compile(r"\bGLOBAL\b|Unsupported global")


class CheckpointError(InputError):
    """A checkpoint that cannot be loaded; the message names the file and what to do."""

    def __init__(self, path: str | os.PathLike[str], message: str) -> None:
        super().__init__(path, None, message)


def default_hint(path: str | os.PathLike[str]) -> str:
    """What to do about a bad file, from its name (the files stage 4 writes)."""
    name = os.path.basename(os.fspath(path))
    if name == "checkpoint.pth":
        return "remove it, or re-run stage 4 with --resume false to train afresh"
    if re.fullmatch(r"epoch\d+(\.loss)?\.pth", name):
        return "re-run stage 4 with --resume false to train afresh"
    if name in ("model.pth", "loss.pth"):
        return "re-run stage 4 (it rebuilds model.pth from the epoch snapshots) or pass --resume false"
    return "re-run stage 4 or pass --resume false"


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """``torch.save`` ``state`` (as a dict; a state dict keeps its type) to a temporary file
    beside ``path``, fsync, rename.  A failed write (a full disk: torch's writer raises
    ``RuntimeError``, the file system ``OSError``) is a :class:`CheckpointError` naming ``path``,
    saying why and that the file under that name, if any, is the previous one, intact."""
    import torch

    try:
        with atomic_write(path, "wb") as f:
            torch.save(state if isinstance(state, dict) else dict(state), f)
    except (OSError, RuntimeError) as err:
        raise CheckpointError(
            path,
            f"cannot write it ({_write_failure(err, path, _tensor_bytes(state))}); the file under this name, if "
            "any, is the previous one, intact: free some space and run again (stage 4 resumes from checkpoint.pth)",
        ) from None


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in ``obj`` (nested dicts, lists and tuples): about what torch.save writes."""
    if isinstance(obj, Mapping):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    nbytes = getattr(obj, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int) else 0


def _write_failure(err: BaseException, path: str | os.PathLike[str], size: int) -> str:
    """Why a write failed, with the size to write and the free space left where it was written."""
    if isinstance(err, OSError) and err.strerror:
        why = err.strerror
    else:  # torch's writer: "[enforce fail at inline_container.cc:N] . unexpected pos ..." and the like
        why = "the write failed: " + str(err).strip().splitlines()[0].split("] . ")[-1][:120]
    try:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        why += f"; about {size / 2**20:.1f} MiB to write, {free / 2**20:.1f} MiB free on its file system"
    except OSError:
        pass
    return why


def load_checkpoint(path: str | os.PathLike[str], *, hint: str | None = None) -> dict[str, Any]:
    """Load ``path`` with ``weights_only=True`` onto the CPU; returns the dict it holds.

    Raises :class:`CheckpointError` naming ``path`` when the file is missing, unreadable or
    truncated, holds pickled Python objects, or is not a dict.  ``hint`` (what the user should
    do about a bad file) defaults to :func:`default_hint`.
    """
    import torch

    path = os.fspath(path)
    todo = hint if hint is not None else default_hint(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; torch reads from it
    except FileNotFoundError:
        raise CheckpointError(path, "no such file") from None
    except OSError as err:
        raise CheckpointError(path, f"cannot read: {err.strerror or err}") from None
    try:
        if os.fstat(f.fileno()).st_size == 0:
            raise CheckpointError(path, f"unreadable or truncated checkpoint (empty file); {todo}")
        with warnings.catch_warnings():  # torch warns about the pickle protocol of files it then refuses
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            state = torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if _CODE_RE.search(str(err)):
            raise CheckpointError(
                path, "holds pickled Python objects (code), refused; spkflow checkpoints hold tensors only"
            ) from None
        raise CheckpointError(path, f"unreadable or truncated checkpoint (not a torch.save file?); {todo}") from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError, zipfile.BadZipFile) as err:
        # OSError here is torch reading past the end of a cut file (EINVAL), not the open
        raise CheckpointError(path, f"unreadable or truncated checkpoint ({_why(err)}); {todo}") from None
    finally:
        f.close()
    if not isinstance(state, dict):
        raise CheckpointError(path, f"holds a {type(state).__name__}, not a dict of tensors; {todo}")
    return state


def restore(
    path: str | os.PathLike[str],
    state: Mapping[str, Any],
    targets: Mapping[str, Any],
    *,
    required: tuple[str, ...] = (),
    hint: str | None = None,
) -> None:
    """``targets[k].load_state_dict(state[k])`` for every k (modules, optimizers, schedulers),
    after checking that ``state`` has every key of ``targets`` and ``required``.

    A missing entry, or one that does not fit (a model or optimizer built from a config that
    changed since the checkpoint was written), is a :class:`CheckpointError` naming ``path``
    and the entry, where torch raises a bare ``RuntimeError`` / ``ValueError``.
    """
    todo = hint if hint is not None else default_hint(path)
    missing = [k for k in (*targets, *required) if k not in state]
    if missing:
        raise CheckpointError(path, f"no {', '.join(map(repr, missing))} in it (not a training checkpoint?); {todo}")
    for key, target in targets.items():
        try:
            target.load_state_dict(state[key])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                path,
                f"its {key!r} does not fit the one built from the current config ({_mismatch(err)}); "
                f"was the config changed since? {todo}",
            ) from None


def _mismatch(err: BaseException) -> str:
    """The first problem torch's ``load_state_dict`` lists (it lists all, one per line)."""
    lines = [x.strip() for x in str(err).splitlines() if x.strip()]
    items = lines[1:] if len(lines) > 1 else lines
    first = items[0] if items else type(err).__name__
    first = first.split(". ")[0].rstrip(".")[:200]
    more = sum(x.count("size mismatch for") or 1 for x in items[1:])
    return first + (f"; and {more} more" if more else "")


def _why(err: BaseException) -> str:
    """A short reason from torch's error: its first sentence, without torch's advice."""
    if isinstance(err, (EOFError, OSError)):  # OSError: torch's reader ran past the end (EINVAL)
        return "ends early"
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, KeyError):
        return "not a torch.save file"
    text = text.split(". ")[0].rstrip(".")
    if "weights_only" in text:  # never pass torch's advice to load unsafely along
        return type(err).__name__
    return text[:160]


def load_init(src: str | os.PathLike[str], model: Any, loss: Any) -> str:
    """Fine-tuning (``train.init_from``): load a trained model's weights into ``model`` and, when
    ``src`` is a stage-4 dir, its loss weights (the AAM classifier) into ``loss`` (a loss without
    parameters is skipped): from ``loss.pth``, the classifier of the same epochs as ``model.pth``
    (averaged alike), or, for a run that predates it, from ``checkpoint.pth`` (the last epoch's).
    ``src`` is such a dir or a model.pth.  A missing file, or weights that do not fit, is a
    :class:`CheckpointError` naming the file.  Returns what was loaded, for the log."""
    src = Path(src)
    model_path = src / "model.pth" if src.is_dir() else src
    if not model_path.is_file():
        raise CheckpointError(model_path, "train.init_from: no such file (a stage-4 dir or its model.pth)")
    restore(model_path, {"model": load_checkpoint(model_path)}, {"model": model})
    loaded = str(model_path)
    if not src.is_dir() or not any(True for _ in loss.parameters()):
        return loaded
    hint = (
        "the classifier fits only the same training speakers (and speed factors); "
        "point train.init_from at the model.pth to start the classifier afresh"
    )
    loss_path, ck_path = src / "loss.pth", src / "checkpoint.pth"
    if loss_path.is_file():
        restore(loss_path, {"loss": load_checkpoint(loss_path)}, {"loss": loss}, hint=hint)
        return loaded + f" + the loss's weights of {loss_path} (the epochs of model.pth)"
    if ck_path.is_file():
        restore(ck_path, load_checkpoint(ck_path), {"loss": loss}, hint=hint)
        loaded += f" + the loss's weights of {ck_path} (its last epoch: no loss.pth in {src})"
    return loaded
