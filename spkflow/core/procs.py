"""Process lifetimes: children that die with their parent, and a script whose whole tree stops with it.

What it guarantees
------------------
:func:`die_with_parent`, called in a child (a DataLoader ``worker_init_fn``), makes the child
end when its parent ends, however the parent ends: SIGKILL by the OOM killer or a scheduler
included, where no ``atexit`` or ``finally`` of the parent runs.  On Linux the kernel sends
the child SIGKILL (``prctl(PR_SET_PDEATHSIG)``); elsewhere a daemon thread checks once a
second that the parent is still there and ends the child when it is not.  Either way a parent
that died before the call is caught by comparing ``getppid()`` with the parent the child was
had when the call began.

Why it is needed: PyTorch's workers check their parent only while waiting for work; a worker
whose result queue is full (its parent was killed mid-epoch) blocks in the queue's feeder
thread forever, holding the job's memory, files and GPU context (measured: 320 MB resident
under PID 1 after 10 minutes).  PyTorch, ESPnet, WeSpeaker and SpeechBrain leave this to the
user.

:func:`supervise` runs a recipe or stage script (``utils/supervise.sh`` puts every one of them
under it, keeping the script's pid) so that SIGINT, SIGTERM or SIGHUP sent to that one pid stop
everything the script started:

* the script runs in a process group of its own, and the signal is forwarded to that group:
  what sending it to the group by hand does (bash, run.pl, queue.pl / slurm.pl, Python jobs
  and DataLoader workers each act on it as they are written to: run.pl forwards it to its jobs'
  groups, queue.pl / slurm.pl cancel the cluster job with ``qdel`` / ``scancel``, lock holders
  release their locks, the trainer writes a checkpoint);
* whatever is still running ``grace`` seconds later (default 5; ``SPKFLOW_STOP_GRACE``) is
  killed with SIGKILL, found in ``/proc`` as a descendant: the supervisor is a child
  subreaper (``PR_SET_CHILD_SUBREAPER``), so a process whose parent died is re-parented to it,
  not to PID 1, and cannot escape.  The outermost supervisor kills every descendant at its own
  deadline, so nested supervisors never add their graces: one grace for the whole tree;
* except while a process is writing what the stop must not lose: a thread named
  :data:`SAVING_THREAD` (:func:`name_this_thread`; the trainer's thread writing its checkpoint
  at the signal) holds the kill back, up to :data:`SAVE_GRACE` seconds past the grace, and the
  grace starts again from its end (its parents' exit traps run then: a lock is released); a 74 MB
  checkpoint took 2.8 s on a loaded 2-core VM, where the grace is 5 s.  A second signal kills at
  once;
* processes the script leaves behind when it ends by itself get SIGTERM, then SIGKILL after
  ``grace`` seconds;
* the exit status is the script's, or 128 + N after signal N (bash's convention);
* SIGTSTP / SIGCONT (Ctrl-Z, ``fg``, ``bg``) are passed on, so a suspended run is suspended
  whole; a signal ignored when the supervisor started (INT under ``nohup ... &``) stays ignored.

Without it a signal to a script's pid stops only that bash (or, where the script traps it,
nothing until its foreground child returns): without it spk.sh was seen re-parented to PID 1 with
ten of its processes running 10 s after ``kill -TERM`` of run.sh.  Kaldi's and ESPnet's recipes rely
on the terminal signalling the whole foreground group; a ``kill`` of one pid, a batch system or
a closed ssh session does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from spkflow.core.threads import worker_threads

__all__ = [
    "SAVE_GRACE",
    "SAVING_THREAD",
    "SUPERVISOR_ENV",
    "descendants",
    "die_with_parent",
    "name_this_thread",
    "saving",
    "supervise",
    "worker_init",
]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

#: The environment variable naming the supervisor's pid in the script it runs (utils/supervise.sh
#: compares it with the script's parent pid to know that it is supervised already).
SUPERVISOR_ENV = "SPKFLOW_SUPERVISOR"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL = 0.05  # seconds between looks at the process tree while stopping
#: the name (the kernel's ``comm``) of a thread writing what a stop must not lose
SAVING_THREAD = "spkflow-saving"
#: seconds a stop waits beyond its grace for such a thread (a checkpoint of a few hundred MB on a slow disk)
SAVE_GRACE = 60.0


def _prctl(option: int, arg: int) -> bool:
    """``prctl(option, arg)`` on Linux; False where it is not available or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, interval: float) -> None:
    while True:
        time.sleep(interval)
        if os.getppid() != parent:
            os._exit(1)


def die_with_parent(interval: float = 1.0, prctl: bool = True) -> str:
    """End this process when its parent ends.  Returns how: ``"pdeathsig"`` (Linux) or ``"watch"``
    (a thread polling every ``interval`` seconds; also with ``prctl=False``)."""
    parent = os.getppid()
    how = "pdeathsig" if prctl and _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL)) else "watch"
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if how == "watch":
        threading.Thread(target=_watch, args=(parent, interval), name="parent-watch", daemon=True).start()
    return how


def name_this_thread(name: str) -> bool:
    """Give the calling thread ``name`` (15 bytes at most) as the kernel shows it
    (``/proc/<pid>/task/<tid>/comm``); False where that cannot be done."""
    try:
        with open("/proc/thread-self/comm", "w", encoding="ascii") as f:
            f.write(name[:15])
        return True
    except OSError:
        return False


def saving(pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` with a thread named :data:`SAVING_THREAD`."""
    out = []
    for p in pids:
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/comm", encoding="ascii", errors="replace") as f:
                    if f.read().strip() == SAVING_THREAD:
                        out.append(p)
                        break
            except OSError:
                continue
    return out


def worker_init(_worker_id: int = 0) -> None:
    """A DataLoader ``worker_init_fn`` of the trainer: the worker dies with the process that
    started it, runs one thread in each pool (:func:`spkflow.core.threads.worker_threads`), and
    ignores SIGINT / SIGTERM / SIGHUP, which a terminal or :func:`supervise` sends to the whole
    process group: the trainer decides (it writes the checkpoint of its last
    completed step and ends), and its workers end with it.  A worker killed by the signal would instead make
    PyTorch raise "DataLoader worker ... is killed by signal" in the trainer before its checkpoint."""
    die_with_parent()
    worker_threads(_worker_id)  # one thread in torch, OpenMP and BLAS (spkflow.core.threads)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def descendants(pid: int | None = None) -> list[int]:
    """The live (not zombie) descendants of ``pid`` (default: this process), parents first, read
    from ``/proc`` (empty where there is none)."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def _say(text: str) -> None:
    """A line on stderr; a closed stderr (its reader gone) must not stop the supervisor."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def _reap(main: int) -> int | None:
    """Reap every ended child (the script and orphans adopted as subreaper); the script's wait
    status when it was among them."""
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == main:
            status = st


def supervise(argv: Sequence[str], grace: float = 5.0, name: str | None = None) -> int:
    """Run ``argv`` under supervision (see the module doc) and return its exit status.  ``name``
    (default: the program's) starts the supervisor's own messages."""
    name = name or os.path.basename(argv[0])
    stops = [s for s in STOP_SIGNALS if signal.getsignal(s) != signal.SIG_IGN]
    job_control = [s for s in (signal.SIGTSTP, signal.SIGCONT) if signal.getsignal(s) != signal.SIG_IGN]
    waited = {signal.SIGCHLD, *stops, *job_control}
    # blocked before the child exists: a signal that comes while it starts waits for us
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)

    def child_setup() -> None:
        os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))  # a supervisor killed with SIGKILL: TERM the script

    env = dict(os.environ)
    env[SUPERVISOR_ENV] = str(os.getpid())
    try:
        proc = subprocess.Popen(list(argv), env=env, close_fds=False, preexec_fn=child_setup)
    except OSError as err:
        _say(f"spkflow.bin.supervise: cannot run {argv[0]}: {err.strerror or err}")
        return 127
    with contextlib.suppress(OSError):
        os.setpgid(proc.pid, proc.pid)  # also here, so a signal forwarded at once finds the group
    status: int | None = None
    stop_sig = 0
    deadline: float | None = None
    killed = False
    hurry = False  # a second signal: no waiting for a checkpoint either
    cap: float | None = None  # the latest a stop waits for a checkpoint being written
    waited_for: list[int] = []
    while True:
        ended = _reap(proc.pid)
        status = ended if ended is not None else status
        if status is not None or stop_sig:
            left = descendants()
            if not left and status is not None:
                break
            if deadline is None:
                # the script ended by itself and left these behind (after a signal they may be nested
                # scripts still stopping in order: they get until the deadline)
                _say(f"{name}: stopping {len(left)} process(es) it left running: {left[:8]}")
                _signal_all(left, signal.SIGTERM)
                deadline = time.monotonic() + grace
            elif left and (waited_for or time.monotonic() >= deadline):
                # past the deadline, and at every poll while a checkpoint is being written
                writing = [] if hurry or (cap is not None and time.monotonic() >= cap) else saving(left)
                if writing:  # a checkpoint being written at the signal: the kill waits for it, and what
                    # runs after it (its parents' exit traps) gets the grace from its end
                    cap = deadline + SAVE_GRACE if cap is None else cap
                    deadline = time.monotonic() + grace
                    if writing != waited_for:
                        _say(f"{name}: waiting for {len(writing)} process(es) writing a checkpoint: {writing[:8]}")
                    waited_for = writing
                elif time.monotonic() < deadline:
                    waited_for = []  # written: what is left has the grace from now
                else:
                    if not killed:
                        why = signal.Signals(stop_sig or signal.SIGTERM).name
                        _say(f"{name}: killing {len(left)} process(es) still running {grace:g} s after {why}")
                        killed = True
                    _signal_all(left, signal.SIGKILL)
        if deadline is None:
            info = signal.sigwaitinfo(waited)
        else:
            info = signal.sigtimedwait(waited, _POLL)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        sig = info.si_signo
        if sig in stops:
            if not stop_sig:
                stop_sig = sig
                deadline = time.monotonic() + grace
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            else:  # a second signal: no more waiting
                deadline = time.monotonic()
                hurry = True
        elif sig == signal.SIGTSTP:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTSTP)
            os.kill(os.getpid(), signal.SIGSTOP)
        elif sig == signal.SIGCONT:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGCONT)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped here, not by Popen
    if stop_sig:
        return 128 + stop_sig
    return 128 - code if code < 0 else code
