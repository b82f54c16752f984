"""The front door (spkflow.embed.open): what a model path is, for Python and for the shell
scripts (spkflow.bin.model_info), the refusals, and a pack unpacked once into the cache by
several processes at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.models import make_spkflow_model_dir
from helpers.paths import ROOT

PY = sys.executable


def _run(args: list, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    d = make_spkflow_model_dir(root / "spk_tiny")
    pack = root / "packed" / "spk_tiny.zip"
    _run([PY, "-m", "spkflow.bin.pack", "--model-dir", d, "--out", pack], env)
    onnx = root / "spk_tiny.onnx"
    _run([PY, "-m", "spkflow.bin.export", "--model-dir", d, "--out", onnx], env)
    esp = root / "espnet_dir"
    esp.mkdir()
    (esp / "config.yaml").write_text("encoder: ecapa_tdnn\nfrontend: melspec_torch\n")
    return {"dir": d, "pack": pack, "onnx": onnx, "espnet": esp}


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "SPKFLOW_CACHE": str(cache)}


def test_model_info_tells_each_kind_for_the_shell(models, tmp_path):
    """bash evals model_info's lines: ours (dir, pack -> its unpacked copy in the cache, ONNX
    export), another toolkit's dir told from its files; the unpacked copy holds the pack's bytes."""
    env = _env(tmp_path / "cache")
    show = (
        'info=$(python -m spkflow.bin.model_info "$1") && eval "${info}" && '
        'echo "$model_toolkit|$model_ours|$model_kind|$model_dir|$model_name"'
    )
    got = {}
    for kind, path in models.items():
        p = _run(["bash", "-c", show.replace("python", PY), "-", path], env)
        got[kind] = p.stdout.strip().split("|")
    assert got["dir"] == ["spkflow", "true", "dir", str(models["dir"]), "spk_tiny"]
    assert got["onnx"] == ["spkflow", "true", "onnx", str(models["onnx"]), "spk_tiny"]
    assert got["espnet"][:3] == ["espnet", "false", "dir"]
    toolkit, ours, kind, unpacked, name = got["pack"]
    assert (toolkit, ours, kind, name) == ("spkflow", "true", "pack", "spk_tiny")
    assert Path(unpacked).parent == tmp_path / "cache" / "packs"
    for f in ("config.yaml", "model.pth"):
        assert (Path(unpacked) / f).read_bytes() == (models["dir"] / f).read_bytes()


def test_refusals_name_the_path_before_anything_is_built(models, tmp_path, monkeypatch):
    from spkflow.core.errors import InputError
    from spkflow.embed import inspect_model, open_embedder

    monkeypatch.setenv("SPKFLOW_CACHE", str(tmp_path / "cache"))
    with pytest.raises(InputError, match="stage 5's jobs need the model dir or its pack"):
        inspect_model(models["onnx"], jobs=True)  # stage 5 cannot run our ONNX export
    assert inspect_model(models["onnx"]).kind == "onnx"  # the API can
    with pytest.raises(InputError, match=rf"give that file \({models['pack']}\)"):
        inspect_model(models["pack"].parent)  # the packed/ folder instead of its zip
    with pytest.raises(InputError, match="--toolkit espnet"):
        inspect_model(models["espnet"], "spkflow")  # an ESPnet config given as ours
    with pytest.raises(ValueError, match="--feats-dir is for --toolkit spkflow"):
        open_embedder(models["espnet"], feats_dir=tmp_path)
    with pytest.raises(InputError, match="model not found"):
        inspect_model(tmp_path / "nope")
    assert not (tmp_path / "cache").exists()  # nothing was unpacked for a refusal
    env = _env(tmp_path / "cache")
    p = _run([PY, "-m", "spkflow.bin.model_info", "--jobs", "true", models["onnx"]], env, check=False)
    assert p.returncode == 1 and str(models["onnx"]) in p.stderr and not p.stdout


def test_a_pack_is_unpacked_once_by_concurrent_processes(models, tmp_path):
    """Four processes open the same pack at once (as stage 5's jobs do): one unpacks under the
    cache's lock, the others wait and reuse it; a later open rewrites nothing."""
    env = _env(tmp_path / "cache")
    code = "import sys; from spkflow.embed.packed import unpacked; print(unpacked(sys.argv[1])[0])"
    procs = [
        subprocess.Popen([PY, "-c", code, str(models["pack"])], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(outs) == 1
    packs = tmp_path / "cache" / "packs"
    assert [q.name for q in packs.iterdir()] == [Path(next(iter(outs))).name]  # no temporary dir left behind
    model = Path(next(iter(outs))) / "model.pth"
    before = model.stat().st_mtime_ns
    assert _run([PY, "-c", code, models["pack"]], env).stdout.strip() == str(model.parent)
    assert model.stat().st_mtime_ns == before


@pytest.mark.parametrize("member", ["../evil.sh", "/tmp/evil.sh", "sub/../../evil.sh"])
def test_a_pack_with_a_member_outside_its_folder_is_refused_naming_it(models, tmp_path, member):
    """A member that unzip would write outside its folder (not listed in meta.yaml, so never
    extracted by spkflow) still makes ``pack --check`` and every reader refuse the pack, naming it."""
    import shutil
    import zipfile

    bad = tmp_path / "bad.zip"
    shutil.copy(models["pack"], bad)
    with zipfile.ZipFile(bad, "a") as z:
        z.writestr(zipfile.ZipInfo(member), b"echo pwned\n")
    p = _run([PY, "-m", "spkflow.bin.pack", "--check", bad], _env(tmp_path / "cache"), check=False)
    assert p.returncode == 1 and f"{bad}: member {member!r}: members are plain file names" in p.stderr, p.stderr
    ok = _run([PY, "-m", "spkflow.bin.pack", "--check", models["pack"]], _env(tmp_path / "cache"))
    assert "a sound packed model" in ok.stderr
