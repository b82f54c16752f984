"""The trainer's own step loop, timed: what stage 4 gets of the model alone, beside bench_gpu.py's loops.

bench_gpu.py's training rows feed each loader path to the benchmark's own step (forward, AAM,
backward, clipping, the scaler), so that a row's figure is the loader's.  A user runs
:class:`spkflow.train.trainer.Trainer`, whose step also builds the labels, re-seeds torch, reads the
loss and the gradient norm back to the host (its divergence checks), takes its lock and feeds the
monitor.  :func:`time_trainer` runs that trainer, unchanged, on the raw path with the recipe's
augmentation and ``train.fbank_on`` as the config has it (``auto``: on the GPU there), for
``warmup + steps`` steps of one epoch, and times the ``steps`` after the warm-up: the device is
synchronised at both ends, and the loop's waits for batches are the trainer's own
(:class:`spkflow.core.batch_wait.BatchWait` of its monitor) over the same span.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def time_trainer(
    config: Mapping[str, Any],
    data: Path,
    batches: Sequence[Sequence[str]],
    work: Path,
    device: str,
    warmup: int,
    steps: int,
    sync: Callable[[Any], None],
    window: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> dict[str, Any]:
    """Train ``config`` on ``data`` over the first ``warmup + steps`` of ``batches`` (epoch 1's list)
    in ``work / "trainer"``; ``{"steps_per_s", "data_wait_share"}`` of the ``steps`` after the
    warm-up.  ``sync(device)`` waits for the device; ``window()`` is entered for the timed steps
    (bench_gpu.py's GPU sampler)."""
    import torch

    from spkflow.train.build import TrainOptions
    from spkflow.train.trainer import Trainer

    need = warmup + steps
    if len(batches) < need:
        raise ValueError(f"{len(batches)} batches for {need} steps")
    out = work / "trainer"
    shutil.rmtree(out, ignore_errors=True)
    (out / "batches").mkdir(parents=True)
    (out / "batches" / "epoch1.txt").write_text("".join(" ".join(b) + "\n" for b in batches[:need]))
    opts = TrainOptions(
        config=config,
        train_data=str(data),
        train_feats=str(data),  # nothing read there: audio crops, no VAD, no input statistics
        batches_dir=str(out / "batches"),
        out_dir=str(out / "exp"),
        num_epochs=1,
        max_steps=need,
        device=device,
        progress=False,
        resume=False,
    )
    trainer = Trainer(opts)
    step = trainer._step
    dev = torch.device(device)
    marks: dict[int, tuple[float, float]] = {}
    timed = contextlib.ExitStack()

    def counted(run: Any, *args: Any, **kwargs: Any) -> Any:
        flags = step(run, *args, **kwargs)
        if run.step in (warmup, need):  # steps done: the window's two ends
            sync(dev)
            marks[run.step] = (time.perf_counter(), run.monitor.wait.rest)
            if run.step == warmup:
                timed.enter_context(window())
            else:
                timed.close()
        return flags

    trainer._step = counted  # type: ignore[method-assign]
    try:
        trainer.run()
    finally:
        timed.close()
    if set(marks) != {warmup, need}:
        raise RuntimeError(f"the trainer took {max(marks, default=0)} of {need} steps")
    (t0, w0), (t1, w1) = marks[warmup], marks[need]
    return {"steps_per_s": round(steps / (t1 - t0), 3), "data_wait_share": round((w1 - w0) / (t1 - t0), 4)}
