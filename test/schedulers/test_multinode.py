"""Multi-node training through a real Slurm: scripts/spk/train.sh --num-nodes 2 submits one job
of two tasks (utils/slurm.pl --num-nodes), each running torchrun with a c10d rendezvous
(scripts/spk/torchrun_node.sh), gloo on CPU.

The test cluster (test/helpers/schedulers.py) has one node, so the two tasks share it: the recipe
config's translation ``--num-nodes K -> --nodes=K --ntasks-per-node=1`` is replaced here by
``--ntasks=K`` (the only stand-in; what each task runs, the rendezvous, srun
--kill-on-bad-exit and torchrun are the real ones). The default translation is checked in
test_slurm_pl.py, where a one-node cluster refuses ``--nodes=2``.

Checked: the two-task run gives the same model as ``torchrun --standalone --nproc_per_node 2``
(max abs difference <= 1e-6); a rank killed (SIGKILL) in the middle of epoch 2 fails the job
within a time limit, the failure names the killed rank's log, the epoch-1 checkpoint is
kept, and running again resumes from it to the same model. Without Slurm only the fast
checks run (K > 1 with run.pl is an error).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.paths import ROOT
from helpers.recipes import template_recipe
from helpers.schedulers import SlurmCluster
from helpers.train import make_train_sh_setup, train_sh_command

VENV_BIN = ROOT / ".venv" / "bin"

# The recipe's conf/slurm.conf, but the K tasks share the test cluster's one node.
ONE_NODE_CONF = """command sbatch --export=ALL
option mem=* --mem=$0
option mem=0
option num_threads=* --cpus-per-task=$0
option num_threads=1
default gpu=0
option gpu=0
option gpu=* --gres=gpu:$0
option num_nodes=* --ntasks=$0
"""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", **(extra or {}))
    env["PATH"] = f"{VENV_BIN}:{ROOT / 'utils'}:{env.get('PATH', '')}"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    s = make_train_sh_setup(tmp_path_factory.mktemp("multinode"), epochs=2)
    (s["root"] / "slurm.conf").write_text(ONE_NODE_CONF)
    return s


def train_sh(
    setup: dict[str, Any], out: Path, *opts: str, env: dict[str, str] | None = None, wait: bool = True
) -> subprocess.CompletedProcess | subprocess.Popen:
    cmd = train_sh_command(setup, out, setup["config_path"], *opts)
    kw: dict[str, Any] = dict(cwd=setup["root"], env=env or _env(), text=True)
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    return subprocess.run(cmd, capture_output=True, timeout=600, **kw)


def slurm_opts(cluster: SlurmCluster, setup: dict[str, Any]) -> list[str]:
    return ["--cmd", f"slurm.pl --config {setup['root'] / 'slurm.conf'} --mem 3G", "--num-nodes", "2"]


def max_abs_diff(a: Path, b: Path) -> float:
    sa, sb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert sa.keys() == sb.keys()
    return max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa)


def test_more_than_one_node_with_run_pl_is_a_clear_error(setup: dict[str, Any], tmp_path: Path) -> None:
    r = train_sh(setup, tmp_path / "exp", "--cmd", "run.pl", "--num-nodes", "2")
    assert r.returncode == 1
    assert "--num-nodes 2 needs a Slurm job runner" in r.stderr and "cmd_backend=slurm" in r.stderr
    assert not (tmp_path / "exp").exists()  # nothing started
    r = subprocess.run(
        [str(ROOT / "utils" / "run.pl"), "--num-nodes", "2", str(tmp_path / "x.log"), "true"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "needs a scheduler" in r.stderr and not (tmp_path / "x.log").exists()


def test_spk_sh_refuses_num_nodes_with_the_local_backend(tmp_path: Path) -> None:
    recipe = ROOT / "egs" / "speechocean762" / "spk1"
    r = subprocess.run(
        ["./spk.sh", "--stage", "4", "--stop_stage", "4", "--num_nodes", "2", "--expdir", str(tmp_path / "exp")],
        cwd=recipe,
        env=_env({"cmd_backend": "local"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "--num_nodes 2 needs cmd_backend=slurm" in r.stdout + r.stderr
    assert not (tmp_path / "exp").exists()


@pytest.fixture(scope="module")
def reference(setup: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--num-nodes 1 --nproc 2``: torchrun --standalone with two gloo processes."""
    out = tmp_path_factory.mktemp("ref") / "exp"
    r = train_sh(setup, out, "--cmd", "run.pl", "--nproc", "2")
    assert r.returncode == 0, r.stderr + (out / "train.log").read_text()[-4000:]
    assert "--standalone" in (out / "train.log").read_text().splitlines()[0]
    return out


def worker_pid(out: Path, rank: int) -> int | None:
    """The training worker of ``rank`` writing to ``out`` (its environment has RANK)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"spkflow.bin.train" in cmdline and str(out).encode() in cmdline and f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


@pytest.fixture
def on_slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The session's Slurm, its environment (SLURM_CONF, PATH) set for this test's commands."""
    for k, v in slurm_cluster.env.items():
        monkeypatch.setenv(k, v)
    return slurm_cluster


@pytest.mark.slurm
@pytest.mark.slow
def test_two_slurm_tasks_train_the_same_model_as_two_local_processes(
    on_slurm: SlurmCluster,
    setup: dict[str, Any],
    reference: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "exp"
    r = train_sh(setup, out, *slurm_opts(on_slurm, setup))
    log = (out / "train.log").read_text()
    assert r.returncode == 0, r.stderr + log[-4000:]
    # one Slurm job of two tasks, each a torchrun agent of a two-node c10d rendezvous
    assert "2 tasks on" in log
    assert log.count("torchrun --nnodes 2 --nproc_per_node 1, c10d rendezvous") == 2
    assert "task 0 of 2" in log and "task 1 of 2" in log
    assert "DDP: rank 0 of 2 (gloo)" in log and "# Ended (code 0)" in log
    assert "DDP: rank 1 of 2 (gloo)" in (out / "log" / "train.rank1.log").read_text()
    script = (out / "q" / "train.sh").read_text()
    assert "#SBATCH --ntasks=2" in script and "srun --kill-on-bad-exit=1" in script
    # each rank trained on its own lines r, r+2, ... as in the standalone run
    for rank in (0, 1):
        assert (out / f"batch_trace.rank{rank}.txt").read_text() == (
            reference / f"batch_trace.rank{rank}.txt"
        ).read_text()
    diff = max_abs_diff(out / "model.pth", reference / "model.pth")
    assert diff <= 1e-6, diff


@pytest.mark.slurm
@pytest.mark.slow
def test_a_killed_rank_fails_the_job_and_the_next_run_resumes(
    on_slurm: SlurmCluster,
    setup: dict[str, Any],
    reference: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "exp"
    proc = train_sh(setup, out, *slurm_opts(on_slurm, setup), wait=False)
    assert isinstance(proc, subprocess.Popen)
    trace = out / "batch_trace.rank1.txt"
    killed_at = None
    deadline = time.monotonic() + 400
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            # rank 1 at epoch 2, step >= 1: both ranks are past the end-of-epoch-1 checkpoint
            lines = trace.read_text().splitlines() if trace.exists() else []
            if any(line.split()[:1] == ["2"] and int(line.split()[1]) >= 1 for line in lines):
                pid = worker_pid(out, 1)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                    break
            time.sleep(0.005)
        assert killed_at is not None, "training ended (or timed out) before rank 1 could be killed in epoch 2"
        stdout, stderr = proc.communicate(timeout=180)  # no hang: the job fails within 3 minutes
    finally:
        if proc.poll() is None:
            proc.kill()
    failed_in = time.monotonic() - killed_at
    assert proc.returncode == 1, stderr
    assert "slurm.pl: job failed" in stderr and f"{out}/train.log" in stderr
    assert f"Failed: rank 1 (killed by signal 9), log: {out}/log/train.rank1.log" in stderr
    assert f"re-running stage 4 (spk.sh --stage 4, same options) resumes from {out}/checkpoint.pth" in stderr
    steps_done = len([ln for ln in trace.read_text().splitlines() if ln.startswith("2 ")])
    assert steps_done < 6, "rank 1 finished epoch 2 before it was killed"
    ck = torch.load(out / "checkpoint.pth", weights_only=True)
    assert (ck["epoch"], ck["batch"]) == (2, 0)  # the end of epoch 1
    assert not (out / "model.pth").exists()
    print(f"\njob failed {failed_in:.1f} s after rank 1 was killed")

    r = train_sh(setup, out, *slurm_opts(on_slurm, setup))
    assert r.returncode == 0, r.stderr + (out / "train.log").read_text()[-4000:]
    assert "Resuming from" in r.stderr and (out / "train.log.1").exists()
    assert (out / "log" / "train.rank1.log.1").exists()
    diff = max_abs_diff(out / "model.pth", reference / "model.pth")
    assert diff <= 1e-6, diff


@pytest.mark.slow
def test_spk_sh_stage4_says_that_rerunning_resumes(setup: dict[str, Any], tmp_path: Path) -> None:
    """spk.sh stage 4 through scripts/spk/train.sh in a recipe dir: a training that fails in
    epoch 2 (a batch list naming an unknown utterance, standing for any mid-training failure)
    keeps the epoch-1 checkpoint, shows the error and says that once it is fixed re-running
    stage 4 resumes; it does."""
    recipe = template_recipe(tmp_path / "recipe", template_path_sh=True)
    shutil.copytree(setup["conf"], recipe / "conf")
    shutil.copy(setup["config_path"], recipe / "conf" / "train.yaml")
    shutil.copytree(setup["feats"], recipe / "dump" / "fbank" / "train", symlinks=True)
    batches = recipe / "exp" / "spk_train" / "batches"
    shutil.copytree(setup["batches"], batches)
    good = (batches / "epoch2.txt").read_text()
    lines = good.splitlines()
    lines[2] = " ".join(["nobody-utt99"] * len(lines[2].split()))
    (batches / "epoch2.txt").write_text("\n".join(lines) + "\n")
    args = ["./spk.sh", "--stage", "4", "--stop_stage", "4", "--num_epochs", "2", "--num_utt", "2"]
    args += ["--train_threads", "1", "--test_sets", "none"]
    env = _env({"cmd_backend": "local"})
    r = subprocess.run(args, cwd=recipe, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "spkflow.bin.train: error:" in out and "nobody-utt99" in out
    assert "Fix the error above; then re-running stage 4 (spk.sh --stage 4, same options) resumes from" in out
    ck = torch.load(recipe / "exp" / "spk_train" / "checkpoint.pth", weights_only=True)
    assert ck["epoch"] == 2  # the end of epoch 1
    (batches / "epoch2.txt").write_text(good)
    r = subprocess.run(args, cwd=recipe, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Resuming from exp/spk_train/checkpoint.pth" in out and "Stage 4 output" in out
    assert (recipe / "exp" / "spk_train" / "train.log.1").exists()
    assert (recipe / "exp" / "spk_train" / "model.pth").exists()


def test_train_sh_resume_false_starts_afresh(setup: dict[str, Any], tmp_path: Path) -> None:
    """train.sh hands --resume true|false on to spkflow.bin.train (the true|false convention):
    with --resume false a second run into a dir with a checkpoint does not resume from it."""
    out = tmp_path / "exp"
    r = train_sh(setup, out, "--cmd", "run.pl", "--nproc", "1")
    assert r.returncode == 0, r.stderr + (out / "train.log").read_text()[-4000:]
    assert "--resume true" in (out / "train.log").read_text().splitlines()[0]
    assert (out / "checkpoint.pth").exists()
    r = train_sh(setup, out, "--cmd", "run.pl", "--nproc", "1", "--resume", "false")
    assert r.returncode == 0, r.stderr + (out / "train.log").read_text()[-4000:]
    assert "--resume false" in (out / "train.log").read_text().splitlines()[0]
    assert "Resuming from" not in r.stderr
