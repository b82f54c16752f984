"""The Python API (spkflow.api.Embedder) and packed models (spkflow.deploy.pack, spkflow.bin.pack).

The reference is stage 5 for real: scripts/spk/extract_embeddings.sh through run.pl with two
jobs and batches, on real audio files (made here at 8, 16 and 22.05 kHz, and the shipped
corpora when db.sh finds them), with a tiny spkflow model of random weights."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile as sf
import yaml

from helpers.audio import make_mixed_data, write_data_dir_by_prefix
from helpers.models import make_spkflow_model_dir
from helpers.paths import ROOT
from helpers.recipes import env, run, template_recipe
from helpers.spread import permuted, within

SCRIPT = ROOT / "scripts" / "spk" / "extract_embeddings.sh"
PY = Path(sys.executable)


def stage5(model: Path, data: Path, out: Path, batch_size: int = 4) -> dict[str, np.ndarray]:
    run(["bash", SCRIPT, "--nj", "2", "--batch-size", batch_size, "--model-dir", model, data, out])
    return dict(kaldiio.load_scp(str(out / "xvector.scp")))


def l2(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def wav_scp(data: Path) -> dict[str, str]:
    return dict(ln.split(None, 1) for ln in (data / "wav.scp").read_text().splitlines())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_spkflow_model_dir(tmp_path_factory.mktemp("model") / "spk_tiny")


@pytest.fixture(scope="module")
def packed(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    (model_dir / "RESULTS.md").write_text("| set | EER |\n|---|---|\n| test | 1.23 |\n")
    out = tmp_path_factory.mktemp("packed") / "spk_tiny.zip"
    run([PY, "-m", "spkflow.bin.pack", "--model-dir", model_dir, "--out", out])
    return out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mixed_data(tmp_path_factory.mktemp("mixed"))


# ------------------------------------------------------------------------------- API == stage 5


def close_to(check: str, got: np.ndarray, want: np.ndarray) -> None:
    """Within 2e-5 after L2 normalisation and within 2e-5 x the norm before it: padded batches and
    thread counts sum in other orders (measured <= 8.6e-7 at 1 and 2 threads, batches permuted)."""
    rel = np.abs(got - want).max(axis=-1) / np.linalg.norm(want, axis=-1)
    within(f"{check} (L2-normalised)", float(np.abs(l2(got) - l2(want)).max()), 2e-5)
    within(f"{check} (of the norm)", float(rel.max()), 2e-5)


def test_api_equals_stage5_on_files_waves_and_batches(model_dir, mixed, tmp_path):
    """embed_file, embed (native rate, float or int PCM) and embed_batch give stage 5's vectors:
    within 2e-5 (after L2 normalisation) of stage 5 at batch size 1 when torch has one thread, as
    stage 5's jobs do (--num-threads 1) -- bit for bit on the Intel VMs (measured 0), a few ulps
    apart on an AMD EPYC one (max |diff| 7.7e-6 on values ~2 before normalisation, under 4e-6 of the norm:
    the CPU kernels differ between stage 5's process and this one there); within 2e-5 (after L2
    normalisation and of the norm) of batched stage 5 with any thread count (:func:`close_to`)."""
    import torch

    from spkflow import Embedder

    alone = stage5(model_dir, mixed, tmp_path / "alone", batch_size=1)
    batched = stage5(model_dir, mixed, tmp_path / "batched", batch_size=4)
    emb = Embedder.from_pretrained(model_dir)
    assert emb.dim == 16 and emb.sample_rate == 16000
    wavs = wav_scp(mixed)
    utts = list(alone)
    assert list(batched) == utts
    waves, rates = zip(*(sf.read(wavs[u], dtype="float32") for u in utts), strict=True)
    assert len(set(rates)) == 3  # 8, 16 and 22.05 kHz
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        files = np.stack([emb.embed_file(wavs[u]) for u in utts])
        pcm = np.stack([emb.embed(sf.read(wavs[u], dtype="int16")[0], r) for u, r in zip(utts, rates, strict=True)])
    finally:
        torch.set_num_threads(threads)
    order = permuted(range(len(utts)))  # the batch order under test (helpers.spread)
    batch = emb.embed_batch([waves[i] for i in order], [rates[i] for i in order], batch_size=3)[np.argsort(order)]
    want_alone = np.stack([alone[u] for u in utts])
    want_batched = np.stack([batched[u] for u in utts])
    for got in (files, pcm):
        assert got.shape == want_alone.shape and got.dtype == np.float32
        within(
            "API vs stage 5 at batch size 1, one thread (L2-normalised)",
            float(np.abs(l2(got) - l2(want_alone)).max()),
            2e-5,
        )
    for name, got in (("embed_file", files), ("embed int16", pcm), ("embed_batch", batch)):
        close_to(f"{name} vs batched stage 5", got, want_batched)
    assert not np.allclose(l2(want_alone[0]), l2(want_alone[1]), atol=1e-2)  # distinct vectors: the check has teeth


def test_api_equals_stage5_on_real_speech(model_dir, tmp_path, corpus):
    """Real recordings (LibriSpeech 16 kHz 6-20 s, FSDD 8 kHz digits, speechocean762) through
    stage 5 and through the API."""
    from spkflow import Embedder

    files = sorted(corpus("LIBRISPEECH").rglob("*.flac"))[:3]
    files += sorted((corpus("FSDD") / "recordings").glob("*.flac"))[::200][:3]
    files += sorted((corpus("SPEECHOCEAN762") / "WAVE").rglob("*.flac"))[:3]
    assert len(files) == 9, files
    entries = {f"s{i % 3}-u{i:02d}": str(p) for i, p in enumerate(files)}
    data = tmp_path / "data"
    write_data_dir_by_prefix(data, entries)
    ref = stage5(model_dir, data, tmp_path / "out")
    emb = Embedder.from_pretrained(model_dir)
    got = {u: emb.embed_file(p) for u, p in entries.items()}
    assert sorted(got) == sorted(ref)
    close_to("embed_file vs stage 5", np.stack([got[u] for u in ref]), np.stack(list(ref.values())))


def test_mean_norm_frontend_comes_from_the_config(tmp_path, mixed):
    """A model trained with mean normalisation gets it at inference (read from config.yaml)."""
    from spkflow import Embedder

    try:  # stage 5's model wrapper, before and after the split of spkflow/embed/run.py
        from spkflow.embed.native import SpkflowEmbedder
    except ImportError:
        from spkflow.embed.run import SpkflowEmbedder

    md = make_spkflow_model_dir(tmp_path / "mn", seed=3, mean_norm=True)
    emb = Embedder.from_pretrained(md)
    prep = SpkflowEmbedder(md).preparer(mixed)
    wavs = wav_scp(mixed)
    for u in list(wavs)[:3]:
        x = emb.features(*sf.read(wavs[u], dtype="float32"))
        np.testing.assert_array_equal(x, prep(u))
        assert np.abs(x.mean(axis=0)).max() < 1e-4


def test_bad_waveforms_are_refused_by_name(model_dir):
    from spkflow import Embedder

    emb = Embedder.from_pretrained(model_dir)
    good = np.random.default_rng(0).uniform(-0.5, 0.5, 16000).astype(np.float32)
    stereo = np.stack([good, np.zeros_like(good)], axis=1)
    np.testing.assert_array_equal(emb.embed(stereo, 16000), emb.embed(good, 16000))  # channel 0, as stage 5
    bad = good.copy()
    bad[100] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        emb.embed(bad, 16000)
    with pytest.raises(ValueError, match="waveform 1: .*shorter than one frame"):
        emb.embed_batch([good, good[:100]], 16000)
    with pytest.raises(ValueError, match="sample_rate"):
        emb.embed(good, 0)
    with pytest.raises(ValueError, match="2 waveforms but 3 sample rates"):
        emb.embed_batch([good, good], [16000] * 3)
    assert emb.embed_batch([], 16000).shape == (0, 16)


def test_import_spkflow_does_not_import_torch():
    code = "import sys, spkflow; from spkflow import Embedder; print('torch' in sys.modules)"
    assert run([PY, "-c", code]).stdout.strip() == "False"


# ------------------------------------------------------------------------------- packed models


def test_pack_contents_and_model_card(packed, model_dir):
    with zipfile.ZipFile(packed) as z:
        names = set(z.namelist())
        card = z.read("README.md").decode()
        meta = yaml.safe_load(z.read("meta.yaml"))
        assert z.read("config.yaml") == (model_dir / "config.yaml").read_bytes()
        assert "--num-mel-bins=24" in z.read("fbank.conf").decode()
        assert "--vad-energy-threshold=5.5" in z.read("vad.conf").decode()
        assert "| test | 1.23 |" in z.read("RESULTS.md").decode()
        import torch

        state = torch.load(io.BytesIO(z.read("model.pth")), weights_only=True)
    assert names == {"meta.yaml", "config.yaml", "model.pth", "fbank.conf", "vad.conf", "README.md", "RESULTS.md"}
    assert meta["format"] == "spkflow-packed-model" and meta["model"] == {"name": "ecapa_tdnn", "embed_dim": 16}
    assert set(meta["files"]) == names - {"meta.yaml"}
    assert "ecapa_tdnn" in card and "16-dim embeddings" in card and "RESULTS.md" in card
    assert meta["files"]["model.pth"]["sha256"] in card
    assert set(state) == set(torch.load(model_dir / "model.pth", weights_only=True))


def test_packed_file_round_trip_api_and_stage5(packed, model_dir, mixed, tmp_path):
    """The packed file gives the model dir's embeddings, through the API and through
    extract_embeddings.sh --model-dir FILE, which leaves no unpacked copy behind; unpacking is
    verified and idempotent."""
    from spkflow import Embedder

    a, b = Embedder.from_pretrained(model_dir), Embedder.from_pretrained(packed)
    assert b.meta is not None and b.meta["format_version"] == 1
    wave, rate = sf.read(next(iter(wav_scp(mixed).values())), dtype="float32")
    np.testing.assert_array_equal(a.embed(wave, rate), b.embed(wave, rate))
    from_dir = stage5(model_dir, mixed, tmp_path / "dir")
    from_file = stage5(packed, mixed, tmp_path / "file")
    assert list(from_file) == list(from_dir)
    assert max(float(np.abs(from_file[u] - from_dir[u]).max()) for u in from_dir) == 0.0
    # the pack is unpacked for the run only: nothing of it is left beside the embeddings
    assert sorted(p.name for p in (tmp_path / "file").iterdir()) == sorted(p.name for p in (tmp_path / "dir").iterdir())
    unpacked = tmp_path / "unpacked"
    run([PY, "-m", "spkflow.bin.pack", "--unpack", packed, "--out", unpacked])
    assert (unpacked / "model.pth").read_bytes() == (model_dir / "model.pth").read_bytes()
    stamp = (unpacked / "model.pth").stat().st_mtime_ns
    run([PY, "-m", "spkflow.bin.pack", "--unpack", packed, "--out", unpacked])
    assert (unpacked / "model.pth").stat().st_mtime_ns == stamp  # same pack: kept, not rewritten


def test_training_checkpoint_is_packed_as_weights_only(model_dir, tmp_path):
    import torch

    from spkflow import Embedder

    md = tmp_path / "ckpt"
    md.mkdir()
    (md / "config.yaml").write_bytes((model_dir / "config.yaml").read_bytes())
    state = torch.load(model_dir / "model.pth", weights_only=True)
    torch.save({"model": state, "epoch": 3, "step": 10}, md / "model.pth")
    out = tmp_path / "ckpt.zip"
    run([PY, "-m", "spkflow.bin.pack", "--model-dir", md, "--out", out])
    with zipfile.ZipFile(out) as z:
        packed_state = torch.load(io.BytesIO(z.read("model.pth")), weights_only=True)
    assert set(packed_state) == set(state)
    wave = np.random.default_rng(1).uniform(-0.3, 0.3, 24000).astype(np.float32)
    np.testing.assert_array_equal(
        Embedder.from_pretrained(out).embed(wave, 16000), Embedder.from_pretrained(model_dir).embed(wave, 16000)
    )


# ------------------------------------------------------------------------------- errors


def _rezip(src: Path, dst: Path, change: dict[str, bytes | None]) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = change.get(name, zin.read(name))
            if data is not None:
                zout.writestr(name, data)
    return dst


def test_missing_and_corrupt_model_files_are_named(packed, model_dir, tmp_path):
    from spkflow import Embedder
    from spkflow.core.errors import InputError

    cases: list[tuple[Path, str]] = [(tmp_path / "nope.zip", "model not found")]
    trunc = tmp_path / "truncated.zip"
    trunc.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    cases.append((trunc, "truncated or damaged zip file"))
    weights = bytearray(zipfile.ZipFile(packed).read("model.pth"))
    weights[len(weights) // 2] ^= 0xFF
    cases.append((_rezip(packed, tmp_path / "flipped.zip", {"model.pth": bytes(weights)}), "member model.pth: sha256"))
    cases.append((_rezip(packed, tmp_path / "nometa.zip", {"meta.yaml": None}), "no meta.yaml"))
    cases.append((_rezip(packed, tmp_path / "noweights.zip", {"model.pth": None}), "model.pth listed in meta.yaml"))
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("meta.yaml", "format: something-else\n")
    cases.append((other, "not a packed spkflow model"))
    cases.append((model_dir / "model.pth", "it is a torch file"))
    meta = yaml.safe_load(zipfile.ZipFile(packed).read("meta.yaml"))
    meta["files"]["../escape.txt"] = {"sha256": "0" * 64, "size": 1}
    evil = _rezip(packed, tmp_path / "evil.zip", {"meta.yaml": yaml.safe_dump(meta).encode()})
    with zipfile.ZipFile(evil, "a") as z:
        z.writestr("../escape.txt", "x")
    cases.append((evil, "members are plain file names"))
    # the last 100 bytes missing: zipfile alone found the zip directory of model.pth inside it
    # and read the pack as a torch file
    cut = tmp_path / "cut.zip"
    cut.write_bytes(packed.read_bytes()[:-100])
    cases.append((cut, r"truncated or damaged zip file \(\d+ bytes\): it does not end with its zip directory"))
    for path, msg in cases:
        with pytest.raises(InputError, match=msg) as err:
            Embedder.from_pretrained(path)
        assert str(path) in str(err.value)
    # a model dir without weights, or whose config is an ESPnet one
    nodir = tmp_path / "noweights"
    nodir.mkdir()
    (nodir / "config.yaml").write_bytes((model_dir / "config.yaml").read_bytes())
    with pytest.raises(InputError, match="model.pth"):
        Embedder.from_pretrained(nodir)
    esp = tmp_path / "espnet"
    esp.mkdir()
    (esp / "config.yaml").write_text("encoder: ecapa_tdnn\nfrontend: melspec_torch\n")
    with pytest.raises(InputError, match=r"espnet: cannot tell which weights to use \(no \*.pth file\)"):
        Embedder.from_pretrained(esp)  # an ESPnet model dir is told apart and loaded as one
    with pytest.raises(InputError, match="--toolkit espnet"):
        Embedder.from_pretrained(esp, toolkit="spkflow")
    # the script refuses a corrupted pack before any job, naming it
    p = run(["bash", SCRIPT, "--model-dir", cases[2][0], tmp_path / "x", tmp_path / "out"], check=False)
    assert p.returncode != 0 and "flipped.zip" in p.stderr and "sha256" in p.stderr
    assert not (tmp_path / "out" / "jobs").exists()


def test_pack_refuses_weights_that_do_not_fit_the_config(model_dir, tmp_path):
    md = tmp_path / "misfit"
    md.mkdir()
    cfg = yaml.safe_load((model_dir / "config.yaml").read_text())
    cfg["model"]["embed_dim"] = 8
    (md / "config.yaml").write_text(yaml.safe_dump(cfg))
    (md / "model.pth").write_bytes((model_dir / "model.pth").read_bytes())
    out = tmp_path / "misfit.zip"
    p = run([PY, "-m", "spkflow.bin.pack", "--model-dir", md, "--out", out], check=False)
    assert p.returncode == 1 and "does not match the model" in p.stderr and str(md) in p.stderr
    assert not out.exists() and not list(tmp_path.glob(".misfit.zip*"))
    (md / "model.pth").write_bytes(b"\x00" * 10)
    p = run([PY, "-m", "spkflow.bin.pack", "--model-dir", md, "--out", out], check=False)
    assert p.returncode == 1 and "model.pth" in p.stderr and not out.exists()


def test_spk_sh_stage7_packs_the_experiment(model_dir, tmp_path):
    """spk.sh --stage 7 in a recipe dir: exp/spk_<tag>/packed/spk_<tag>.zip, usable as a model."""
    from spkflow import Embedder

    recipe = template_recipe(tmp_path / "egs" / "demo" / "spk1")
    exp = recipe / "exp" / "spk_tiny"
    exp.mkdir(parents=True)
    for f in ("config.yaml", "model.pth"):
        (exp / f).write_bytes((model_dir / f).read_bytes())
    (exp / "RESULTS.md").write_text("| set | EER |\n|---|---|\n| test | 4.56 |\n")
    p = subprocess.run(
        ["bash", "spk.sh", "--stage", "7", "--stop_stage", "7", "--tag", "tiny"],
        cwd=recipe,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    packed = exp / "packed" / "spk_tiny.zip"
    with zipfile.ZipFile(packed) as z:
        assert "| test | 4.56 |" in z.read("RESULTS.md").decode()
        assert z.read("README.md").decode().startswith("# Speaker embedder `spk_tiny`")
    wave = np.random.default_rng(2).uniform(-0.3, 0.3, 20000).astype(np.float32)
    np.testing.assert_array_equal(
        Embedder.from_pretrained(packed).embed(wave, 16000), Embedder.from_pretrained(model_dir).embed(wave, 16000)
    )


@pytest.mark.cuda
def test_cuda_embeddings_equal_stage5_on_cuda(model_dir, mixed, tmp_path, accel):
    """On a GPU machine: the API on CUDA gives what stage 5 gives with --device cuda (whose fbank then
    runs on the GPU: --fbank-on auto)."""
    from spkflow import Embedder

    run(["bash", SCRIPT, "--nj", "1", "--device", accel, "--model-dir", model_dir, mixed, tmp_path / "out"])
    ref = dict(kaldiio.load_scp(str(tmp_path / "out" / "xvector.scp")))
    emb = Embedder.from_pretrained(model_dir, device=accel)
    wavs = wav_scp(mixed)
    close_to(
        "CUDA embed_file vs CUDA stage 5",
        np.stack([emb.embed_file(wavs[u]) for u in ref]),
        np.stack(list(ref.values())),
    )


# ----------------------------------------------------------------------------- other toolkits (issue 33)


def test_other_toolkits_detected_and_equal_to_stage5(tmp_path):
    """An ESPnet RawNet3 dir, a SpeechBrain pretrained folder and a WeSpeaker .onnx are told apart
    by their files (or named), resampled to the model's rate, and give stage 5's numbers: the
    toolkit adapter's embedding of each utterance alone (ESPnet, SpeechBrain) or WeSpeaker's
    fbank + graph, in input order, from arrays, files and batches."""
    pytest.importorskip("speechbrain")
    pytest.importorskip("onnxruntime")
    from helpers.models import ESPNET_CONFIGS, make_speechbrain_dir, make_wespeaker_onnx, save_espnet_model
    from spkflow import Embedder
    from spkflow.core.errors import InputError
    from spkflow.data.resample import resample

    models = {
        "espnet": save_espnet_model(tmp_path / "espnet", ESPNET_CONFIGS["rawnet3"]),
        "speechbrain": make_speechbrain_dir(tmp_path / "sb"),
        "wespeaker": make_wespeaker_onnx(tmp_path / "ws" / "resnet.onnx"),
    }
    rng = np.random.default_rng(5)
    waves = [
        (0.2 * np.sin(np.arange(n) * 0.05) + 0.01 * rng.standard_normal(n)).astype(np.float32) for n in (9000, 20000)
    ]
    path = tmp_path / "a.wav"
    sf.write(path, waves[1], 8000, subtype="FLOAT")  # the samples themselves: no 16-bit rounding between the paths
    for toolkit, model in models.items():
        emb = Embedder.from_pretrained(model)
        assert emb.toolkit == toolkit and emb.dim == 16 and emb.sample_rate == 16000
        assert f"toolkit={toolkit}" in repr(emb)
        b = emb._backend
        alone = [b.embed([b.prepare_wave(resample(w, 8000, 16000))])[0] for w in waves]
        got = emb.embed_batch(waves, 8000)
        within(
            f"{toolkit} embed_batch vs alone (L2-normalised)", float(np.abs(l2(got) - l2(np.stack(alone))).max()), 1e-4
        )
        within(
            f"{toolkit} embed_file vs alone (L2-normalised)",
            float(np.abs(l2(emb.embed_file(path)) - l2(alone[1])).max()),
            1e-4,
        )
        named = Embedder.from_pretrained(model, toolkit=toolkit)
        assert named.toolkit == toolkit
    with pytest.raises(ValueError, match="toolkit must be one of"):
        Embedder.from_pretrained(models["espnet"], toolkit="kaldi")
    with pytest.raises(InputError, match="model.pth: cannot load the ONNX model"):
        Embedder.from_pretrained(models["espnet"] / "model.pth", toolkit="wespeaker")
