"""The job toolkit's reliability parts with real processes: the output-dir lock (spkflow.core.lock, its
CLI and the shell helper scripts/lib/jobs.sh), DataLoader workers that die with a SIGKILLed
parent (spkflow.core.procs), and merges whose outputs appear all together or not at all
(spkflow.data.jobs.StagedOutputs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.procs import process_alive, process_children
from spkflow.core.lock import LOCK_NAME, LockError, acquire, hold, read_holder, release
from spkflow.data.jobs import StagedOutputs, split_by_duration

PY = sys.executable
JOBS_SH = ROOT / "scripts" / "lib" / "jobs.sh"


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT)
    return e


def lock_cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "spkflow.bin.lock", *map(str, args)], env=env(), capture_output=True, text=True, timeout=60
    )


def wait_for(cond, timeout: float = 30.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


# ----------------------------------------------------------------------------- lock


def test_second_holder_is_refused_naming_the_first(tmp_path):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        p = lock_cli("acquire", "--pid", holder.pid, "--command", "make_fbank.sh data/a dump/a", tmp_path)
        assert p.returncode == 0, p.stderr
        p2 = lock_cli("acquire", tmp_path)  # another run: this CLI process itself
        assert p2.returncode == 1
        msg = p2.stderr.strip()
        assert len(msg.splitlines()) == 1
        assert f"pid {holder.pid} on {socket.gethostname()} since " in msg
        assert "(make_fbank.sh data/a dump/a)" in msg
        with pytest.raises(LockError, match=f"pid {holder.pid}"):
            acquire(tmp_path)
        assert not release(tmp_path)  # not ours: left alone
        assert read_holder(tmp_path).pid == holder.pid
        assert lock_cli("release", "--pid", holder.pid, tmp_path).returncode == 0
        assert not (tmp_path / LOCK_NAME).exists()
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_of_a_dead_process_is_taken_over_saying_so(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert lock_cli("acquire", "--pid", dead.pid, "--command", "killed run", tmp_path).returncode == 0
    p = lock_cli("acquire", "--command", "new run", tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"taking over the stale lock {tmp_path / LOCK_NAME} of pid {dead.pid}" in p.stderr
    assert "(killed run)" in p.stderr
    assert read_holder(tmp_path).command == "new run"


def test_many_runs_at_once_one_wins(tmp_path):
    """Eight CLI processes race for one directory: exactly one gets it."""
    holders = [subprocess.Popen(["sleep", "30"]) for _ in range(8)]
    try:
        procs = [
            subprocess.Popen(
                [PY, "-m", "spkflow.bin.lock", "acquire", "--pid", str(h.pid), str(tmp_path)],
                env=env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for h in holders
        ]
        codes = [p.wait(timeout=60) for p in procs]
        assert sorted(codes) == [0] + [1] * 7
        winner = holders[codes.index(0)].pid
        assert read_holder(tmp_path).pid == winner
    finally:
        for h in holders:
            h.kill()
            h.wait()


def test_hold_releases_on_error_and_on_sigterm(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), hold(tmp_path / "a"):
        assert read_holder(tmp_path / "a").pid == os.getpid()
        raise RuntimeError("boom")
    assert read_holder(tmp_path / "a") is None
    code = f"from spkflow.core.lock import hold\nimport time\nwith hold({str(tmp_path / 'b')!r}):\n    time.sleep(60)\n"
    p = subprocess.Popen([PY, "-c", code], env=env())
    try:
        assert wait_for(lambda: read_holder(tmp_path / "b") is not None)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        p.kill()
    assert read_holder(tmp_path / "b") is None


def _script(tmp_path: Path, body: str) -> Path:
    s = tmp_path / "stage.sh"
    s.write_text(
        textwrap.dedent(
            f"""\
            #!/usr/bin/env bash
            set -euo pipefail
            root={ROOT}
            python={PY}
            help_message="usage: stage.sh <out>"
            jobs_command="$0 $*"
            . "${{root}}/scripts/lib/jobs.sh"
            [ $# -eq 1 ] || jobs_usage
            jobs_lock "$1"
            """
        )
        + body
    )
    return s


@pytest.mark.parametrize(
    "body, how",
    # bash runs a trap when its foreground command ends (a stage script's run.pl: its jobs still
    # hold the directory until then), hence a short sleep
    # "at once": the signal as soon as the lock file exists, while the acquiring python may still be
    # exiting (bash acts on a trapped signal when that child returns; untrapped, it was swallowed)
    [
        ("false\n", "error"),
        ("exit 0\n", "success"),
        ("sleep 3\n", "sigterm"),
        ("sleep 3\n", "sigint"),
        ("sleep 3\n", "sigint at once"),
        ("sleep 3\n", "sigterm at once"),
    ],
)
def test_shell_helper_releases_the_lock_on_every_exit(tmp_path, body, how):
    out = tmp_path / "out"
    script = _script(tmp_path, body)
    p = subprocess.Popen(
        ["bash", str(script), str(out)],
        env=env(),
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT as a terminal gives it: a test run started in the background (nohup ... &) ignores
        # SIGINT, children inherit that, and bash cannot trap a signal ignored at its start
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert wait_for(lambda: read_holder(out) is not None or p.poll() is not None)
        if how.startswith("sig"):
            assert wait_for(lambda: read_holder(out) is not None)
            assert read_holder(out).pid == p.pid and "stage.sh" in read_holder(out).command
            if not how.endswith("at once"):
                time.sleep(0.3)  # the script is in its sleep
            p.send_signal(signal.SIGTERM if how.startswith("sigterm") else signal.SIGINT)
        code = p.wait(timeout=60)
    finally:
        p.kill()
    expected = {"error": 1, "success": 0, "sigterm": 143, "sigint": 130}[how.removesuffix(" at once")]
    assert code == expected, p.stderr.read()
    assert not (out / LOCK_NAME).exists()


def test_shell_helper_refuses_while_held_and_takes_over_after_sigkill(tmp_path):
    out = tmp_path / "out"
    script = _script(tmp_path, "sleep 60\n")
    first = subprocess.Popen(["bash", str(script), str(out)], env=env(), start_new_session=True)
    try:
        assert wait_for(lambda: read_holder(out) is not None)
        second = subprocess.run(["bash", str(script), str(out)], env=env(), capture_output=True, text=True)
        assert second.returncode == 1
        assert f"is in use by another run: pid {first.pid} on {socket.gethostname()}" in second.stderr
        os.killpg(first.pid, signal.SIGKILL)  # no trap runs: the lock stays behind
        first.wait()
        assert read_holder(out).pid == first.pid
        third = subprocess.run(
            ["bash", str(_script(tmp_path, "exit 0\n")), str(out)], env=env(), capture_output=True, text=True
        )
        assert third.returncode == 0, third.stderr
        assert f"taking over the stale lock {out / LOCK_NAME} of pid {first.pid}" in third.stderr
    finally:
        with_suppress_kill(first)
    assert not (out / LOCK_NAME).exists()


def with_suppress_kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


# ----------------------------------------------------------------------------- workers


WORKER_PARENT = """
import os, sys, time
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from spkflow.core import procs

class Big(Dataset):
    def __len__(self):
        return 1000
    def __getitem__(self, i):
        return np.ones(200_000, dtype=np.float32)  # numpy, not tensors: pickled through the pipe

loader = DataLoader(Big(), batch_size=4, num_workers=1, collate_fn=lambda b: b, prefetch_factor=4,
                    worker_init_fn={init})
it = iter(loader)
next(it)
print(os.getpid(), flush=True)
time.sleep(600)  # the worker fills the pipe and blocks, as behind a slow model
"""


def _worker_of(parent: int) -> int:
    children = process_children().get(parent, [])
    assert len(children) == 1, children
    return children[0]


@pytest.mark.parametrize("init", ["procs.worker_init", "lambda _: procs.die_with_parent(interval=0.2, prctl=False)"])
def test_dataloader_worker_dies_with_a_sigkilled_parent(tmp_path, init):
    """The parent's SIGKILL (the OOM killer) leaves no worker blocked on a full pipe.  Without
    the worker_init_fn the worker is still there minutes later (issue 16)."""
    p = subprocess.Popen([PY, "-c", WORKER_PARENT.format(init=init)], env=env(), stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        assert int(p.stdout.readline()) == p.pid
        worker = _worker_of(p.pid)
        time.sleep(1.0)  # the worker has filled the pipe
        assert process_alive(worker)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert wait_for(lambda: not process_alive(worker), timeout=5.0), "the DataLoader worker outlived its parent"
    finally:
        p.kill()
        if worker is not None and process_alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_training_loader_workers_die_with_parent():
    """make_loader (the training loader) arms the same helper in its workers, which also leave
    SIGINT / SIGTERM / SIGHUP to the trainer (a signal to the process group must not kill them
    under a trainer that is writing its checkpoint)."""
    import torch

    from spkflow.train.loader import make_loader

    class Tiny(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int):
            import ctypes

            buf = ctypes.c_int(0)
            ctypes.CDLL(None).prctl(2, ctypes.byref(buf), 0, 0, 0)  # PR_GET_PDEATHSIG
            ignored = [signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
            return buf.value, all(ignored)

    got = [(int(a), bool(b)) for a, b in make_loader(Tiny(), num_workers=1)]
    assert got == [(signal.SIGKILL, True), (signal.SIGKILL, True)]


# ----------------------------------------------------------------------------- merges


def test_staged_outputs_all_or_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "b.scp").write_text("stale\n")
    names = ["a.txt", "b.scp"]
    with pytest.raises(OSError, match="disk full"), StagedOutputs(out, names) as st:
        st.write_text("a.txt", "a\n")
        raise OSError(28, "disk full")
    assert sorted(os.listdir(out)) == []  # neither the new a.txt, nor the stale b.scp, nor temporaries
    with StagedOutputs(out, names) as st:
        st.write_text("b.scp", "b\n")
        st.write_text("a.txt", "a\n")
    assert (out / "a.txt").read_text() == "a\n" and (out / "b.scp").read_text() == "b\n"
    assert sorted(os.listdir(out)) == names


def test_split_by_duration_boundaries_are_the_nearest():
    """The docstring's rule: part j ends after the utterance whose cumulative duration is nearest
    to (j+1)/nj of the total, the first to reach it or the one before."""
    utts = ["a", "b", "c", "d"]
    # 4 + 1 reaches 5 of 10 exactly
    assert split_by_duration(utts, {"a": 4, "b": 1, "c": 4, "d": 1}, 2) == [["a", "b"], ["c", "d"]]
    # 4 + 1.5 overshoots 5 by less than 4 falls short: the first to reach it
    assert split_by_duration(utts, {"a": 4, "b": 1.5, "c": 3.5, "d": 1}, 2) == [["a", "b"], ["c", "d"]]
    # 4 + 2.5 overshoots by more than 4 falls short: the one before
    assert split_by_duration(utts, {"a": 4, "b": 2.5, "c": 2.5, "d": 1}, 2) == [["a"], ["b", "c", "d"]]
