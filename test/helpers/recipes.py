"""Recipes and stage scripts run as a user runs them: a recipe in a mirror of the project (so its
data/ lands in a temporary folder), and the extraction script with its environment."""

from __future__ import annotations

import os
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


def template_recipe(recipe: Path) -> Path:
    """A recipe dir of egs/TEMPLATE/spk1's scripts (spk.sh, cmd.sh, db.sh), the project's utils/
    and scripts/, and a path.sh pointing at this checkout, one thread per process; returns it."""
    recipe.mkdir(parents=True)
    for name in ("spk.sh", "cmd.sh", "db.sh"):
        (recipe / name).symlink_to(ROOT / "egs" / "TEMPLATE" / "spk1" / name)
    for name in ("utils", "scripts"):
        (recipe / name).symlink_to(ROOT / name)
    (recipe / "path.sh").write_text(
        f"export PATH={ROOT}/utils:{PY.parent}:$PATH\nexport PYTHONPATH={ROOT}\n"
        "export LC_ALL=C\nexport OMP_NUM_THREADS=1\n"
    )
    return recipe


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{PY.parent}:{e['PATH']}"
    e["PYTHONPATH"] = str(ROOT)
    e["OMP_NUM_THREADS"] = str(THREADS)  # 1 unless measuring (helpers.spread)
    return e
