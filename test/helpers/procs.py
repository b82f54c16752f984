"""Processes for the reliability tests: children, trees, liveness and working directories from
/proc, a disk that fills up, the venv's Python run with the project's environment."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from helpers.paths import ROOT


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{ROOT / '.venv' / 'bin'}:{ROOT / 'utils'}:{e['PATH']}"
    e["OMP_NUM_THREADS"] = "1"
    return e


def as_from_a_terminal() -> None:
    """A ``preexec_fn``: SIGINT and SIGHUP at their defaults, as a shell at a terminal starts a
    command.  A test run started with ``nohup ... &`` ignores both, its children inherit that,
    and the supervisor rightly keeps a signal ignored at start ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_from_a_terminal(
    cmd: list, env: dict[str, str], cwd: Path | None = None, stderr: int = subprocess.PIPE
) -> subprocess.Popen:
    """``cmd`` started as a shell at a terminal starts it (:func:`as_from_a_terminal`), its
    standard output (and by default its standard error) piped as text."""
    return subprocess.Popen(
        list(map(str, cmd)),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        preexec_fn=as_from_a_terminal,
    )


def process_children() -> dict[int, list[int]]:
    """``ppid -> [pid]`` of every process now (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    return children


def process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants now."""
    children = process_children()
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def processes_in(directory: Path) -> list[int]:
    """Live processes whose working directory is ``directory`` or below it: every process of a
    recipe run (they all run in the recipe dir), whoever their parent is now."""
    where = str(directory.resolve())
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cwd = os.readlink(d / "cwd")
            except OSError:
                continue
            if (cwd == where or cwd.startswith(where + "/")) and process_alive(int(d.name)):
                out.append(int(d.name))
    return out


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    """Poll ``cond`` every 50 ms until it holds or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@contextlib.contextmanager
def small_disk(path: Path, kib: int) -> Iterator[Callable[[], None] | None]:
    """``path`` on a file system of ``kib`` KiB, to run out of space for real: a tmpfs mounted for
    the test (needs root).  Elsewhere ``path`` is a plain directory and the yielded preexec_fn
    caps the size of every file a child writes (RLIMIT_FSIZE: EFBIG instead of ENOSPC)."""
    path.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)]
    mounted = subprocess.run(mount, capture_output=True).returncode == 0
    try:
        if mounted:
            yield None
        else:
            yield lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, kib * 1024))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=True)


def run_py(args: list[str | Path], preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    e = env()
    e["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), *map(str, args)],
        capture_output=True,
        text=True,
        env=e,
        timeout=300,
        preexec_fn=preexec,
    )
