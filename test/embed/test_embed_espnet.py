"""The espnet toolkit path: ESPnet speaker models built and saved here with
``espnet2.tasks.spk.SpeakerTask`` (tiny ECAPA-TDNN, x-vector and RawNet3 configs, random
weights, no downloads), run batched by :class:`spkflow.embed.espnet.EspnetEmbedder` and by the
extraction script; outputs read back through ESPnet's own ``ESPnetDataset`` (``kaldi_ark``).

What ESPnet itself does with a padded batch is checked too: ``MelSpectrogramTorch`` reports the
padded length for every row and the encoders take no lengths, so ESPnet's batched forward
changes the embeddings of the shorter utterances; ours does not."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers.audio import make_mixed_data
from helpers.models import l2, perturb_batchnorm
from helpers.paths import ROOT
from helpers.recipes import SCRIPT, env

torch = pytest.importorskip("torch")
SpeakerTask = pytest.importorskip("espnet2.tasks.spk").SpeakerTask

BASE = dict(
    specaug=None,
    specaug_conf={},
    normalize=None,
    normalize_conf={},
    pooling="chn_attn_stat",
    pooling_conf={},
    projector="rawnet3",
    projector_conf=dict(output_size=16),
    loss="aamsoftmax",
    loss_conf=dict(margin=0.2, scale=30),
    spk_num=5,
    input_size=None,
    init=None,
)
CONFIGS = {
    # ESPnet's VoxCeleb ECAPA recipe shape: melspec_torch frontend with mean normalisation
    "ecapa": dict(
        BASE,
        frontend="melspec_torch",
        frontend_conf=dict(preemp=True, n_fft=512, log=True, win_length=400, hop_length=160, n_mels=24, normalize="mn"),
        encoder="ecapa_tdnn",
        encoder_conf=dict(model_scale=4, ndim=32, output_size=48),
    ),
    # STFT frontend + utterance MVN; the x-vector TDNN shortens the time axis
    "xvector": dict(
        BASE,
        frontend="default",
        frontend_conf=dict(n_fft=512, win_length=400, hop_length=160, n_mels=24),
        normalize="utterance_mvn",
        encoder="xvector",
        encoder_conf=dict(ndim=32, output_size=40),
        pooling="stats",
        projector="xvector",
    ),
    # raw waveform; its blocks average over time with F.adaptive_avg_pool1d: run one at a time
    "rawnet3": dict(
        BASE,
        frontend="asteroid_frontend",
        frontend_conf=dict(sinc_stride=16, sinc_kernel_size=251, sinc_filters=32),
        encoder="rawnet3",
        encoder_conf=dict(model_scale=4, ndim=32, output_size=48),
    ),
}


def save_espnet_model(path: Path, cfg: dict, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = SpeakerTask.build_model(argparse.Namespace(**cfg))
    perturb_batchnorm(model, seed)  # weights: ESPnet's random init
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), path / "model.pth")
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("espnet_models")
    return {name: save_espnet_model(root / name, cfg) for name, cfg in CONFIGS.items()}


def waves(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = [16000, 5200, 23456, 8000, 3300]  # 0.2 to 1.5 s: up to 7x padding
    return [
        (0.1 * rng.standard_normal(n) + 0.3 * np.sin(np.arange(n) * 0.05 * (i + 1))).astype(np.float32)
        for i, n in enumerate(t)
    ]


def espnet_alone(model, xs: list[np.ndarray]) -> np.ndarray:
    """ESPnet's own single-utterance inference (what Speech2Embedding.__call__ does)."""
    with torch.no_grad():
        return np.concatenate([model(speech=torch.from_numpy(x)[None], extract_embd=True).numpy() for x in xs])


def test_espnet_batched_forward_is_not_padding_invariant(models):
    """Documents ESPnet: lengths stop at the frontend (and MelSpectrogramTorch drops them)."""
    from spkflow.embed.espnet import EspnetEmbedder

    model = EspnetEmbedder(models["ecapa"]).model
    xs = waves()
    lens = torch.tensor([len(x) for x in xs])
    padded = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(x) for x in xs], batch_first=True)
    with torch.no_grad():
        _, flens = model.frontend(padded, lens)
        assert flens.tolist() == [float(padded.shape[1] // 160 + 1)] * len(xs)  # the padded length for all
        batched = model(speech=padded, speech_lengths=lens, extract_embd=True).numpy()
    alone = espnet_alone(model, xs)
    diff = np.abs(l2(batched) - l2(alone)).max(axis=1)
    longest = int(np.argmax([len(x) for x in xs]))
    assert diff[longest] < 1e-4
    assert np.delete(diff, longest).min() > 1e-2, diff


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batched_equals_espnet_alone(models, name):
    from spkflow.embed.espnet import EspnetEmbedder

    emb = EspnetEmbedder(models[name])
    assert (emb.mask is None) == (name == "rawnet3")
    xs = waves(1)
    batched = emb.embed(xs)
    assert batched.shape == (len(xs), 16)
    alone = espnet_alone(emb.model, xs)
    assert np.abs(l2(batched) - l2(alone)).max() <= 1e-4
    # and ESPnet's own inference class gives the same numbers
    if name == "ecapa":
        from espnet2.bin.spk_inference import Speech2Embedding

        s2e = Speech2Embedding(models[name] / "config.yaml", models[name] / "model.pth")
        ref = np.concatenate([s2e(x).numpy() for x in xs])
        assert np.abs(l2(batched) - l2(ref)).max() <= 1e-4


def test_weights_must_fit_the_config(models, tmp_path):
    from spkflow.core.errors import InputError
    from spkflow.embed.espnet import EspnetEmbedder

    d = tmp_path / "wrong"
    d.mkdir()
    cfg = dict(CONFIGS["ecapa"], encoder_conf=dict(model_scale=4, ndim=16, output_size=48))
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "model.pth").write_bytes((models["ecapa"] / "model.pth").read_bytes())
    with pytest.raises(InputError, match=r"model.pth: weights do not fit .*config.yaml"):
        EspnetEmbedder(d)
    (d / "model.pth").rename(d / "a.pth")
    (d / "b.pth").write_bytes(b"")
    with pytest.raises(InputError, match=r"several: a.pth b.pth\); give --model-file"):
        EspnetEmbedder(d)


def test_script_espnet_nj2_loads_in_espnet_dataset(models, tmp_path):
    from espnet2.train.dataset import ESPnetDataset

    from spkflow.data.audio import AudioReader
    from spkflow.embed.espnet import EspnetEmbedder

    data = make_mixed_data(tmp_path, num_spk=2, num_utt=3)  # 8 / 16 / 22.05 kHz -> 16 kHz
    out = tmp_path / "out"
    p = subprocess.run(
        [
            "bash",
            str(SCRIPT),
            "--toolkit",
            "espnet",
            "--nj",
            "2",
            "--batch-size",
            "3",
            "--num-workers",
            "0",
            "--model-dir",
            str(models["ecapa"]),
            str(data),
            str(out),
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    utts = (data / "utt2spk").read_text().split()[::2]
    spks = [ln.split()[0] for ln in (data / "spk2utt").read_text().splitlines()]
    ds = ESPnetDataset([(str(out / "xvector.scp"), "spembs", "kaldi_ark")])
    assert list(ds.loader_dict["spembs"].keys()) == utts
    model = EspnetEmbedder(models["ecapa"]).model
    reader = AudioReader(data, sample_rate=16000)
    ref = espnet_alone(model, [reader.read(u) for u in utts])
    for i, u in enumerate(utts):
        uid, item = ds[u]
        assert uid == u and item["spembs"].dtype == np.float32 and item["spembs"].shape == (16,)
        assert np.abs(l2(item["spembs"]) - l2(ref[i])).max() <= 1e-4
    spk_ds = ESPnetDataset([(str(out / "spk_xvector.scp"), "spembs", "kaldi_ark")])
    assert list(spk_ds.loader_dict["spembs"].keys()) == spks
    for spk in spks:
        members = [i for i, u in enumerate(utts) if u.startswith(spk + "-")]
        got = spk_ds[spk][1]["spembs"]
        want = np.mean([ds[utts[i]][1]["spembs"] for i in members], axis=0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
