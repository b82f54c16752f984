"""The formats libsndfile does not read (m4a, mp4, aac, wma, webm), decoded by the ffmpeg binary of
the pinned PyPI package ``imageio-ffmpeg``: one place for the binary, its arguments and its probe,
shared by data dirs (a ``wav.scp`` pipe, :func:`ffmpeg_pipe`) and by files named directly
(:func:`decode_file`, what :func:`spkflow.data.audio.read_audio` calls for these extensions).

What it guarantees
------------------
* **One decoding for every entry point.**  A file given by path (``verify a.m4a b.m4a``,
  ``identify x.m4a``, ``Embedder.embed_file``) is decoded with the arguments of the ``wav.scp``
  pipe ``make_data_dir`` and the VoxCeleb2 recipe write (mono 16-bit WAV, ffmpeg's channel
  downmix), at its native rate, so it gives stage 5's samples (``test/data/test_audio.py``).
* No shell: the path is passed as one argument, so spaces and quotes in names are safe.
* A failure names the file and carries ffmpeg's own last line of stderr.

Anchor: Kaldi's and WeSpeaker's VoxCeleb2 preparation (``ffmpeg ... |`` in ``wav.scp``) and
torchaudio's ffmpeg backend (an in-process library build).  Here the binary comes with the
Python environment, and data dirs and single files share its arguments.
"""

from __future__ import annotations

import re
import shlex
import subprocess

from spkflow.core.errors import InputError, UtteranceError

__all__ = ["FFMPEG_ARGS", "FFMPEG_EXTENSIONS", "decode_file", "default_ffmpeg", "ffmpeg_pipe", "probe_ffmpeg"]

#: decoded by ffmpeg (a wav.scp pipe in a data dir; :func:`decode_file` for a file named directly)
FFMPEG_EXTENSIONS = (".m4a", ".mp4", ".aac", ".wma", ".webm")
#: ffmpeg arguments of a wav.scp pipe: mono 16-bit WAV at {rate} Hz on stdout
FFMPEG_ARGS = "-nostdin -v error -i {path} -f wav -acodec pcm_s16le -ac 1 -ar {rate} - |"

_FF_RATE = re.compile(r"Audio: .*?(\d+) Hz")
_FF_DUR = re.compile(r"Duration: (\d+):(\d\d):(\d\d(?:\.\d+)?)")
_STDERR_TAIL = 2000


def default_ffmpeg() -> str:
    """The ffmpeg binary of the pinned ``imageio-ffmpeg``."""
    try:
        import imageio_ffmpeg
    except ImportError:
        raise FileNotFoundError(
            f"{', '.join(FFMPEG_EXTENSIONS)} files need ffmpeg: install the pinned imageio-ffmpeg (tools/setup.sh) "
            "or pass --ffmpeg PATH"
        ) from None
    return imageio_ffmpeg.get_ffmpeg_exe()


def ffmpeg_pipe(exe: str, path: str, rate: int = 16000) -> str:
    """A wav.scp pipe entry: ``path`` (``-``: standard input) decoded by the ffmpeg binary ``exe``
    to mono 16-bit WAV at ``rate`` Hz."""
    return f"{shlex.quote(exe)} " + FFMPEG_ARGS.format(path=shlex.quote(str(path)), rate=int(rate))


def probe_ffmpeg(exe: str, path: str) -> tuple[int, float]:
    """(native rate, seconds) of a file ffmpeg decodes, from its stream header (``ffmpeg -i``,
    no decoding).  :class:`InputError` naming the file when ffmpeg finds no audio stream."""
    try:
        proc = subprocess.run(
            [exe, "-hide_banner", "-nostdin", "-i", path], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(path, None, f"cannot run ffmpeg ({exe}): {exc}") from None
    rate, dur = _FF_RATE.search(proc.stderr), _FF_DUR.search(proc.stderr)
    if rate is None or dur is None:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise InputError(path, None, f"ffmpeg finds no audio stream: {tail[0]}")
    h, m, sec = dur.groups()
    return int(rate.group(1)), int(h) * 3600 + int(m) * 60 + float(sec)


def is_ffmpeg_file(spec: str) -> bool:
    """Whether a wav.scp entry is a plain file of an extension only ffmpeg decodes."""
    s = spec.strip()
    return not s.endswith("|") and s.lower().endswith(FFMPEG_EXTENSIONS)


def decode_file(path: str, utt: str) -> bytes:
    """WAV bytes (mono, 16-bit, the file's own rate) of ``path`` decoded by ffmpeg, as the
    ``wav.scp`` pipe of :func:`ffmpeg_pipe` decodes it; :class:`UtteranceError` naming the file."""
    try:
        exe = default_ffmpeg()
    except FileNotFoundError as exc:
        raise UtteranceError(utt, path, str(exc)) from None
    args = FFMPEG_ARGS.removesuffix(" - |").split()
    cmd = [exe, *(path if a == "{path}" else a for a in args if a not in ("-ar", "{rate}")), "-"]
    try:
        proc = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, check=False)
    except OSError as exc:
        raise UtteranceError(utt, path, f"cannot run ffmpeg ({exe}): {exc}") from None
    if proc.returncode != 0 or not proc.stdout:
        err = proc.stderr.decode("utf-8", "replace").strip()[-_STDERR_TAIL:] or "no stderr"
        raise UtteranceError(utt, path, f"ffmpeg cannot decode it (exit code {proc.returncode}): {err}")
    return proc.stdout
