"""Recipes and stage scripts run as a user runs them: a recipe in a mirror of the project (so its
data/ lands in a temporary folder), and the extraction script with its environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.paths import ROOT
from helpers.spread import THREADS

RECIPE = Path("egs") / "speechocean762" / "spk1"
SCRIPT = ROOT / "scripts" / "spk" / "extract_embeddings.sh"
PY = Path(sys.executable)


def mirror_recipe(tmp: Path, recipe_rel: Path = RECIPE) -> Path:
    """A project tree of links whose recipe dir is a real folder; returns the recipe dir."""
    proj = tmp / "proj"
    (proj / "egs").mkdir(parents=True)
    for name in (".venv", "spkflow", "utils", "local", "scripts"):
        if (ROOT / name).exists():
            (proj / name).symlink_to(ROOT / name)
    (proj / "egs" / "TEMPLATE").symlink_to(ROOT / "egs" / "TEMPLATE")
    recipe = proj / recipe_rel
    recipe.mkdir(parents=True)
    for entry in (ROOT / recipe_rel).iterdir():
        if entry.name in ("data", "dump", "exp"):
            continue
        target = os.readlink(entry) if entry.is_symlink() else entry  # relative links stay relative
        (recipe / entry.name).symlink_to(target)
    return recipe


def linked_recipe(tmp: Path, name: str) -> Path:
    """``tmp/egs/speechocean762/<name>``: links to the entries of that recipe of the project (its
    outputs, README.md and RESULTS.md left out), so that its data/, dump/ and exp/ land under tmp."""
    real = ROOT / "egs" / "speechocean762" / name
    recipe = tmp / "egs" / "speechocean762" / name
    recipe.mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name not in ("data", "dump", "exp", "README.md", "RESULTS.md"):
            (recipe / entry.name).symlink_to(entry.resolve() if entry.is_symlink() else entry)
    return recipe


def template_recipe(recipe: Path, template_path_sh: bool = False) -> Path:
    """A recipe dir of egs/TEMPLATE/spk1's scripts (spk.sh, cmd.sh, db.sh), the project's utils/
    and scripts/, and a path.sh pointing at this checkout, one thread per process (with
    ``template_path_sh``: a link to TEMPLATE's own path.sh, which finds the checkout through the
    link); returns it."""
    recipe.mkdir(parents=True)
    for name in ("spk.sh", "cmd.sh", "db.sh") + (("path.sh",) if template_path_sh else ()):
        (recipe / name).symlink_to(ROOT / "egs" / "TEMPLATE" / "spk1" / name)
    for name in ("utils", "scripts"):
        (recipe / name).symlink_to(ROOT / name)
    if not template_path_sh:
        (recipe / "path.sh").write_text(
            f"export PATH={ROOT}/utils:{PY.parent}:$PATH\nexport PYTHONPATH={ROOT}\n"
            "export LC_ALL=C\nexport OMP_NUM_THREADS=1\n"
        )
    return recipe


def env() -> dict[str, str]:
    """The environment the project's commands and scripts run with from a test: this checkout's
    Python and utils/ first on PATH, the checkout on PYTHONPATH, one thread, the C locale."""
    e = dict(os.environ)
    e["PATH"] = f"{PY.parent}:{ROOT / 'utils'}:{e['PATH']}"
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), e.get("PYTHONPATH")]))  # keeps a --target site
    e["OMP_NUM_THREADS"] = str(THREADS)  # 1 unless measuring (helpers.spread)
    e["LC_ALL"] = "C"
    return e


def run(args: list, check: bool = True, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """``args`` (paths allowed) run with :func:`env`, output captured; ``check``: a failure raises
    with the exit status and the output's tail."""
    p = subprocess.run(list(map(str, args)), env=env(), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


def extract(toolkit: str, model: Path, data: Path, out: Path, *opts: str) -> tuple[list[str], dict]:
    """scripts/spk/extract_embeddings.sh --toolkit ``toolkit`` --nj 2 ``opts`` (run from the
    checkout) on ``data`` into ``out``; checks that it succeeded and that xvector.scp holds one
    embedding per utterance in the data dir's order.  Returns the utterances and the embeddings."""
    import kaldiio

    run(["bash", SCRIPT, "--toolkit", toolkit, "--nj", "2", *opts, "--model-dir", model, data, out], cwd=ROOT)
    utts = (data / "utt2spk").read_text().split()[::2]
    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    assert list(xv) == utts
    return utts, xv
