"""One run at a time per output directory: a lock file naming its holder.

A stage script (``make_fbank.sh``, ``extract_embeddings.sh``, ``score.sh``) takes the lock of
its output dir once, before it removes or writes anything there, and holds it while its ``nj``
jobs and its merge run (``scripts/lib/jobs.sh``: ``jobs_lock DIR``, through
``python -m spkflow.bin.lock``); Python code can hold one with :func:`hold`.

What it guarantees
------------------
* **Atomic.**  The lock is ``DIR/.spkflow.core.lock``, made complete under a temporary name and
  then hard-linked onto its final name (``link`` fails when the name exists, also on NFS);
  where a file system has no hard links, ``O_CREAT|O_EXCL``.  Two runs can never both hold it.
* **Refusals name the holder**: host, pid, command and start time, e.g.
  ``exp/x/embed/test is in use by another run: pid 4711 on node3 since 2026-11-23T07:12:09
  (scripts/spk/extract_embeddings.sh ...)``.
* **Released on every exit path** of the holder: :func:`hold` releases on return, exception,
  SIGTERM, SIGHUP and SIGINT; the shell helper does it from an ``EXIT`` trap (and turns
  INT/TERM/HUP into exits).  :func:`release` removes only a lock that names the caller.
* **Stale locks are taken over, saying so.**  A lock whose holder was on this host and is gone
  (no such pid, or the pid now belongs to a process started at another time) is reported on
  stderr and replaced; a break file (``.spkflow.core.lock.break``, made with ``O_EXCL``) makes sure
  only one of several waiting runs replaces it.  A holder on another host cannot be checked
  from here: the refusal says which host to look at and which file to remove.

Kaldi, ESPnet and WeSpeaker recipes take no lock: two runs into one directory interleave.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOCK_NAME", "Holder", "LockError", "acquire", "release", "read_holder", "hold", "is_stale", "is_lock_file"]

LOCK_NAME = ".spkflow.core.lock"
_BREAK_AGE = 30.0  # seconds after which a break file left by a killed run is ignored


class LockError(RuntimeError):
    """The directory is locked by another run (the message names it)."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    start: str  # the process's start time in clock ticks since boot (/proc/PID/stat), "" where unknown
    since: str  # wall-clock time the lock was taken
    command: str

    def text(self) -> str:
        return "".join(
            f"{k}={v}\n"
            for k, v in (
                ("host", self.host),
                ("pid", self.pid),
                ("start", self.start),
                ("since", self.since),
                ("command", self.command.replace("\n", " ")),
            )
        )

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        try:
            return cls(fields["host"], int(fields["pid"]), fields.get("start", ""), fields["since"], fields["command"])
        except (KeyError, ValueError):
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.since} ({self.command})"


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: starttime


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return " ".join(sys.argv)
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def is_lock_file(name: str) -> bool:
    """Whether a file name in a locked directory belongs to this module: the lock, its break
    file, or the temporary a contender writes for an instant before linking it (``_create``;
    also what a contender killed in that instant leaves behind)."""
    if name in (LOCK_NAME, LOCK_NAME + ".break"):
        return True
    return name.startswith(LOCK_NAME + ".") and name.endswith(".tmp")


def lock_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / LOCK_NAME


def read_holder(directory: str | os.PathLike[str]) -> Holder | None:
    """The current holder (None when the directory is not locked or the file is being written)."""
    try:
        return Holder.parse(lock_path(directory).read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        return None


def is_stale(holder: Holder) -> bool:
    """True when ``holder`` ran on this host and is gone (its pid is free or reused)."""
    if holder.host != socket.gethostname():
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    now = _start_ticks(holder.pid)
    return bool(holder.start and now and now != holder.start)


def _create(path: Path, text: str) -> bool:
    """Make ``path`` hold ``text`` if it does not exist; False when it exists."""
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")  # inside the try: a full disk leaves no temporary file
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:  # no hard links on this file system
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _take_over(path: Path, seen: Holder) -> None:
    """Remove the stale lock ``seen`` unless someone else is already doing so or it changed."""
    brk = path.with_name(path.name + ".break")
    try:
        fd = os.open(brk, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - brk.stat().st_mtime > _BREAK_AGE:
                brk.unlink()  # left by a run killed while taking over
        time.sleep(0.2)
        return
    os.close(fd)
    try:
        now = read_holder(path.parent)
        if now == seen:
            path.unlink()
    finally:
        with contextlib.suppress(FileNotFoundError):
            brk.unlink()


def acquire(directory: str | os.PathLike[str], *, pid: int | None = None, command: str | None = None) -> Holder:
    """Lock ``directory`` for process ``pid`` (default: this one); returns the holder record.

    Raises :class:`LockError` naming the holder when another live run has it.  A stale lock
    (holder gone, this host) is taken over with a message on stderr."""
    pid = os.getpid() if pid is None else pid
    os.makedirs(directory, exist_ok=True)
    me = Holder(
        socket.gethostname(),
        pid,
        _start_ticks(pid),
        time.strftime("%Y-%m-%dT%H:%M:%S"),
        command if command is not None else _command(pid),
    )
    path = lock_path(directory)
    for _ in range(50):
        if _create(path, me.text()):
            return me
        other = read_holder(directory)
        if other is None:  # released meanwhile, or still being written (O_EXCL fallback)
            time.sleep(0.05)
            continue
        if other.host == me.host and other.pid == me.pid and other.start == me.start:
            return me  # already ours
        if is_stale(other):
            print(
                f"spkflow.core.lock: taking over the stale lock {path} of {other.describe()}: "
                "that process is gone (killed?); its partial outputs are handled as an interrupted run's",
                file=sys.stderr,
            )
            _take_over(path, other)
            continue
        where = (
            ""
            if other.host == me.host
            else f"; it cannot be checked from {me.host}: if no such run is alive on {other.host}, remove {path}"
        )
        raise LockError(f"{directory} is in use by another run: {other.describe()}{where}")
    raise LockError(f"could not lock {directory}: {path} keeps changing")


def release(directory: str | os.PathLike[str], *, pid: int | None = None) -> bool:
    """Remove the lock if it names ``pid`` (default: this process) on this host; True if removed."""
    pid = os.getpid() if pid is None else pid
    holder = read_holder(directory)
    if holder is None or holder.host != socket.gethostname() or holder.pid != pid:
        return False
    with contextlib.suppress(FileNotFoundError):
        lock_path(directory).unlink()
    return True


@contextlib.contextmanager
def hold(directory: str | os.PathLike[str], command: str | None = None) -> Iterator[Holder]:
    """Hold the lock of ``directory`` for the block; released on return, error and SIGTERM/SIGHUP/SIGINT
    (turned into ``SystemExit(128 + signal)`` while the block runs, in the main thread)."""
    old: dict[int, object] = {}

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading_is_main():  # armed before the lock exists: no moment where a signal skips the release
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            old[sig] = signal.signal(sig, _exit)
    try:
        me = acquire(directory, command=command)
        try:
            yield me
        finally:
            release(directory)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
