"""The wespeaker toolkit path: ONNX files written as ``wespeaker/bin/export_onnx.py`` writes them
(``helpers.models.make_wespeaker_onnx``: ``feats`` [B, T, F] -> ``embs``, a small ResNet-TSTP with
random weights), run by :class:`spkflow.embed.wespeaker.WespeakerEmbedder` and by the extraction
script, compared with WeSpeaker's own runtime (``wespeakerruntime.Speaker``, its fbank and its
onnxruntime call) on real speech.

torchaudio 2.11's ``load`` needs torchcodec, which is not installed: WeSpeaker's runtime is given
soundfile's reading instead (the same float samples torchaudio<2.9 returned), at 16 kHz."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers.models import l2, make_wespeaker_onnx
from helpers.recipes import PY, env, extract, template_recipe
from helpers.spread import within

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from spkflow.core.errors import InputError  # noqa: E402
from spkflow.embed.wespeaker import WespeakerEmbedder, WespeakerFrontend  # noqa: E402


@pytest.fixture(scope="module")
def ws_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wespeaker")
    make_wespeaker_onnx(d / "voxceleb_resnet_tiny.onnx")
    return d


@pytest.fixture
def runtime(monkeypatch):
    """WeSpeaker's runtime on a model file, reading audio with soundfile (resampled to 16 kHz by
    spkflow's reader, so that its fbank runs at the rate it assumes)."""
    import soundfile as sf
    import wespeakerruntime
    import wespeakerruntime.speaker as speaker

    from spkflow.data.resample import resample

    def load(path):
        x, sr = sf.read(path, dtype="float32")
        return torch.from_numpy(resample(x, sr, 16000))[None], 16000

    monkeypatch.setattr(speaker.torchaudio, "load", load)
    return lambda onnx: wespeakerruntime.Speaker(onnx_path=str(onnx))


@pytest.mark.corpus
def test_equals_wespeaker_runtime_on_real_speech(ws_dir, runtime, corpus):
    files = sorted(corpus("LIBRISPEECH").rglob("*.flac"))[::10][:4]
    import soundfile as sf

    emb = WespeakerEmbedder(ws_dir)
    assert emb.dim == 16 and emb.sample_rate == 16000 and emb.config_path is None
    got = emb.embed([emb.prepare_wave(sf.read(f, dtype="float32")[0]) for f in files])
    ref = np.concatenate([runtime(emb.model_path).extract_embedding(str(f)) for f in files])
    # measured 0 (2 threads)
    within("ours vs the wespeaker runtime (L2-normalised)", float(np.abs(l2(got) - l2(ref)).max()), 1e-4)


def test_equal_lengths_run_together_others_alone(ws_dir, monkeypatch):
    """A WeSpeaker graph pools over every frame: no padding; equal frame counts share a run."""
    emb = WespeakerEmbedder(ws_dir)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, 80)).astype(np.float32) for n in (120, 95, 120, 60)]
    alone = np.concatenate([emb.embed([x]) for x in xs])
    runs = []
    run = emb.model.run
    monkeypatch.setattr(emb.model, "run", lambda names, feed: runs.append(feed["feats"].shape[0]) or run(names, feed))
    got = emb.embed(xs)
    assert sorted(runs) == [1, 1, 2]
    # measured <= 8.9e-8 (1 and 2 threads)
    within("equal lengths together vs alone", float(np.abs(got - alone).max()), 1e-5)


def test_frontend_from_config_and_checked_against_the_graph(tmp_path):
    """WeSpeaker's training config.yaml sets the fbank; a graph that takes other features is
    refused naming both files; the settings are part of the stamp."""
    d = tmp_path / "m64"
    make_wespeaker_onnx(d / "model.onnx", feat_dim=64)
    cfg = {
        "dataset_args": {
            "resample_rate": 16000,
            "fbank_args": {"num_mel_bins": 64, "frame_shift": 10, "frame_length": 25},
        },
        "model": "ResNet34",
        "model_args": {"feat_dim": 64, "embed_dim": 16},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    emb = WespeakerEmbedder(d)
    assert emb.frontend == WespeakerFrontend(num_mel_bins=64)
    assert emb.prepare_wave(np.zeros(16000, dtype=np.float32)).shape == (98, 64)
    assert len(emb.stamp.split()) == 3  # toolkit, config.yaml, model.onnx
    cfg["dataset_args"]["fbank_args"]["num_mel_bins"] = 80
    cfg["model_args"]["feat_dim"] = 80
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(InputError, match=r"model.onnx: input 'feats' takes 64-dim .* 80 mel bins: .*config.yaml"):
        WespeakerEmbedder(d)
    cfg["model_args"]["feat_dim"] = 64
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(InputError, match=r"config.yaml: model_args.feat_dim 64 differs from .*num_mel_bins 80"):
        WespeakerEmbedder(d)


def test_not_a_wespeaker_graph_is_named(tmp_path):
    """A spkflow export (feats + lengths -> embedding) is told apart, with the toolkit to use."""

    class Mean(torch.nn.Module):
        def forward(self, feats, lengths):
            return feats.sum(dim=1) / lengths[:, None]

    onnx = tmp_path / "spkflow.onnx"
    torch.onnx.export(
        Mean(),
        (torch.ones(1, 20, 80), torch.tensor([20.0])),
        str(onnx),
        input_names=["feats", "lengths"],
        output_names=["embedding"],
        dynamo=False,
    )
    with pytest.raises(InputError, match=r"not a WeSpeaker graph: .*use --toolkit spkflow"):
        WespeakerEmbedder(onnx)
    with pytest.raises(ValueError, match="float32 only"):
        WespeakerEmbedder(onnx, dtype="bfloat16")


@pytest.mark.corpus
def test_script_nj2_real_speech_equals_runtime(ws_dir, runtime, tmp_path, corpus):
    """Done-when: extract_embeddings.sh --toolkit wespeaker --nj 2 on real speech (LibriSpeech and
    FSDD 8 kHz, resampled) with the .onnx given as the model, equal to WeSpeaker's runtime within
    1e-4, keys in data-dir order; the stamp names the graph."""
    from helpers.corpora import real_speech_data_dir

    data = real_speech_data_dir(corpus, tmp_path / "data")
    out = tmp_path / "out"
    onnx = ws_dir / "voxceleb_resnet_tiny.onnx"
    utts, xv = extract("wespeaker", onnx, data, out, "--batch-size", "4", "--num-threads", "1")
    speaker = runtime(onnx)
    wav = dict(line.split(maxsplit=1) for line in (data / "wav.scp").read_text().splitlines())
    diff = max(float(np.abs(l2(xv[u]) - l2(speaker.extract_embedding(wav[u])[0])).max()) for u in utts)
    # measured 0 (2 threads)
    within("stage 5 vs the wespeaker runtime (L2-normalised)", diff, 1e-4)
    assert (out / "jobs" / "model.stamp").read_text().strip() == WespeakerEmbedder(onnx).stamp


def test_spk_sh_stages_2_to_5_with_a_pretrained_model(ws_dir, tmp_path, monkeypatch):
    """spk.sh --pretrained X --pretrained_toolkit wespeaker: stages 2-4 are skipped (nothing to train),
    stage 5 embeds with the pretrained model into exp/pretrained_<model name>, equal to the adapter."""
    import kaldiio

    from helpers.audio import make_mixed_data

    recipe = template_recipe(tmp_path / "egs" / "demo" / "spk1")
    (recipe / "data").mkdir()
    make_mixed_data(tmp_path / "corpus", num_spk=2, num_utt=2).rename(recipe / "data" / "test")
    onnx = ws_dir / "voxceleb_resnet_tiny.onnx"
    args = [
        "--stage",
        "2",
        "--stop_stage",
        "5",
        "--test_sets",
        "test",
        "--nj",
        "2",
        "--pretrained_toolkit",
        "wespeaker",
    ]
    p = subprocess.run(
        ["bash", "spk.sh", *args, "--pretrained", str(onnx)], cwd=recipe, env=env(), capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Stages 2-4 skipped" in p.stdout and "Stage 2:" not in p.stdout
    out = recipe / "exp" / "pretrained_voxceleb_resnet_tiny" / "embed" / "test"
    monkeypatch.chdir(recipe)  # scp paths are relative to the recipe dir
    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    emb = WespeakerEmbedder(onnx)
    prep = emb.preparer(recipe / "data" / "test")
    utts = (recipe / "data" / "test" / "utt2spk").read_text().split()[::2]
    assert list(xv) == utts
    worst = max(float(np.abs(xv[u] - emb.embed([prep(u)])[0]).max()) for u in utts)
    # measured 0 (1 and 2 threads)
    within("recipe stage 5 vs embed alone", worst, 1e-5)
    p = subprocess.run(
        ["bash", "spk.sh", *args[:-1], "speechbrain"], cwd=recipe, env=env(), capture_output=True, text=True
    )
    assert p.returncode == 2 and "needs --pretrained" in p.stdout + p.stderr


def test_spk_sh_calibrates_a_pretrained_model_on_the_training_set(ws_dir, tmp_path):
    """spk.sh --pretrained X --pretrained_toolkit wespeaker, stages 5-6: another toolkit's model has no
    scoring of ours, so stage 6 fits one as for a model trained here: a calibration on trials drawn
    from the training set's embeddings (stage 5 embeds it), written beside the results and used
    for the test set's calibrated figures; stage 7 has nothing to pack."""
    from helpers.audio import make_speakers

    recipe = template_recipe(tmp_path / "egs" / "demo" / "spk1")
    (recipe / "data").mkdir()
    make_speakers(tmp_path / "train", num_spk=5, num_utt=3, seed=3).rename(recipe / "data" / "train")
    make_speakers(tmp_path / "test", num_spk=3, num_utt=3, seed=4).rename(recipe / "data" / "test")
    subprocess.run(
        [str(PY), "-m", "spkflow.bin.make_trials", "data/test", "data/test/trials"],
        cwd=recipe,
        env=env(),
        check=True,
        capture_output=True,
    )
    onnx = ws_dir / "voxceleb_resnet_tiny.onnx"
    args = ["--stage", "5", "--stop_stage", "7", "--test_sets", "test", "--nj", "1"]
    args += ["--pretrained", str(onnx), "--pretrained_toolkit", "wespeaker"]
    p = subprocess.run(["bash", "spk.sh", *args], cwd=recipe, env=env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    exp = recipe / "exp" / "pretrained_voxceleb_resnet_tiny"
    assert (exp / "embed" / "train" / "xvector.scp").is_file()  # embedded for the calibration
    assert "Calibration on" in p.stdout and (exp / "scoring.yaml").is_file()
    m = json.loads((exp / "eval" / "test" / "metrics.json").read_text())
    assert m["scoring_dir"].endswith("pretrained_voxceleb_resnet_tiny") and "cllr" in m["calibrated"]
    assert "Stage 7 skipped" in p.stdout and not (exp / "packed").exists()
