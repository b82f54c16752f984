"""Thread pools of a job or a DataLoader worker: torch's, OpenMP's and BLAS's, pinned to its share.

What it guarantees
------------------
:func:`limit_threads` sets every thread pool of the calling process to ``n`` threads: torch's
intra-op pool (and its inter-op pool while that can still be set), every OpenMP and BLAS library
loaded (through ``threadpoolctl``: numpy's OpenBLAS, torch's libgomp, MKL, BLIS), and the
environment (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ...), so that what the process starts
afterwards (a spawned worker, a ``cmd |`` of a wav.scp) loads its libraries with ``n`` too.

Every place that runs work in parallel calls it with one line, and nowhere else sets threads:

* a DataLoader worker (:func:`worker_threads`, from the ``worker_init_fn`` of the extraction and
  training loaders): one thread; the workers are the parallelism;
* a job (stage 2 fbank and shard jobs, stage 5 extraction, diarization, the trainer): what it was
  given: its ``--num-threads`` where it has one, else :func:`job_threads`.

The same call keeps the process's freed heap memory for its next item
(:func:`spkflow.core.heap.keep_freed_memory`): the processes that run work are these.

Why: PyTorch sets only its own intra-op pool to one thread in a DataLoader worker; numpy's OpenBLAS
(a library of its own) keeps one thread per CPU in every worker, and so does OpenMP outside torch.
On a 16-CPU machine 14 extraction workers then ran 14 x 16 BLAS threads on 16 cores: the per-clip
fbank took ~0.2 s there against 6.5 ms with one thread on a 2-core VM (docs/gpu.md).  Kaldi and
ESPnet recipes rely on ``OMP_NUM_THREADS=1`` in ``path.sh``, which a user calling the library or a
command directly does not have, and which does not reach a pool already loaded; WeSpeaker and
SpeechBrain leave it to the user.
"""

from __future__ import annotations

import os
import sys

from spkflow.core.heap import keep_freed_memory

__all__ = ["THREAD_ENV", "job_threads", "limit_threads", "worker_threads"]

#: the environment variables the BLAS / OpenMP libraries read when they load
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
#: the variables by which a scheduler tells a job its CPUs (Slurm's --cpus-per-task, Grid Engine's -pe smp)
SCHEDULER_ENV = ("SLURM_CPUS_PER_TASK", "NSLOTS")


def _positive(value: str | None) -> int | None:
    try:
        n = int(value or "")
    except ValueError:
        return None
    return n if n > 0 else None


def job_threads() -> int:
    """The threads a job was given: ``OMP_NUM_THREADS`` where set (the stage scripts and
    ``path.sh`` set it), else the scheduler's count (``SLURM_CPUS_PER_TASK``, ``NSLOTS``), else
    the CPUs this process may run on."""
    for name in ("OMP_NUM_THREADS", *SCHEDULER_ENV):
        n = _positive(os.environ.get(name))
        if n is not None:
            return n
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def limit_threads(n: int) -> int:
    """Pin this process's torch, OpenMP and BLAS pools, and the environment its children inherit,
    to ``n`` threads, and keep its freed heap memory (see the module doc).  Returns ``n``."""
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    keep_freed_memory()  # the same processes' heap: an item's temporaries reused by the next
    for name in THREAD_ENV:
        os.environ[name] = str(n)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n)  # kept: not used as a context manager, nothing restores it
    torch = sys.modules.get("torch")  # torch only where it is loaded already: a numpy job stays light
    if torch is not None:
        torch.set_num_threads(n)
        try:
            torch.set_num_interop_threads(n)
        except RuntimeError:  # its pool started already (or was set): it stays as it is
            pass
    return n


def worker_threads(_worker_id: int = 0) -> None:
    """A DataLoader worker's share: one thread in every pool."""
    limit_threads(1)
