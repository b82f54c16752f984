"""One training process's surroundings: where its log lines go, how many torch threads it uses, how it ends.

Under ``torchrun`` every rank is a process of its own: the console (``train.log``) gets rank 0's
INFO lines and the other ranks' warnings, and each rank also writes its full log to
``<out-dir>/log/train.rank<R>.log``, so that a failure on rank 3 can be read without rank 0's lines
around it.  Threads: a rank takes its share of the CPUs this job may use (the affinity mask that
Slurm / Grid Engine set, not the machine's count), so P local processes never oversubscribe.
"""

from __future__ import annotations

import logging
import os
import sys


def configure_logging(out_dir: str) -> None:
    """The root logger of this rank (``RANK``, ``WORLD_SIZE`` from torchrun's environment)."""
    rank = int(os.environ.get("RANK", "0"))
    console = logging.StreamHandler()
    console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    handlers: list[logging.Handler] = [console]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        os.makedirs(os.path.join(out_dir, "log"), exist_ok=True)
        handlers.append(logging.FileHandler(os.path.join(out_dir, "log", f"train.rank{rank}.log")))
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s (%(module)s:%(lineno)d) [rank {rank}] %(levelname)s: %(message)s",
        handlers=handlers,
    )


def torch_threads(requested: int) -> int:
    """``requested`` when > 0, else the CPUs this process may run on divided among the local ranks
    (``LOCAL_WORLD_SIZE``), at least 1."""
    if requested > 0:
        return requested
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def end_process(stopped: int) -> None:
    """Leave the DDP group; after a stop by a signal (``stopped`` = 128 + N, the checkpoint already
    written and fsynced) exit at once: the interpreter's teardown (garbage collection under torch)
    takes seconds on a busy machine, beyond the grace time a supervisor (utils/supervise.sh, Slurm)
    gives before SIGKILL."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    if stopped:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stopped)
