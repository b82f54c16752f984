"""Scripts import the spkflow of their own checkout, whatever venv is active.

The venv these tests run in (``sys.executable``) was made by tools/setup.sh in some checkout and
holds an editable install of that one.  Here a second checkout is made (a copy of this one's
tracked and untracked-but-not-ignored files, what ``git worktree add`` of the working tree would
give) and its scripts are run with that venv active and no PYTHONPATH: they must import the
second checkout's spkflow.  To see which copy a process imported, the copy's
``spkflow/__init__.py`` gets a few lines appending its own path to ``$SPKFLOW_IMPORT_LOG`` when a
command (not a ``python -c`` probe of a script) imports it (the only change made to the copy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.paths import ROOT

VENV_BIN = Path(sys.executable).parent


def make_checkout(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
    ).stdout.decode()
    for rel in filter(None, files.split("\0")):
        src, dst = ROOT / rel, dest / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    init = dest / "spkflow" / "__init__.py"
    init.write_text(
        init.read_text() + "\nimport os as _os\nimport sys as _sys\n"
        "if _os.environ.get('SPKFLOW_IMPORT_LOG') and _sys.argv[0] != '-c':  # not the scripts' `python -c` probes\n"
        "    with open(_os.environ['SPKFLOW_IMPORT_LOG'], 'a') as _f:\n"
        "        _f.write(_os.path.realpath(__file__) + '\\n')\n"
    )
    return dest


def venv_env(log: Path) -> dict[str, str]:
    """The venv of the test run active (PATH, VIRTUAL_ENV), nothing on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPKFLOW_PYTHON", "VIRTUAL_ENV")}
    env.update(
        PATH=f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        VIRTUAL_ENV=str(VENV_BIN.parent),
        LC_ALL="C",
        SPKFLOW_IMPORT_LOG=str(log),
        OMP_NUM_THREADS="1",
    )
    return env


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkout(tmp_path_factory.mktemp("second") / "spkflow-copy")


def imported(log: Path) -> set[str]:
    return set(log.read_text().split()) if log.exists() else set()


def test_the_venv_alone_imports_another_spkflow(checkout: Path, tmp_path: Path) -> None:
    """The hazard: with the venv active and no PYTHONPATH, `python -m spkflow...` run from the
    copy's recipe dir does not import the copy (it gets the venv's editable install, if any)."""
    recipe = checkout / "egs" / "speechocean762" / "spk1"
    log = tmp_path / "imports"
    subprocess.run(
        ["python", "-m", "spkflow.bin.make_batches", "--help"], cwd=recipe, env=venv_env(log), capture_output=True
    )
    assert not imported(log)


@pytest.mark.parametrize("own_venv", [False, True], ids=["active-venv", "venv-link"])
def test_stage_script_imports_its_own_checkout(checkout: Path, tmp_path: Path, own_venv: bool) -> None:
    """spk.sh stage 3 of the copy (path.sh: the copy's .venv link, or the active venv when the copy
    has none) plans its batches with the copy's spkflow."""
    venv_link = checkout / ".venv"
    if own_venv:
        venv_link.symlink_to(VENV_BIN.parent)
    try:
        recipe = checkout / "egs" / "speechocean762" / "spk1"
        data = recipe / "data" / "train"
        data.mkdir(parents=True, exist_ok=True)
        data.joinpath("spk2utt").write_text(
            "".join(f"s{s} " + " ".join(f"s{s}-u{u}" for u in range(4)) + "\n" for s in range(6))
        )
        log = tmp_path / "imports"
        r = subprocess.run(
            ["bash", "spk.sh", "--stage", "3", "--stop_stage", "3", "--expdir", str(tmp_path / "exp"),
             "--num_spk", "2", "--num_utt", "2", "--num_epochs", "1", "--dumpdir", str(tmp_path / "dump")],
            cwd=recipe,
            env=venv_env(log),
            capture_output=True,
            text=True,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert list((tmp_path / "exp").glob("spk_*/batches/epoch1.txt"))
        assert imported(log) == {str((checkout / "spkflow" / "__init__.py").resolve())}
    finally:
        if venv_link.is_symlink():
            venv_link.unlink()


def test_standalone_script_imports_its_own_checkout(checkout: Path, tmp_path: Path) -> None:
    """scripts/spk/score.sh of the copy, run without a recipe's path.sh, with the venv active:
    utils/spkflow_python.sh puts the copy first."""
    import kaldiio

    rng = np.random.default_rng(0)
    utts = [f"s{s}-u{u}" for s in range(3) for u in range(2)]
    centres = rng.normal(size=(3, 8))
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/xv.ark,{tmp_path}/xvector.scp") as w:
        for u in utts:
            w(u, (centres[int(u[1])] + 0.1 * rng.normal(size=8)).astype(np.float32))
    trials = tmp_path / "trials"
    trials.write_text(
        "".join(f"{a} {b} {'target' if a[:2] == b[:2] else 'nontarget'}\n" for a in utts for b in utts if a < b)
    )
    log = tmp_path / "imports"
    work = tmp_path / "work"  # not the checkout: python -m would import from the working directory
    work.mkdir()
    (work / "utils").symlink_to(checkout / "utils")  # (score.sh on main sources utils/parse_options.sh from here)
    r = subprocess.run(
        ["bash", str(checkout / "scripts" / "spk" / "score.sh"), str(trials), str(tmp_path / "xvector.scp"),
         str(tmp_path / "eval")],
        cwd=work,
        env=venv_env(log),
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert imported(log) == {str((checkout / "spkflow" / "__init__.py").resolve())}
