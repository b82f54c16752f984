"""test/bench/gpu_check.sh, rehearsed on the CPU (GPU_CHECK_DEVICE=cpu) as CI runs it: the CUDA-marked
tests and bench_gpu.py at small sizes, on the real corpora from db.sh, and the report they leave
(gpu_check.json with device, fbank_max_abs_diff, extraction (from WAV, VoxCeleb 1's format), train,
the loaders alone through bench_feed.py and the tests' counts; gpu_check.md).  Without a GPU,
``GPU_CHECK_DEVICE=cuda`` must stop at once with a clear message.

The rehearsal plays the bare GPU machine docs/gpu.md describes: its interpreter finds only what
such a machine brings (:data:`MACHINE` and what they require), the bundle's wheels
(test/bench/gpu_bundle.sh) and spkflow; any other installed package is absent, in every process of
the check (a ``sitecustomize`` on PYTHONPATH; DataLoader workers inherit it), pytest's plugins
(pytest-xdist, ...) included.  A package the check needs that the bundle lacks then
fails here, not on the GPU's 15 minutes (threadpoolctl, which every job and worker imports, was
missing from the bundle until 2026-11-29)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.audio import decaying_rirs
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "test" / "bench"))
import bench_feed  # noqa: E402

CHECK = ROOT / "test" / "bench" / "gpu_check.sh"
BUNDLE = ROOT / "test" / "bench" / "gpu_bundle.sh"
#: what docs/gpu.md says a GPU machine brings ("python3 with torch (CUDA), numpy, scipy, pyyaml, tqdm,
#: matplotlib, pytest; the rest comes from .gpu/")
MACHINE = ("torch", "numpy", "scipy", "pyyaml", "tqdm", "matplotlib", "pytest")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bundled() -> list[str]:
    """The distributions gpu_bundle.sh downloads as wheels (its ``wheels`` lines, NAME==VERSION)."""
    lines = [ln for ln in BUNDLE.read_text().splitlines() if re.match(r"wheels\+?=", ln)]
    return re.findall(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", " ".join(lines))


def with_requirements(names: list[str]) -> set[str]:
    """``names`` and what they require, transitively, as installed here (extras left out)."""
    seen: set[str] = set()
    todo = [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [
            canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", r).group(1))
            for r in requires
            if not re.search(r"\bextra\s*==", r)
        ]
    return seen


def bare_machine(tmp_path: Path) -> dict[str, str]:
    """Environment variables under which every Python process sees only what the bare GPU machine
    has (see the module doc): a ``sitecustomize`` puts, in place of this interpreter's site-packages
    on sys.path, a folder of links to what the allowed distributions installed there (so a missing
    package is missing for ``import``, ``importlib.util.find_spec`` and entry points alike)."""
    # the bundle's wheels are installed --no-deps: they bring themselves only; spkflow is the checkout
    allowed = with_requirements(list(MACHINE)) | {canonical(n) for n in [*bundled(), "spkflow"]}
    site = Path(np.__file__).resolve().parents[1]
    bare = tmp_path / "bare_site"
    pkgs = bare / "site-packages"
    pkgs.mkdir(parents=True)
    for dist in importlib.metadata.distributions():
        if canonical(dist.metadata["Name"]) not in allowed:
            continue
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "__pycache__")}:
            if (site / top).exists() and not (pkgs / top).exists():
                (pkgs / top).symlink_to(site / top)  # a shared namespace (nvidia/) comes whole
    (bare / "sitecustomize.py").write_text(
        f"import sys\n\nsys.path[:] = [{str(pkgs)!r} if p == {str(site)!r} else p for p in sys.path]\n"
    )
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(bare) + (os.pathsep + path if path else "")}


def run_check(out: Path, device: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPU_CHECK_DEVICE=device, PYTHON=sys.executable, TMPDIR=str(tmp_path), **env)
    env.setdefault("GPU_BUNDLE", str(tmp_path / "no_bundle"))  # the corpora through db.sh, RIRs made here
    return subprocess.run(["bash", str(CHECK), str(out)], env=env, capture_output=True, text=True, timeout=900)


def test_the_bare_machine_is_bare(tmp_path):
    """The premise of the rehearsal: under :func:`bare_machine` an installed package the machine lacks
    does not import (pyroomacoustics: spkflow.bin.make_rirs', not in the bundle), while the
    bundle's and the machine's do."""
    env = dict(os.environ, **bare_machine(tmp_path))
    probe = (
        "import importlib.util, kaldiio, soundfile, threadpoolctl, torch, yaml, espnet2.spk\n"
        "assert importlib.util.find_spec('pyroomacoustics') is None\n"
        "import pyroomacoustics\n"
    )
    p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.endswith("No module named 'pyroomacoustics'\n"), p.stderr


@pytest.mark.slow
@pytest.mark.corpus
def test_gpu_check_rehearsed_on_the_cpu(tmp_path, corpus):
    for name in ("SPEECHOCEAN762", "LIBRISPEECH", "DSPSPEECH20", "FSDD"):
        corpus(name)  # skip (or fail under CI) when a corpus is missing
    bundle = tmp_path / "bundle"  # the bundle's rooms (pyroomacoustics is not on the bare machine)
    decaying_rirs(bundle / "rirs")
    out = tmp_path / "out"
    p = run_check(out, "cpu", tmp_path, GPU_BUNDLE=str(bundle), **bare_machine(tmp_path))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    r = json.loads((out / "gpu_check.json").read_text())
    assert r["device"] == "cpu" and r["check"] == {
        **r["check"], "device": "cpu", "tests_exit": 0, "bench_exit": 0, "feed_exit": 0,
    }  # fmt: skip
    assert r["tests"]["failed"] == 0 and r["tests"]["passed"] >= 6  # the CUDA-marked tests ran, on the CPU
    assert 0 <= r["fbank_max_abs_diff"] < 1e-3
    assert set(r["parity"]["sets"]) == {"SPEECHOCEAN762", "LIBRISPEECH", "DSPSPEECH20", "FSDD", "dsp20_8k"}
    rows = r["extraction"]
    assert {(x["dtype"], x["fbank_on"]) for x in rows} == {
        (d, f) for d in ("float32", "bfloat16") for f in ("workers", "device")
    }
    assert all(x["e2e_utt_per_s"] > 0 and x["model_utt_per_s"] > 0 and x["audio_format"] == "wav" for x in rows)
    assert all(x["min_cosine_vs_float32"] >= 0.999 for x in rows if x["dtype"] == "bfloat16")
    assert [x["path"] for x in r["train"]["paths"]] == ["ark", "raw", "raw-device", "trainer"]
    assert len(r["limits"]) == 5 and all("the limit is the" in s for s in r["limits"])
    # the loaders alone: extraction from WAV, training's raw crops from FLAC, a worker per CPU
    feed = {x["path"]: x for x in r["feed"]}
    assert list(feed) == list(bench_feed.PATHS)
    assert [feed[p]["audio_format"] for p in bench_feed.PATHS] == ["wav", "wav", None, "flac", None]
    assert all(x["items_per_s"] > 0 and x["share"] > 0 and x["workers"] == bench_feed.cpus() for x in feed.values())
    md = (out / "gpu_check.md").read_text()
    assert md.startswith("# GPU check: cpu") and "| dsp20_8k |" in md and "| raw-device |" in md
    assert "| ecapa32 | bfloat16 | 4 | device | wav |" in md and "| extract_fbank_device | wav |" in md
    assert "| train_arks | - |" in md and (out / "feed.log").is_file()
    assert "limit is the" in p.stdout and (out / "junit.xml").is_file() and (out / "bench.log").is_file()


def test_gpu_check_without_a_gpu_stops_with_a_clear_message(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    p = run_check(tmp_path / "out", "cuda", tmp_path)
    assert p.returncode == 1 and "torch sees no CUDA device (GPU_CHECK_DEVICE=cpu rehearses" in p.stderr
    bad = subprocess.run(["bash", str(CHECK)], capture_output=True, text=True)
    assert bad.returncode == 1 and "Usage:" in bad.stderr
