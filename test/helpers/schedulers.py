"""Start and stop a real single-node Slurm and a real Sun Grid Engine for the runner tests.

Tests get the session fixtures ``slurm_cluster`` and ``sge_cluster`` defined here through
conftest.py, which imports them, so that one cluster serves every module. Each fixture:

* skips when the machine cannot host the scheduler (not root, Debian packages missing;
  ``sudo bash tools/install_schedulers.sh`` installs them), except under ``CI=true`` where
  the missing piece is a failure, since CI installs the packages itself;
* starts the daemons in the foreground as children of pytest, configured for this host
  only, and polls ``sinfo`` / ``qstat`` until the node or queue accepts work (a start that
  does not succeed within the timeout raises with the tail of every daemon's log);
* stops everything at the end of the session, on failure too: jobs are cancelled and
  waited for, then the daemons are stopped (SIGTERM, then SIGKILL after a grace period).

Slurm runs entirely from a temporary directory (its own ``slurm.conf`` passed through
``SLURM_CONF``, its own munge key and ``munged`` socket, free TCP ports), so it cannot
disturb or be disturbed by a system Slurm. The node declares one GPU backed by
``/dev/null``: the scheduler then really grants ``--gres=gpu:1`` (and sets
``CUDA_VISIBLE_DEVICES``), though no job can use a GPU on this machine.

Grid Engine has its root fixed at install time (``/var/lib/gridengine``, cell ``default``):
the fixture configures that cell for this host (host alias, root jobs allowed, 1 s
scheduling, a ``smp`` parallel environment, a consumable ``gpu`` complex, ``all.q``), as the
notes in shared/notes/schedulers.md describe, and starts ``sge_qmaster`` and ``sge_execd``.
It refuses to start over daemons it did not start (say, left by a killed test run) and says
how to stop them, instead of silently testing against them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers.paths import ROOT

SLURM_PROGRAMS = (
    "munged",
    "munge",
    "unmunge",
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "sinfo",
    "scancel",
    "scontrol",
)
SGE_PROGRAMS = ("qsub", "qstat", "qconf", "qdel")
SGE_ROOT = Path("/var/lib/gridengine")
SGE_DAEMONS = (Path("/usr/sbin/sge_qmaster"), Path("/usr/sbin/sge_execd"))


class SchedulerError(RuntimeError):
    """A scheduler did not start or stop; the message carries the daemons' log tails."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _prog(name: str) -> str:
    """Full path of a scheduler program (daemons live in /usr/sbin, often not on PATH)."""
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


def _missing(programs: tuple[str, ...], extra: tuple[Path, ...] = ()) -> list[str]:
    found = [p for p in programs if _prog(p) == p]
    return found + [str(p) for p in extra if not p.exists()]


def unavailable_reason(kind: str) -> str | None:
    """Why ``kind`` ("slurm" or "sge") cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return f"{kind} tests need root (they start the scheduler's daemons)"
    if kind == "slurm":
        missing = _missing(SLURM_PROGRAMS)
    else:
        missing = _missing(SGE_PROGRAMS, SGE_DAEMONS)
    if missing:
        return f"{kind} not installed (missing {', '.join(missing)}); run: sudo bash tools/install_schedulers.sh"
    return None


def require(kind: str) -> None:
    """Skip the test when ``kind`` cannot run here; under CI=true fail instead."""
    reason = unavailable_reason(kind)
    if reason:
        if _in_ci():
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"  ({path}: {exc})"
    return "\n".join(f"  | {line}" for line in text[-lines:]) or "  (empty)"


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _stop_process(proc: subprocess.Popen, grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Stop one daemon we started: ``sig``, then SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def _run(
    cmd: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 30,
    check: bool = False,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=check, input=input)


def run_runner(
    script: Path, cluster_env: dict[str, str], args: list[str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess:
    """``script args...`` (queue.pl or slurm.pl) in ``cwd`` against a test cluster, with the
    project's venv first on PATH as after ``. path.sh``."""
    env = {**os.environ, **cluster_env}
    venv_bin = ROOT / ".venv" / "bin"
    if venv_bin.is_dir():
        env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
    return subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def log_body(log: Path) -> list[str]:
    """A job log's lines between the runner's header and its accounting/end lines."""
    lines = log.read_text().splitlines()
    start = lines.index("#") + 1
    end = len(lines)
    while end > start and re.match(r"# (Accounting|Ended)", lines[end - 1]):
        end -= 1
    return lines[start:end]


class SlurmCluster:
    """A one-node Slurm (slurmctld + slurmd + munged) living in ``root``.

    ``env`` holds the variables a client needs (``SLURM_CONF``); pass ``{**os.environ,
    **cluster.env}`` to subprocesses. ``logs`` names the daemons' log files.
    """

    def __init__(self, root: Path, start_timeout: float = 60.0) -> None:
        self.root = root
        self.start_timeout = start_timeout
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = {  # munged runs in the foreground and logs to munged.out
            "munged": root / "munged.out",
            "slurmctld": root / "slurmctld.log",
            "slurmd": root / "slurmd.log",
        }
        self.startup_seconds = float("nan")

    # -- configuration -----------------------------------------------------------------
    def _node_line(self) -> str:
        """This host as slurmd sees it (CPUs, sockets, cores, memory), so it is not drained
        for a mismatch; memory is lowered a little to leave room for the OS."""
        out = _run([_prog("slurmd"), "-C"], timeout=30, check=True).stdout.splitlines()[0]
        fields = dict(item.split("=", 1) for item in out.split())
        fields["NodeName"] = self.host
        fields["RealMemory"] = str(max(256, int(int(fields.get("RealMemory", "1024")) * 0.9)))
        return " ".join(f"{k}={v}" for k, v in fields.items())

    def _write_config(self) -> None:
        r = self.root
        r.chmod(0o755)  # munged wants the directories above its socket searchable
        for d in ("munge", "state", "spool"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o755)
        ctld_port, d_port = _free_ports(2)
        self.conf.write_text(
            f"""# single-node Slurm for spkflow's runner tests (written by test/helpers/schedulers.py)
ClusterName=spkflowtest
SlurmctldHost={self.host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
# start tasks as soon as resources free up (the defaults wait up to 3 s between array tasks)
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
MinJobAge=60
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
GresTypes=gpu
{self._node_line()} Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
"""
        )
        # A GPU the scheduler can count and grant; /dev/null stands in for the device file.
        (r / "gres.conf").write_text(f"NodeName={self.host} Name=gpu File=/dev/null\n")
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    # -- life cycle ----------------------------------------------------------------------
    def _popen(self, name: str, cmd: list[str]) -> None:
        out = open(self.root / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        out.close()

    def _diagnostics(self) -> str:
        parts = []
        for name, proc in self.procs.items():
            state = "running" if proc.poll() is None else f"exited with {proc.returncode}"
            parts.append(f"{name} ({state}), {self.logs[name]}:\n{tail(self.logs[name])}")
            if self.logs[name] != self.root / f"{name}.out":
                parts.append(f"{name} stdout/stderr:\n{tail(self.root / f'{name}.out', 8)}")
        return "\n".join(parts)

    def _wait_for(self, what: str, ok: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SchedulerError(f"slurm: {name} exited while waiting for {what}\n{self._diagnostics()}")
            if ok():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise SchedulerError(f"slurm: no {what} after {timeout:.0f} s\n{self._diagnostics()}")

    def start(self) -> SlurmCluster:
        t0 = time.monotonic()
        self._write_config()
        m = self.root / "munge"
        self._popen(
            "munged",
            [
                _prog("munged"),
                "--foreground",
                "--force",
                f"--socket={m}/munge.sock",
                f"--key-file={m}/munge.key",
                f"--pid-file={m}/munged.pid",
                f"--seed-file={m}/munged.seed",
            ],
        )
        sock = m / "munge.sock"

        def munge_ok() -> bool:
            if not sock.exists():
                return False
            enc = _run([_prog("munge"), "-S", str(sock), "-n"], timeout=10)
            return (
                enc.returncode == 0
                and _run([_prog("unmunge"), "-S", str(sock)], input=enc.stdout, timeout=10).returncode == 0
            )

        self._wait_for("munge credential", munge_ok, 20)
        self._popen("slurmctld", [_prog("slurmctld"), "-D", "-c", "-f", str(self.conf)])
        self._popen("slurmd", [_prog("slurmd"), "-D", "-f", str(self.conf)])
        env = {**os.environ, **self.env}

        def node_idle() -> bool:
            out = _run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, timeout=10)
            return out.returncode == 0 and f"{self.host} idle" in out.stdout

        self._wait_for(f"idle node {self.host} in sinfo", node_idle, self.start_timeout)
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Cancel every job, wait for them to leave, stop slurmd, slurmctld and munged."""
        env = {**os.environ, **self.env}
        errors = []
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            try:
                _run(["scancel", "--quiet", "--partition=debug"], env=env, timeout=20)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    q = _run(["squeue", "-h", "-o", "%i"], env=env, timeout=10)
                    if q.returncode != 0 or not q.stdout.strip():
                        break
                    time.sleep(0.2)
            except (subprocess.SubprocessError, OSError) as exc:
                errors.append(f"cancelling jobs: {exc}")
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is not None:
                _stop_process(proc)
        if errors:
            raise SchedulerError("slurm: " + "; ".join(errors))


class GridEngine:
    """Debian's Sun Grid Engine 8.1 (cell ``default`` under /var/lib/gridengine) for this host.

    ``env`` holds SGE_ROOT and SGE_CELL for clients. The master and execution daemons run
    in the foreground (SGE_ND) as children of pytest.
    """

    def __init__(self, workdir: Path, start_timeout: float = 60.0) -> None:
        self.workdir = workdir
        self.start_timeout = start_timeout
        self.host = socket.gethostname()
        self.env = {"SGE_ROOT": str(SGE_ROOT), "SGE_CELL": "default"}
        self.procs: dict[str, subprocess.Popen] = {}
        self.alias_file = SGE_ROOT / "default" / "common" / "host_aliases"
        self.created_alias = False
        self.logs = {
            "sge_qmaster": Path("/var/spool/gridengine/qmaster/messages"),
            "sge_execd": Path("/var/spool/gridengine/execd"),  # resolved after start
        }
        self.startup_seconds = float("nan")

    def _genv(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def qconf(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = _run(["qconf", *args], env=self._genv(), timeout=30)
        if check and out.returncode != 0:
            raise SchedulerError(f"sge: qconf {' '.join(args)} failed: {out.stdout}{out.stderr}\n{self._diagnostics()}")
        return out

    def _apply(self, kind: str, name: str, text: str) -> None:
        """Add or modify one configuration object from a file (``qconf -A<kind>/-M<kind>``)."""
        path = self.workdir / name.lstrip("@")
        path.write_text(text)
        exists = self.qconf(f"-s{kind}", name, check=False).returncode == 0
        self.qconf(f"-M{kind}" if exists else f"-A{kind}", str(path))

    def _diagnostics(self) -> str:
        parts = []
        for name, proc in self.procs.items():
            state = "running" if proc.poll() is None else f"exited with {proc.returncode}"
            parts.append(f"{name} ({state}) output:\n{tail(self.workdir / f'{name}.out', 10)}")
        parts.append(f"qmaster messages:\n{tail(self.logs['sge_qmaster'])}")
        for p in Path("/var/spool/gridengine/execd").glob("*/messages"):
            parts.append(f"execd messages ({p}):\n{tail(p)}")
        return "\n".join(parts)

    def _popen(self, name: str, program: Path) -> None:
        out = open(self.workdir / f"{name}.out", "w")
        # SGE_ND: no daemonizing, so the daemon stays our child and we know its pid.
        self.procs[name] = subprocess.Popen(
            [str(program)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            env={**self._genv(), "SGE_ND": "1"},
            start_new_session=True,
        )
        out.close()

    def _wait_for(self, what: str, ok: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SchedulerError(f"sge: {name} exited while waiting for {what}\n{self._diagnostics()}")
            if ok():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise SchedulerError(f"sge: no {what} after {timeout:.0f} s\n{self._diagnostics()}")

    def _configure(self) -> None:
        h = self.host
        # Root jobs (min_uid/gid 0), quicker load reports. The file must be named "global".
        glob = self.qconf("-sconf", "global").stdout
        lines = []
        for line in glob.splitlines():
            key = line.split(None, 1)[0] if line.strip() else ""
            if key in ("min_uid", "min_gid"):
                line = f"{key} 0"
            elif key == "load_report_time":
                line = "load_report_time 00:00:05"
            lines.append(line)
        (self.workdir / "global").write_text("\n".join(lines) + "\n")
        self.qconf("-Mconf", str(self.workdir / "global"))
        # Schedule every second instead of every 15 s.
        sconf = []
        for line in self.qconf("-ssconf").stdout.splitlines():
            key = line.split(None, 1)[0] if line.strip() else ""
            if key == "schedule_interval":
                line = "schedule_interval 0:0:1"
            elif key in ("flush_submit_sec", "flush_finish_sec"):
                line = f"{key} 1"
            sconf.append(line)
        (self.workdir / "sconf").write_text("\n".join(sconf) + "\n")
        self.qconf("-Msconf", str(self.workdir / "sconf"))
        # A consumable "gpu" complex, so that -l gpu=N (queue.pl --gpu N) is a real request.
        # Consumable per job (JOB), not per slot, so -pe smp 2 -l gpu=1 asks for one GPU.
        gpu_line = "gpu gpu INT <= YES JOB 0 0"
        complexes = [line for line in self.qconf("-sc").stdout.splitlines() if line.split()[:1] != ["gpu"]]
        if gpu_line not in self.qconf("-sc").stdout.splitlines():
            (self.workdir / "complexes").write_text("\n".join(complexes + [gpu_line]) + "\n")
            self.qconf("-Mc", str(self.workdir / "complexes"))
        self._apply(
            "p",
            "smp",
            "\n".join(
                [
                    "pe_name smp",
                    "slots 9999",
                    "user_lists NONE",
                    "xuser_lists NONE",
                    "start_proc_args NONE",
                    "stop_proc_args NONE",
                    "allocation_rule $pe_slots",
                    "control_slaves FALSE",
                    "job_is_first_task TRUE",
                    "urgency_slots min",
                    "accounting_summary FALSE",
                    "qsort_args NONE",
                ]
            )
            + "\n",
        )
        self._apply("hgrp", "@allhosts", f"group_name @allhosts\nhostlist {h}\n")
        self._apply(
            "e",
            h,
            "\n".join(
                [
                    f"hostname {h}",
                    "load_scaling NONE",
                    "complex_values gpu=1",
                    "user_lists NONE",
                    "xuser_lists NONE",
                    "projects NONE",
                    "xprojects NONE",
                    "usage_scaling NONE",
                    "report_variables NONE",
                ]
            )
            + "\n",
        )
        if h not in self.qconf("-ss", check=False).stdout.split():
            self.qconf("-as", h)
        template = self.qconf("-sq", "all.q", check=False)
        if template.returncode != 0:
            template = self.qconf("-sq")  # the default queue template
        settings = {
            "qname": "all.q",
            "hostlist": "@allhosts",
            "load_thresholds": "NONE",
            "pe_list": "smp",
            "slots": str(os.cpu_count() or 1),
            "shell": "/bin/bash",
            "shell_start_mode": "posix_compliant",
        }
        q = []
        for line in template.stdout.splitlines():
            key = line.split(None, 1)[0] if line.strip() else ""
            q.append(f"{key} {settings[key]}" if key in settings else line)
        self._apply("q", "all.q", "\n".join(q) + "\n")

    def _queue_ready(self) -> bool:
        out = _run(["qstat", "-f", "-q", "all.q"], env=self._genv(), timeout=10)
        for line in out.stdout.splitlines():
            f = line.split()
            # queuename qtype resv/used/tot load_avg arch [states]: ready when no states column
            if f and f[0].startswith("all.q@") and len(f) == 5 and f[3] != "-NA-":
                return True
        return False

    def _already_running(self) -> str | None:
        """A master or execution daemon that is not ours (e.g. left by a killed test run)."""
        if _run(["qconf", "-sh"], env=self._genv(), timeout=10).returncode == 0:
            return "an sge_qmaster already answers"
        for pidfile in [
            Path("/var/spool/gridengine/qmaster/qmaster.pid"),
            *Path("/var/spool/gridengine/execd").glob("*/execd.pid"),
        ]:
            try:
                pid = int(pidfile.read_text().split()[0])
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except (OSError, ValueError, IndexError):
                continue
            if comm.startswith("sge_"):
                return f"{comm} is already running (pid {pid}, from {pidfile})"
        return None

    def start(self) -> GridEngine:
        t0 = time.monotonic()
        running = self._already_running()
        if running:
            raise SchedulerError(
                f"sge: {running}; the tests start their own daemons. Stop it first "
                f"(SGE_ROOT={SGE_ROOT} SGE_CELL=default qconf -ke all -km, or kill the pid)"
            )
        # The host name resolves to 127.0.0.1, whose name is "localhost": tell SGE they are one.
        if not self.alias_file.exists():
            self.alias_file.write_text(f"{self.host} localhost\n")
            self.created_alias = True
        elif self.host not in self.alias_file.read_text().split():
            raise SchedulerError(f"sge: {self.alias_file} exists and does not alias {self.host}")
        self._popen("sge_qmaster", SGE_DAEMONS[0])
        self._wait_for(
            "answer from sge_qmaster",
            lambda: _run(["qconf", "-sh"], env=self._genv(), timeout=10).returncode == 0,
            self.start_timeout,
        )
        self._configure()
        self._popen("sge_execd", SGE_DAEMONS[1])
        self._wait_for("usable queue instance all.q@" + self.host, self._queue_ready, self.start_timeout)
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Delete every job, then stop the execution daemon and the master."""
        if self.procs.get("sge_qmaster") is not None and self.procs["sge_qmaster"].poll() is None:
            _run(["qdel", "-f", "-u", "*"], env=self._genv(), timeout=20)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                q = _run(["qstat", "-u", "*"], env=self._genv(), timeout=10)
                if q.returncode != 0 or not q.stdout.strip():
                    break
                time.sleep(0.2)
        # SIGTERM is the daemons' own orderly shutdown (what qconf -ke / -km ask for).
        for name in ("sge_execd", "sge_qmaster"):
            proc = self.procs.get(name)
            if proc is not None:
                _stop_process(proc, grace=20)
        if self.created_alias:
            self.alias_file.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running one-node Slurm for the session (see the module docstring)."""
    require("slurm")
    # A short path: munge's socket path must fit in sun_path (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="spkflow-slurm-"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        print(f"\nslurm started in {cluster.startup_seconds:.1f} s ({root})")
        yield cluster
    finally:
        t0 = time.monotonic()
        cluster.stop()
        print(f"\nslurm stopped in {time.monotonic() - t0:.1f} s")
        # keep the directory when something failed, so its logs can be read
        if all(p.returncode in (0, -signal.SIGTERM) for p in cluster.procs.values()):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def sge_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GridEngine]:
    """A running single-host Grid Engine for the session (see the module docstring)."""
    require("sge")
    workdir = tmp_path_factory.mktemp("sge")
    engine = GridEngine(workdir)
    try:
        engine.start()
        print(f"\ngrid engine started in {engine.startup_seconds:.1f} s")
        yield engine
    finally:
        t0 = time.monotonic()
        engine.stop()
        print(f"\ngrid engine stopped in {time.monotonic() - t0:.1f} s")
