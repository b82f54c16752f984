"""A ``cmd |`` entry of a wav.scp read as a Kaldi table: the command run, its output decoded.

Only :mod:`spkflow.data.audio` calls this, and only for a wav.scp read as a Kaldi table (its
"Who may run commands"): a path a user types is never run.  It guarantees that a failing
command is an :class:`~spkflow.core.errors.UtteranceError` naming the utterance, the command,
its exit status and the tail of its stderr, and that a WAV streamed to a pipe with 0 in its
RIFF/data sizes (a writer that could not seek back), which libsndfile alone reads as empty
audio, is read whole (``test/data/test_audio.py``).
"""

from __future__ import annotations

import io
import struct
import subprocess

import numpy as np
import soundfile as sf

from spkflow.core.errors import UtteranceError

__all__ = ["decode_output", "fix_streamed_wav", "is_pipe", "pipe_command", "run_pipe"]

_STDERR_TAIL = 2000


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
    try:
        proc = subprocess.run(command, shell=True, capture_output=True, stdin=subprocess.DEVNULL, check=False)
    except OSError as exc:
        raise UtteranceError(utt, f"{command} |", f"cannot start command: {exc}") from exc
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
        raise UtteranceError(
            utt,
            f"{command} |",
            f"command failed with exit code {proc.returncode}" + (f"; stderr: {err}" if err else "; no stderr"),
        )
    if not proc.stdout:
        raise UtteranceError(utt, f"{command} |", "command wrote no audio to stdout")
    return proc.stdout
