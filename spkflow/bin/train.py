"""Train a speaker embedder on N x M batch lists (stage 4 of spk.sh).

    python -m spkflow.bin.train --config conf/train.yaml --train-data data/train \\
        --train-feats dump/fbank/train --batches-dir exp/spk_x/batches --num-epochs 10 \\
        --out-dir exp/spk_x [--valid-data data/test --valid-feats dump/fbank/test] \\
        [--fbank-conf conf/fbank.conf --vad-conf conf/vad.conf] [--num-utt M] [--resume true|false] \\
        [--resume-new-schedule true|false] \\
        [--max-steps K] [--device auto|cpu|cuda] [--progress true|false] [--trace-batches true|false]

Several processes: ``torchrun --nproc_per_node P -m spkflow.bin.train ...`` (DDP; gloo on CPU,
NCCL on GPU; several nodes: scripts/spk/train.sh --num-nodes K).  Under DDP each rank also logs
at INFO to ``<out-dir>/log/train.rank<R>.log``; the console gets rank 0's INFO, others' warnings.
Exit status: 0 done (or stopped by --max-steps, with a checkpoint), 128 + N
stopped by signal N (SIGINT/SIGTERM/SIGHUP: the checkpoint of the last completed step is written at
the signal and the process ends without finishing the step in progress; rerun to resume), 1 bad input, a
non-finite loss, a failed write (the message names the file/line or the batch) or a resume
refused because the config differs from the checkpoint's (the message names each key and
both values), 2 bad arguments.  Errors are one line ``python -m spkflow.bin.train: error: ...``.
The training itself is :class:`spkflow.train.trainer.Trainer`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin.argtypes import add_bool_option
from spkflow.core.checks import ConfigError
from spkflow.core.errors import InputError
from spkflow.core.threads import limit_threads
from spkflow.train.process import configure_logging, end_process, torch_threads


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="training config (YAML; see spkflow/train/config.py)")
    p.add_argument("--train-data", required=True, help="training data dir (utt2spk)")
    p.add_argument(
        "--train-feats",
        required=True,
        help="its features dir (feats.scp, vad.scp) from stage 2; not read when the config trains on audio alone",
    )
    p.add_argument("--batches-dir", required=True, help="dir with epoch<E>.txt batch lists from stage 3")
    p.add_argument("--num-epochs", type=int, required=True, help="epochs to train (batch lists 1..E)")
    p.add_argument("--out-dir", required=True, help="experiment dir (config.yaml, checkpoints, model.pth)")
    p.add_argument("--num-utt", type=int, default=None, help="M utterances per speaker (default: from the lists)")
    p.add_argument("--valid-data", default=None, help="data dir with a trials file for validation EER")
    p.add_argument("--valid-feats", default=None, help="its features dir (default: --valid-data)")
    p.add_argument("--fbank-conf", default=None, help="stage 2 fbank options, recorded in config.yaml")
    p.add_argument("--vad-conf", default=None, help="stage 2 VAD options, recorded in config.yaml")
    add_bool_option(
        p,
        "--resume",
        default=True,
        old_negative="--no-resume",
        bare=True,
        help="continue from <out-dir>/checkpoint.pth when present",
    )
    add_bool_option(
        p,
        "--resume-new-schedule",
        default=False,
        bare=True,
        help="resume even though optim.lr / weight_decay / momentum, the scheduler, grad_clip or the number "
        "of epochs differ from the checkpoint's: they apply from the resume point and are recorded in "
        "config.yaml (other differences are always refused; spkflow.train.resume)",
    )
    add_bool_option(
        p,
        "--shards",
        default=None,
        help="read the crops from <train-feats>/shards (stage 2 with --train_shards true; the config's train.shards)",
    )
    p.add_argument("--max-steps", type=int, default=None, help="stop after this global step (with a checkpoint)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument(
        "--num-threads",
        type=int,
        default=0,
        help="torch threads per process (0: CPUs available to this job / local processes)",
    )
    add_bool_option(p, "--progress", default=True, old_negative="--no-progress", bare=True, help="tqdm bar on stderr")
    add_bool_option(
        p,
        "--trace-batches",
        default=False,
        bare=True,
        help="log the batches each rank trains on to <out-dir>/batch_trace.rank<R>.txt",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    configure_logging(args.out_dir)
    if args.num_epochs < 1:
        get_parser().error("--num-epochs must be >= 1")

    limit_threads(torch_threads(args.num_threads))  # torch (loaded above), OpenMP and BLAS pools
    from spkflow.train.config import load_train_config
    from spkflow.train.trainer import Trainer, TrainingDiverged, TrainOptions

    stopped = 0
    try:
        config = load_train_config(args.config)
        if args.shards is not None:
            config.setdefault("train", {})["shards"] = args.shards
        opts = TrainOptions(
            config=config,
            train_data=args.train_data,
            train_feats=args.train_feats,
            batches_dir=args.batches_dir,
            out_dir=args.out_dir,
            num_epochs=args.num_epochs,
            num_utt=args.num_utt,
            valid_data=args.valid_data,
            valid_feats=args.valid_feats,
            fbank_conf=args.fbank_conf,
            vad_conf=args.vad_conf,
            resume=args.resume,
            resume_new_schedule=args.resume_new_schedule,
            max_steps=args.max_steps,
            device=args.device,
            progress=args.progress,
            trace_batches=args.trace_batches,
            config_source=args.config,
        )
        trainer = Trainer(opts, exit_on_signal=True)
        trainer.run()
        if trainer.stopped_by == "signal":
            stopped = 128 + trainer.stop_signal  # the shell convention: the pipeline must not go on
            return stopped
    except (ConfigError, InputError, TrainingDiverged, OSError, KeyError) as err:
        # OSError: a failed write (spkflow.core.atomic names the file) or a missing file
        logging.getLogger("spkflow.bin.train").error("%s", err)
        print(f"{get_parser().prog}: error: {err}", file=sys.stderr)
        return 1
    finally:
        end_process(stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
