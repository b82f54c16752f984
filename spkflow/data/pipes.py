"""A ``cmd |`` entry of a wav.scp read as a Kaldi table: the command run, its output decoded.

Only :mod:`spkflow.data.audio` calls this, and only for a wav.scp read as a Kaldi table (its
"Who may run commands"): a path a user types is never run.  It guarantees that a failing
command is an :class:`~spkflow.core.errors.UtteranceError` naming the utterance, the command,
its exit status and the tail of its stderr, and that a WAV streamed to a pipe with 0 in its
RIFF/data sizes (a writer that could not seek back), which libsndfile alone reads as empty
audio, is read whole (``test/data/test_audio.py``).

A command does not outlive its reader.  It runs in a process group of its own, under a shell
that the kernel signals when the reader dies (``PR_SET_PDEATHSIG``, Linux) and that then kills
that whole group: a job SIGKILLed by the OOM killer or a scheduler takes its workers with it
(:func:`spkflow.core.procs.die_with_parent`) and their commands with them, a pipeline included
(``cmd1 | cmd2 |``), however long the command would still have run.  A reader that stops by an
exception (Ctrl-C) kills the group before it raises.  Kaldi's ``popen`` and Python's
``subprocess`` leave a command running when its reader is killed.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import soundfile as sf

from spkflow.core.errors import UtteranceError

__all__ = ["decode_output", "fix_streamed_wav", "is_pipe", "pipe_command", "run_pipe"]

_STDERR_TAIL = 2000
#: The shell around a command: it runs the command (its ``$0``, never part of this script) in the
#: background so that its ``wait`` returns at a signal, and at SIGHUP, which the kernel sends it
#: when its reader dies, kills its process group, the command's every process with it.
_GUARD = 'trap "kill -KILL 0" HUP; eval "$0" & wait $!'
_PR_SET_PDEATHSIG = 1


@functools.cache
def _guard_start() -> tuple[list[str], Callable[[], None] | None]:
    """How the guard is started with SIGHUP at its reader's death: through util-linux's
    ``setpriv --pdeathsig`` where it has it (1 ms a command more than a plain ``sh -c``), else by
    ``prctl`` between fork and exec, which makes Python fork instead of vfork (2-4 ms more, growing
    with the reader's memory; ``test/bench/bench_pipes.py``); neither off Linux."""
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        probe = subprocess.run([setpriv, "--pdeathsig", "HUP", "true"], capture_output=True, check=False)
        if probe.returncode == 0:
            return [setpriv, "--pdeathsig", "HUP"], None
    if not sys.platform.startswith("linux"):
        return [], None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return [], None
    return [], lambda: prctl(_PR_SET_PDEATHSIG, int(signal.SIGHUP), 0, 0, 0)


def is_pipe(spec: str) -> bool:
    """Whether a wav.scp entry is a command (``cmd |``)."""
    return spec.rstrip().endswith("|")


def pipe_command(spec: str) -> str:
    """The command of a ``cmd |`` entry."""
    return spec.rstrip()[:-1].strip()


def fix_streamed_wav(raw: bytes) -> bytes | None:
    """A WAV written to a pipe may carry 0 in its RIFF/data sizes (the writer could not seek
    back).  Return the bytes with the sizes set from the actual length, or None if not such a
    WAV."""
    if len(raw) < 12 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= len(raw):
        cid, size = raw[pos : pos + 4], struct.unpack("<I", raw[pos + 4 : pos + 8])[0]
        if cid == b"data":
            fixed = bytearray(raw)
            fixed[4:8] = struct.pack("<I", min(len(raw) - 8, 0xFFFFFFFF))
            fixed[pos + 4 : pos + 8] = struct.pack("<I", min(len(raw) - pos - 8, 0xFFFFFFFF))
            return bytes(fixed)
        pos += 8 + size + (size & 1)
    return None


def decode_output(raw: bytes, utt: str, source: str) -> tuple[np.ndarray, int]:
    """A command's (or ffmpeg's) audio bytes -> ([frames, channels] float32, rate); a WAV
    streamed with zero sizes is mended (:func:`fix_streamed_wav`)."""
    try:
        data, rate = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
        if data.shape[0] == 0:
            fixed = fix_streamed_wav(raw)
            if fixed is not None:
                data, rate = sf.read(io.BytesIO(fixed), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError/RuntimeError/TypeError
        raise UtteranceError(utt, source, f"cannot decode audio from command output ({len(raw)} bytes): {exc}") from exc
    return data, int(rate)


def run_pipe(command: str, utt: str) -> bytes:
    """Run ``command`` (``sh -c``) and return its stdout; :class:`UtteranceError` naming the
    command when it cannot start, fails (its exit status and the tail of its stderr) or writes nothing."""
    prefix, preexec = _guard_start()
    try:
        proc = subprocess.Popen(
            [*prefix, "/bin/sh", "-c", _GUARD, command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, which the guard kills
            preexec_fn=preexec,
        )
    except OSError as exc:
        raise UtteranceError(utt, f"{command} |", f"cannot start command: {exc}") from exc
    with proc:
        try:
            stdout, stderr = proc.communicate()
        except BaseException:  # Ctrl-C while it runs: the command's whole group, not only the guard
            _kill_group(proc.pid)
            raise
    if proc.returncode != 0:
        err = stderr.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
        raise UtteranceError(
            utt,
            f"{command} |",
            f"command failed with exit code {proc.returncode}" + (f"; stderr: {err}" if err else "; no stderr"),
        )
    if not stdout:
        raise UtteranceError(utt, f"{command} |", "command wrote no audio to stdout")
    return stdout


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # already gone
        pass
