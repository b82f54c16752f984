"""Measurement: SIGTERM to a recipe's run.sh one step into training, as a user or a batch system sends
it: seconds until no process of the run is left, and whether the checkpoint was written.

    .venv/bin/python test/bench/bench_stop.py [--nproc 1] [--config conf/train.yaml] [--work DIR]

A recipe made by egs/TEMPLATE/spk1/setup.sh in ``--work`` (default: a temporary folder, removed
afterwards) on 20 speakers x 6 synthetic one-second clips; stages 1-3 with ``--num_spk 8 --num_utt 2``,
then stage 4 with ``--config`` (the template's 6.19 M-parameter ECAPA by default, logging every step)
on ``--nproc`` processes.  One step after training starts, run.sh's pid gets SIGTERM; printed: the
seconds until no process has the recipe as its working directory, run.sh's exit status, the
supervisors' lines (who was killed or waited for) and the trainer's stop line (where the checkpoint
is and how long it took to write).  The figures of docs/training.md ("A checkpoint at the signal").
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.audio import make_speakers  # noqa: E402
from helpers.paths import TEMPLATE  # noqa: E402
from helpers.procs import processes_in, start_from_a_terminal, wait_until  # noqa: E402
from helpers.recipes import env, run  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=1, help="training processes (torchrun when > 1)")
    p.add_argument("--config", default="conf/train.yaml", help="training config, relative to the recipe")
    p.add_argument("--work", default=None, help="where the recipe goes (default: a temporary folder)")
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_stop."))
    try:
        audio = make_speakers(work / "corpus", num_spk=20, num_utt=6, seed=1, min_sec=0.8, max_sec=1.2).parent
        recipe = work / "egs" / "mine" / "spk1"
        run(["bash", TEMPLATE / "setup.sh", recipe], cwd=work)
        text = (recipe / args.config).read_text()  # the config, logging every step
        if "\ntrain:\n" in text:
            text = text.replace("\ntrain:\n", "\ntrain:\n  log_every: 1\n", 1)
        else:
            text += "train:\n  log_every: 1\n"
        (recipe / "bench.yaml").write_text(text)
        opts = ["--num_spk", "8", "--num_utt", "2", "--num_epochs", "2", "--train_config", "bench.yaml"]
        opts += ["--nproc", str(args.nproc), "--tag", "bench"]
        data = f"--train_dir {audio / 'audio'} --test_dir {audio / 'audio'}"
        run(["./run.sh", "--stage", "1", "--stop_stage", "3", "--local_data_opts", data, *opts], cwd=recipe)
        log = recipe / "exp" / "spk_bench" / "train.log"

        def steps() -> int:
            try:
                return sum(" step " in line and " loss " in line for line in log.read_text().splitlines())
            except OSError:
                return 0

        proc = start_from_a_terminal(["./run.sh", "--stage", "4", "--stop_stage", "4", *opts], env(), cwd=recipe)
        if not wait_until(lambda: steps() >= 1 or proc.poll() is not None, 1800) or proc.poll() is not None:
            print("training did not start:", proc.communicate()[1][-2000:])
            return 1
        count = len(processes_in(recipe))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        gone = wait_until(lambda: not processes_in(recipe), 300)
        took = time.monotonic() - t0
        _, err = proc.communicate(timeout=60)
        load = os.getloadavg()[0]
        print(f"{count} processes; all gone: {gone}, {took:.1f} s after SIGTERM; run.sh exit {proc.returncode}")
        print(f"  load average {load:.1f} on {os.cpu_count()} CPUs")
        for line in err.splitlines():
            if "killing" in line or "waiting for" in line:
                print("  " + line)
        for line in log.read_text().splitlines():
            if "stopped by" in line or "checkpoint will be written" in line:
                print("  " + line.split("INFO: ")[-1].split("WARNING: ")[-1])
        print("  checkpoint.pth:", "written" if (log.parent / "checkpoint.pth").is_file() else "none")
        return 0
    finally:
        for q in processes_in(work):
            subprocess.run(["kill", "-KILL", str(q)], check=False)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
